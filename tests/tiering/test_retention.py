"""Remote retention by time and size (docs/formats.md §6.6): the pure plan, and end to
end with a fake clock."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from rlm.cli.generate import generate_log_dir
from rlm.config import load_settings
from rlm.storage.local import LocalBackend
from rlm.testing.configs import write_config
from rlm.testing.daemon import rlm_cli
from rlm.testing.store_check import check_store
from rlm.tiering.expire.retention import plan_retention
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.store.manifest import SegmentManifest, StoredObject

TOPIC = "ret"


def _m(base: int, size: int, max_ts: int) -> SegmentManifest:
    return SegmentManifest(
        TOPIC,
        0,
        base,
        base + 9,
        max_ts - 5,
        max_ts,
        size,
        1,
        1,
        f"a{base}",
        0,
        {"log": StoredObject(f"k{base}", size, 0)},
    )


SEGS = [_m(0, 100, 1_000), _m(10, 100, 2_000), _m(20, 100, 3_000), _m(30, 100, 4_000)]


def _plan(manifests: list[SegmentManifest], **kw: int) -> list[int]:
    return [m.base_offset for m in plan_retention(manifests, **kw).expired]


def test_plan_disabled_limits_delete_nothing() -> None:
    assert _plan(SEGS, now_ms=10**12, retention_ms=-1, retention_bytes=-1) == []


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (2_000, []),  # max ts 1000 is not < 2000 - 1000
        (2_001, [0]),
        (4_500, [0, 10, 20]),
        (10**9, [0, 10, 20, 30]),  # time retention may delete everything
    ],
)
def test_plan_by_time(now: int, expected: list[int]) -> None:
    plan = plan_retention(SEGS, now_ms=now, retention_ms=1_000, retention_bytes=-1)
    assert [m.base_offset for m in plan.expired] == expected
    assert set(plan.reason.values()) <= {"time"}
    assert plan.bytes == 100 * len(expected)


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        (400, []),
        (399, []),
        (300, [0]),
        (250, [0]),
        (200, [0, 10]),
        (0, [0, 10, 20, 30]),
    ],
)
def test_plan_by_size_never_goes_below_the_limit(limit: int, expected: list[int]) -> None:
    """Kafka's rule: delete the oldest while what remains is still >= retention.bytes."""
    plan = plan_retention(SEGS, now_ms=0, retention_ms=-1, retention_bytes=limit)
    assert [m.base_offset for m in plan.expired] == expected
    assert 400 - plan.bytes >= limit
    assert set(plan.reason.values()) <= {"size"}


def test_plan_deletes_only_a_prefix() -> None:
    # The oldest segment has a late timestamp (out-of-order data): it blocks the younger ones.
    segs = [_m(0, 100, 9_000), _m(10, 100, 1_000), _m(20, 100, 1_000)]
    assert _plan(segs, now_ms=10_000, retention_ms=5_000, retention_bytes=-1) == []
    # Unsorted input is still planned oldest first.
    assert _plan(list(reversed(SEGS)), now_ms=2_500, retention_ms=1_000, retention_bytes=-1) == [0]


def test_plan_time_and_size_combine() -> None:
    plan = plan_retention(SEGS, now_ms=2_500, retention_ms=1_000, retention_bytes=150)
    assert [m.base_offset for m in plan.expired] == [0, 10]
    assert plan.reason == {0: "time", 10: "size"}


def _setup(tmp_path: Path, **tiering: int) -> tuple[Path, Path, LocalBackend]:
    logs = tmp_path / "logs"
    generate_log_dir(logs, [(TOPIC, 1)], seed=8, records=500, segment_bytes=8 * 1024)
    cfg = write_config(
        tmp_path / "c.toml",
        [logs],
        root=tmp_path / "store",
        index_entry_bytes=2048,
        index_rotate_bytes=2500,
        **tiering,
    )
    return logs, cfg, LocalBackend(root=str(tmp_path / "store"))


