"""docker-compose.yml is a valid Compose file; configs/*.toml use the DESIGN §3 keys and build backends."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from rlm.storage import backend_from_config

REPO = Path(__file__).resolve().parents[2]
DESIGN_KEYS = {
    "log": {"dirs", "eligibility"},
    "remote": {"backend", "options"},
    "tiering": {"task_interval_ms", "index_entry_bytes", "index_rotate_bytes", "index_rotate_ms",
                "retention_ms", "retention_bytes"},
    "server": {"host", "port", "token"},
}


def test_compose_file_validates_against_the_compose_spec() -> None:
    exe = shutil.which("check-jsonschema", path=os.path.dirname(sys.executable)) or shutil.which(
        "check-jsonschema")
    assert exe, "check-jsonschema (a dev dependency) is not installed: run `make install`"
    proc = subprocess.run([exe, "--builtin-schema", "vendor.compose-spec", str(REPO / "docker-compose.yml")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_compose_has_the_stack() -> None:
    # No YAML dependency needed: check-jsonschema validated the structure; plain text suffices here.
    text = (REPO / "docker-compose.yml").read_text()
    for needle in ("image: minio/minio", "image: minio/mc", "image: apache/hadoop", "image: apache/kafka",
                   "kafka-data:/var/lib/kafka/data:ro", '["hdfs", "namenode"]', '["hdfs", "datanode"]',
                   "mc mb --ignore-existing local/rlm", "rlm run --config /etc/rlm/minio.toml"):
        assert needle in text, needle
    ports = re.findall(r'^\s+- "([^"]*:\d+:\d+)"$', text, re.MULTILINE)
    assert ports and all(p.startswith("127.0.0.1:") for p in ports), ports


@pytest.mark.parametrize("name", ["local", "minio", "s3", "hdfs"])
def test_configs_use_design_keys(name: str) -> None:
    raw = tomllib.loads((REPO / "configs" / f"{name}.toml").read_text())
    assert set(raw) == set(DESIGN_KEYS)
    for section, keys in DESIGN_KEYS.items():
        assert set(raw[section]) == keys, section


@pytest.mark.parametrize("name", ["local", "minio", "s3", "hdfs"])
def test_configs_build_their_backend(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # configs/local.toml's relative root resolves against the cwd
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    raw = tomllib.loads((REPO / "configs" / f"{name}.toml").read_text())
    with backend_from_config(raw["remote"]) as backend:
        assert backend.name == raw["remote"]["backend"]
    if name == "local":
        assert raw["log"]["dirs"] == ["demo/kafka-logs"]
        assert (tmp_path / "demo" / "tiered").is_dir()
