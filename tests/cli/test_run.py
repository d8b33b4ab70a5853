"""`rlm run` as a real subprocess: config errors, unknown backends, and the daemon (status, /metrics,
SIGTERM)."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import pytest

from rlm.cli.generate import generate_log_dir
from rlm.storage.local import LocalBackend
from rlm.testing.configs import write_config
from rlm.testing.daemon import Daemon, free_port, rlm_cli, run_daemon, stop
from rlm.testing.store_check import check_store
from tests.tiering.helpers import REPO


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.mark.parametrize(
    ("body", "needles"),
    [
        ("[tiering]\nretention_ms = -5\n", ["tiering.retention_ms", "-5"]),
        ('[tiering]\nindex_rotate_bytes = "big"\n', ["tiering.index_rotate_bytes", "big"]),
        ('[log]\neligibility = "committed"\n', ["log.eligibility", "committed", "high-watermark"]),
        ("[tiering]\nretention_msec = 1\n", ["tiering.retention_msec"]),
        ("[tiering\n", ["not valid TOML"]),
    ],
)
def test_bad_config_exits_2_with_one_line(tmp_path: Path, body: str, needles: list[str]) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(
        f'[log]\ndirs = ["{tmp_path}"]\n' + body
        if not body.startswith("[log]")
        else body.replace("[log]\n", f'[log]\ndirs = ["{tmp_path}"]\n')
    )
    proc = rlm_cli("run", "--config", cfg, "--once")
    assert proc.returncode == 2, proc.stderr
    line = _one_line(proc.stderr)
    for needle in needles:
        assert needle in line


def test_unknown_backend_exits_2_listing_installed_backends(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.toml", [tmp_path], backend="gcs-typo", options={})
    proc = rlm_cli("run", "--config", cfg, "--once")
    assert proc.returncode == 2, proc.stderr
    line = _one_line(proc.stderr)
    assert "gcs-typo" in line
    for name in ("local", "memory", "faulty"):
        assert name in line


def test_bad_backend_option_exits_2(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.toml", [tmp_path], options={"rooot": str(tmp_path)})
    proc = rlm_cli("run", "--config", cfg, "--once")
    assert proc.returncode == 2, proc.stderr
    assert "rooot" in _one_line(proc.stderr)


def _wait_until_every_partition_is_tiered(daemon: Daemon, cfg: Path) -> None:
    """Polls `rlm status` (another process, reading the state dir) until no partition lags, 60 s at most."""
    deadline = time.monotonic() + 60
    rows: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        daemon.alive()
        proc = rlm_cli("status", "--config", cfg)
        assert proc.returncode == 0, proc.stderr
        rows = json.loads(proc.stdout)
        if rows and all(r["copy_lag_segments"] == 0 and r["remote_segments"] for r in rows):
            return
        time.sleep(0.2)
    pytest.fail(f"not tiered within 60 s: {rows}")


def _scrape_metrics(port: int) -> str:
    """The daemon's /metrics text; the endpoint starts with the daemon, so it is polled (30 s at most)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                return resp.read().decode()
        except OSError:
            assert time.monotonic() < deadline, "no /metrics"
            time.sleep(0.2)


@pytest.mark.integration
def test_daemon_tiers_serves_metrics_and_stops_on_sigterm(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    generate_log_dir(logs, [("daemon.t", 2)], seed=4, records=400, segment_bytes=8 * 1024)
    store = tmp_path / "store"
    port = free_port()
    cfg = write_config(
        tmp_path / "c.toml",
        [logs],
        root=store,
        server_port=port,
        task_interval_ms=200,
        upload_bytes_per_sec=20_000_000,
    )
    log = tmp_path / "daemon.stderr"
    # wait=False: the status command below reads the state dir, the API is polled after it
    with run_daemon(cfg, port, log, cwd=REPO, wait=False) as daemon:
        _wait_until_every_partition_is_tiered(daemon, cfg)
        text = _scrape_metrics(port)
        for name in (
            "rlm_remote_copy_bytes_total",
            "rlm_remote_copy_requests_total",
            "rlm_remote_copy_lag_bytes",
            "rlm_remote_copy_lag_segments",
            "rlm_remote_log_size_bytes",
            "rlm_highest_tiered_offset",
            "rlm_remote_log_metadata_count",
        ):
            assert f'{name}{{partition="0",topic="daemon.t"}}' in text, name
        copied = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("rlm_remote_copy_bytes_total{")
        )
        check = check_store([logs], LocalBackend(root=str(store)))
        assert copied >= sum(m["size_bytes"] for pc in check.partitions.values() for m in pc.manifests)
        stop(daemon.proc)  # SIGTERM
    err = log.read_text()
    assert daemon.proc.returncode == 0, err
    assert "Traceback" not in err
    # The restart is over once every partition passed once: said once, with the count.
    said = re.findall(r"startup: every partition passed once \(2 partitions\) [0-9.]+ s after", err)
    assert len(said) == 1, err
    # Stopped cleanly: a --once pass afterwards finds nothing to do and nothing to repair.
    proc = rlm_cli("run", "--config", cfg, "--once")
    assert proc.returncode == 0 and json.loads(proc.stdout)["segments_copied"] == 0
    assert not check_store([logs], LocalBackend(root=str(store))).unreferenced