def test_retention_by_time_end_to_end(tmp_path: Path) -> None:
    logs, cfg, backend = _setup(tmp_path, retention_ms=3_600_000)
    clock = [0]

    def manager() -> RemoteLogManager:
        return RemoteLogManager(
            load_settings(cfg), backend, metrics=TieringMetrics(), clock_ms=lambda: clock[0]
        )

    clock[0] = 1_700_000_000_000  # before the generated data (2025): nothing is expired
    result = manager().run_once()[0]
    assert result.error is None and result.copied and result.deleted == []
    copied = check_store([logs], backend).partitions[f"{TOPIC}-0"]
    sets_before = copied.set_bases
    assert len(sets_before) >= 3
    # Move the clock so that the first seven segments (more than one index set) are > 1 h old.
    clock[0] = copied.manifests[6]["max_timestamp"] + 3_600_000 + 1
    expired = [m for m in copied.manifests if m["max_timestamp"] < clock[0] - 3_600_000]
    mgr = manager()
    result = mgr.run_once()[0]
    assert result.error is None
    assert result.deleted == [m["base_offset"] for m in expired]
    check = check_store([logs], backend)
    pc = check.partitions[f"{TOPIC}-0"]
    assert pc.manifests == copied.manifests[len(expired) :]
    for m in expired:  # manifest and data gone
        assert not list(backend.list(f"{TOPIC}-0/data/{m['base_offset']:020d}-"))
    start = pc.manifests[0]["base_offset"]
    status = mgr.status()[0]
    assert status["remote_log_start_offset"] == start
    assert status["log_start_offset"] == 0  # the local log still starts at 0
    # Sets entirely below the new start are gone, the others untouched (checked by check_store).
    assert pc.set_bases == [b for b in sets_before if b >= max(s for s in sets_before if s <= start)]
    assert len(pc.set_bases) < len(sets_before)
    assert mgr.shared.metrics.registry.get_sample_value(
        "rlm_remote_delete_requests_total", {"topic": TOPIC, "partition": "0"}
    ) == len(expired)
    # Idempotent: repeating the pass deletes nothing more.
    assert manager().run_once()[0].deleted == []
    assert check_store([logs], backend).partitions[f"{TOPIC}-0"].manifests == pc.manifests


def test_retention_by_size_end_to_end(tmp_path: Path) -> None:
    logs, cfg, backend = _setup(tmp_path, retention_bytes=30_000)
    mgr = RemoteLogManager(load_settings(cfg), backend, metrics=TieringMetrics())
    assert mgr.run_once()[0].error is None
    pc = check_store([logs], backend).partitions[f"{TOPIC}-0"]
    sizes = [m["size_bytes"] for m in pc.manifests]
    assert pc.manifests[0]["base_offset"] > 0
    assert sum(sizes) >= 30_000 > sum(sizes[1:])
    assert mgr.status()[0]["remote_bytes"] == sum(sizes)


def test_crash_during_the_last_delete_still_removes_every_local_set(tmp_path: Path) -> None:
    logs, cfg, backend = _setup(tmp_path)
    assert rlm_cli("run", "--config", cfg, "--once").returncode == 0
    n = len(check_store([logs], backend).partitions[f"{TOPIC}-0"].manifests)
    highest = json.loads(rlm_cli("status", "--config", cfg).stdout)[0]["highest_tiered_offset"]
    env = {"RLM_TIERING__RETENTION_MS": "0", "RLM_CRASH_AT": f"after_delete_manifest:{n}"}
    proc = rlm_cli("run", "--config", cfg, "--once", env=env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    env.pop("RLM_CRASH_AT")
    proc = rlm_cli("run", "--config", cfg, "--once", env=env)
    assert proc.returncode == 0, proc.stderr
    assert not list(backend.list(""))  # manifests and data all gone
    assert not list((logs / f"{TOPIC}-0").glob("*.remote*"))
    row = json.loads(rlm_cli("status", "--config", cfg, env=env).stdout)[0]
    assert row["highest_tiered_offset"] == highest  # nothing is copied twice after that
    assert json.loads(rlm_cli("run", "--config", cfg, "--once", env=env).stdout)["segments_copied"] == 0
