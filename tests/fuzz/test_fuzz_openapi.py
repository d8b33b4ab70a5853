"""Schemathesis against the OpenAPI document of a real ``rlm run`` (a subprocess over a tiered log
dir, with a token so every guarded route is reached): every operation of ``/openapi.json`` with
generated and mutated parameters and bodies. The properties (docs/fuzzing.md): no 5xx ever — a bad
input is a 4xx with the error's class (docs/http-api.md §5) — and every answer whose status the
document describes conforms to its schema and content type.

Bounded here (``RLM_FUZZ_HTTP_EXAMPLES``, default 15 examples per operation: a few tens of seconds);
``make fuzz-http`` runs it with many more.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlm.testing.daemon import Daemon, clean_env, free_port, rlm_cli, run_daemon
from rlm.testing.toml import toml_value
from tests.lookup.helpers import write_generated

TOKEN = "fuzz-token"
EXAMPLES = int(os.environ.get("RLM_FUZZ_HTTP_EXAMPLES", "15"))
CHECKS = "not_a_server_error,response_schema_conformance,content_type_conformance"
#: Most path parameters name a partition that exists (else nearly every case is a 404 before the
#: offsets, bounds and formats are reached); the rest stay generated, the internal topics included.
SCHEMATHESIS_TOML = """
[dictionaries.topics]
values = ["orders", "__cluster_metadata", "__consumer_offsets"]
[dictionaries.partitions]
values = [0, 1]
[parameters]
"path.topic" = { dictionary = "topics", probability = 0.8 }
"path.partition" = { dictionary = "partitions", probability = 0.8 }
"""


def _schemathesis() -> str:
    found = shutil.which("schemathesis", path=os.path.dirname(sys.executable))
    assert found, "schemathesis (a dev dependency) is not installed: run `make install`"
    return found


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("openapi")
    logs = tmp / "logs"
    write_generated(logs, "orders", 0, batches=60, seed=11)
    write_generated(logs, "orders", 1, batches=30, seed=12)
    write_generated(logs, "__consumer_offsets", 0, batches=10, seed=13)  # never served (404)
    port = free_port()
    config = tmp / "rlm.toml"
    lines = [
        "[log]",
        f"dirs = {toml_value([str(logs)])}",
        'eligibility = "rolled"',
        "[remote]",
        'backend = "local"',
        "[remote.options]",
        f"root = {toml_value(str(tmp / 'store'))}",
        "[cluster]",
        'leadership = "always"',
        "[tiering]",
        "task_interval_ms = 600000",
        "[server]",
        f"port = {port}",
        f"token = {toml_value(TOKEN)}",
    ]
    config.write_text("\n".join(lines) + "\n")
    assert rlm_cli("run", "--config", config, "--once", "--quiet").returncode == 0  # some data tiered
    with run_daemon(config, port, tmp / "rlm.log") as running:
        yield running


def test_openapi_operations_never_answer_5xx_and_conform(daemon: Daemon, tmp_path: Path) -> None:
    config = tmp_path / "schemathesis.toml"
    config.write_text(SCHEMATHESIS_TOML)
    cmd = [
        _schemathesis(),
        "--config-file",
        str(config),
        "run",
        f"{daemon.url}/openapi.json",
        "--checks",
        CHECKS,
        "--max-examples",
        str(EXAMPLES),
        "--workers",
        "1",
        "--header",
        f"Authorization: Bearer {TOKEN}",
        "--generation-deterministic",
        "--suppress-health-check",
        "all",
    ]
    env = clean_env({"SCHEMATHESIS_HOOKS": "", "NO_COLOR": "1"})
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env, cwd=tmp_path)
    report = done.stdout[-6000:] + done.stderr[-2000:]
    assert done.returncode == 0, report
    assert "Traceback" not in daemon.log_text(), daemon.log_text()[-4000:]
