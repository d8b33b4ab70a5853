"""docker-compose.yml is a valid Compose file; configs/*.toml use the original
configuration keys (docs/configuration.md) and build backends."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from rlm.storage import RetryingBackend, backend_from_config

REPO = Path(__file__).resolve().parents[2]
DESIGN_KEYS = {
    "log": {"dirs", "eligibility"},
    "remote": {"backend", "options"},
    "tiering": {
        "task_interval_ms",
        "index_entry_bytes",
        "index_rotate_bytes",
        "index_rotate_ms",
        "retention_ms",
        "retention_bytes",
    },
    "server": {"host", "port", "token"},
}


def test_compose_file_validates_against_the_compose_spec() -> None:
    exe = shutil.which("check-jsonschema", path=os.path.dirname(sys.executable)) or shutil.which(
        "check-jsonschema"
    )
    assert exe, "check-jsonschema (a dev dependency) is not installed: run `make install`"
    proc = subprocess.run(
        [exe, "--builtin-schema", "vendor.compose-spec", str(REPO / "docker-compose.yml")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_compose_has_the_stack() -> None:
    from ruamel.yaml import YAML  # check-jsonschema's own YAML parser (a dev dependency)

    doc = YAML(typ="safe").load((REPO / "docker-compose.yml").read_text())
    services = doc["services"]
    images = {name: svc.get("image", "") for name, svc in services.items()}
    for image in ("minio/minio", "minio/mc", "apache/hadoop", "apache/kafka"):
        assert any(i.startswith(image) for i in images.values()), image
    assert "mc mb --ignore-existing local/rlm" in " ".join(services["minio-init"]["command"])
    assert "rlm run --config /etc/rlm/minio.toml" in " ".join(services["rlm"]["command"])
    # rlm shares the broker's volume at the same path, read-write (it appends its remote index
    # family to partition dirs) and with its state on the same file system (hard-link pins).
    kafka_mounts = {v.split(":")[0]: v for v in services["kafka"]["volumes"]}
    rlm_mounts = {v.split(":")[0]: v for v in services["rlm"]["volumes"]}
    assert kafka_mounts["kafka-data"] == rlm_mounts["kafka-data"] == "kafka-data:/var/lib/kafka"
    log_dir = services["kafka"]["environment"]["KAFKA_LOG_DIRS"]
    minio = tomllib.loads((REPO / "configs" / "minio.toml").read_text())
    assert minio["log"]["dirs"] == [log_dir] and log_dir.startswith("/var/lib/kafka/")
    ports = [p for svc in services.values() for p in svc.get("ports", [])]
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
        assert isinstance(backend, RetryingBackend)  # every configured store is retried, once
        assert backend.inner.name == raw["remote"]["backend"]
    if name == "local":
        assert raw["log"]["dirs"] == ["demo/kafka-logs"]
        assert (tmp_path / "demo" / "tiered").is_dir()
