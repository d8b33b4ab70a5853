"""TieringHistory (fake clock) and its wiring into `rlm run` (a real daemon subprocess)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from rlm.cli.generate import generate_log_dir
from rlm.testing.configs import write_config
from rlm.testing.daemon import clean_env, free_port, run_daemon, stop
from rlm.tiering.local.history import TieringHistory
from rlm.tiering.local.metrics import TieringMetrics
from tests.tiering.helpers import REPO


def test_samples_rates_and_ring_bound() -> None:
    now = [1000.0]
    metrics = TieringMetrics()
    hist = TieringHistory(metrics, interval_s=10, window_s=30, clock=lambda: now[0])
    first = hist.sample()
    assert first["copied_bytes"] == 0 and first["copy_bytes_per_sec"] is None
    metrics.copy_bytes.labels(topic="a", partition="0").inc(3000)
    metrics.copy_bytes.labels(topic="b", partition="1").inc(2000)
    metrics.copy_lag_bytes.labels(topic="a", partition="0").set(700)
    metrics.copy_lag_segments.labels(topic="a", partition="0").set(2)
    metrics.remote_log_size.labels(topic="b", partition="1").set(2000)
    metrics.copy_errors.labels(topic="a", partition="0").inc()
    now[0] += 10
    second = hist.sample()
    assert second == {
        "t": 1_010_000,
        "copied_bytes": 5000,
        "copy_bytes_per_sec": 500.0,
        "copied_segments": 0,
        "copy_errors": 1,
        "lag_bytes": 700,
        "lag_segments": 2,
        "remote_bytes": 2000,
    }
    for _ in range(5):
        now[0] += 10
        hist.sample()
    snap = hist.snapshot()
    assert snap["interval_s"] == 10 and snap["window_s"] == 30
    assert [s["t"] for s in snap["samples"]] == [1_030_000, 1_040_000, 1_050_000, 1_060_000]
    assert snap["samples"][-1]["copy_bytes_per_sec"] == 0.0


def test_rejects_bad_intervals() -> None:
    with pytest.raises(ValueError):
        TieringHistory(TieringMetrics(), interval_s=0)
    with pytest.raises(ValueError):
        TieringHistory(TieringMetrics(), interval_s=10, window_s=5)


def _get(url: str, token: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@pytest.mark.integration
def test_rlm_run_serves_the_page_and_history(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    generate_log_dir(logs, [("hist.t", 2)], seed=5, records=300, segment_bytes=8 * 1024)
    port = free_port()
    cfg = write_config(
        tmp_path / "c.toml", [logs], root=tmp_path / "store", server_port=port, task_interval_ms=200
    )
    log = tmp_path / "daemon.stderr"
    with run_daemon(cfg, port, log, env=clean_env({"RLM_SERVER__TOKEN": "tok"}), cwd=REPO) as daemon:
        base = daemon.url
        deadline = time.monotonic() + 60
        while True:
            daemon.alive()
            code, body = _get(base + "/v1/partitions", "tok")
            rows = json.loads(body) if code == 200 else []
            if rows and all(r["remote_segments"] and r["copy_lag_segments"] == 0 for r in rows):
                break
            assert time.monotonic() < deadline, "daemon did not tier within 60 s"
            time.sleep(0.2)
        for row in rows:
            assert row["eligible_end_offset"] == row["highest_tiered_offset"] + 1
            assert row["copy_lag_age_ms"] == 0 and row["local_segments"] > 0
        code, page = _get(base + "/")
        assert code == 200 and b"static/status.js" in page
        assert _get(base + "/v1/history")[0] == 401
        code, body = _get(base + "/v1/history", "tok")
        hist = json.loads(body)
        assert code == 200 and hist["interval_s"] == 10 and len(hist["samples"]) >= 1
        stop(daemon.proc)  # SIGTERM: a clean shutdown
    err = log.read_text()
    assert daemon.proc.returncode == 0 and "Traceback" not in err, err
    assert "record scan: native (CRC-32C: " in err, err  # which walk serves it (docs/scan.md)
    assert "record decoder: native (C extension" in err, err  # and which decoder (docs/decoder.md)


def test_totals_are_walked_again_only_after_a_partition_series_was_updated(tmp_path: Path) -> None:
    """At 10 000 partitions a walk of every series costs ~0.4 s of CPU every 10 s while nothing
    changes: the totals are walked again only after a partition's series was handed out to be
    updated (``PartitionContext.series`` moves ``totals_version``), and twice after each move."""
    from rlm.config import load_settings
    from rlm.storage.local import LocalBackend
    from rlm.tiering.manager import RemoteLogManager

    log_dir = tmp_path / "logs"
    generate_log_dir(log_dir, [("h", 1)], seed=2, records=50, segment_bytes=4096)
    cfg = write_config(tmp_path / "rlm.toml", [log_dir], root=tmp_path / "store")
    metrics = TieringMetrics()
    mgr = RemoteLogManager(load_settings(cfg), LocalBackend(root=str(tmp_path / "store")), metrics=metrics)
    (ctx,) = mgr.contexts()
    hist = TieringHistory(metrics, clock=time.time)
    hist.sample(), hist.sample()  # two walks that agree: the totals now stand

    metrics.copy_bytes.labels(topic="h", partition="0").inc(10)  # not through a series: no walk
    assert hist.sample()["copied_bytes"] == 0
    ctx.series(metrics.copy_bytes).inc(5)
    assert hist.sample()["copied_bytes"] == 15

    lag = ctx.series(metrics.copy_lag_bytes)  # handed out: the version moves before the update
    assert hist.sample()["lag_bytes"] == 0
    lag.set(99)  # lands after that walk: the walk after it still sees it
    assert hist.sample()["lag_bytes"] == 99
    assert hist.sample()["lag_bytes"] == 99
