"""A restart trusts whole local state (no store request) and an idle pass makes none
(docs/remote-state.md "What a restart reads", docs/operations.md "What an idle pass costs").

Real files (the demo log dir, the local store), real managers, requests counted by
:class:`rlm.testing.counting.CountingBackend` around the real backend.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rlm.cli.generate import generate_log_dir
from rlm.config import load_settings
from rlm.formats import naming
from rlm.storage.local import LocalBackend
from rlm.testing.configs import write_config
from rlm.testing.counting import CountingBackend
from rlm.testing.store_check import check_store
from rlm.tiering.local.manifest_snapshot import MANIFEST_SNAPSHOT_FILE
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.local.state import PROGRESS_FILE
from rlm.tiering.manager import RemoteLogManager
from tests.tiering.helpers import roll_after_last

TOPIC = "rs"
PARTITIONS = 3


class Env:
    def __init__(self, tmp_path: Path, **tiering: object) -> None:
        self.logs = tmp_path / "logs"
        generate_log_dir(self.logs, [(TOPIC, PARTITIONS)], seed=5, records=400, segment_bytes=8 * 1024)
        self.store = tmp_path / "store"
        self.cfg = write_config(
            tmp_path / "c.toml", [self.logs], root=self.store, index_entry_bytes=2048, **tiering
        )
        self.clock = [int(time.time() * 1000)]
        self.backend = CountingBackend(LocalBackend(root=str(self.store)))

    def manager(self) -> RemoteLogManager:
        self.backend.calls.clear()
        self.backend.ranges.clear()
        return RemoteLogManager(
            load_settings(self.cfg), self.backend, metrics=TieringMetrics(), clock_ms=lambda: self.clock[0]
        )

    def state_dir(self, partition: int) -> Path:
        return self.logs.parent / "logs.rlm-state" / f"{TOPIC}-{partition}"

    def settle(self) -> None:
        time.sleep(0.25)  # > fsutil.SETTLE_NS: signatures read after this are trusted


def _rows(manager: RemoteLogManager) -> list[dict[str, object]]:
    keys = ("highest_tiered_offset", "remote_log_start_offset", "remote_segments", "remote_bytes")
    return [{k: r[k] for k in keys} for r in manager.status(observe=False)]


def _metric(manager: RemoteLogManager, name: str, labels: dict[str, str] | None = None) -> float:
    return manager.shared.metrics.registry.get_sample_value(name, labels or {}) or 0.0


def test_restart_reads_nothing_from_the_store_and_serves_the_same(tmp_path: Path) -> None:
    env = Env(tmp_path)
    first = env.manager()
    assert all(r.error is None for r in first.run_once(gc=False))
    assert sum(len(r.copied) for r in first.run_once(gc=False)) == 0
    before = _rows(first)
    assert all(row["remote_segments"] for row in before)

    again = env.manager()
    results = again.run_once(gc=False)
    assert [r.error for r in results] == [None] * PARTITIONS
    assert env.backend.total == 0, env.backend.calls
    assert _metric(again, "rlm_partition_recoveries_total", {"source": "local"}) == PARTITIONS
    assert _rows(again) == before  # manifests parsed from the snapshot on first use
    assert env.backend.total == 0
    check_store([env.logs], env.backend.inner)


def test_idle_passes_make_no_request_and_a_roll_is_still_tiered(tmp_path: Path) -> None:
    env = Env(tmp_path)
    manager = env.manager()
    manager.run_once(gc=False)
    env.settle()
    manager.run_once(gc=False)  # nothing to do, settled signatures: marked idle
    env.backend.calls.clear()
    assert all(r.idle for r in manager.run_once(gc=False))
    assert env.backend.total == 0
    # A restart starts idle too (the persisted mark), still without a request.
    restarted = env.manager()
    assert all(r.idle for r in restarted.run_once(gc=False))
    assert env.backend.total == 0
    # The broker rolls partition 0 and commits it: the directory and the checkpoint changed.
    part = env.logs / f"{TOPIC}-0"
    base = roll_after_last(part)
    ckpt = env.logs / "replication-offset-checkpoint"
    lines = ckpt.read_text().splitlines()
    lines = [f"{TOPIC} 0 {base}" if line.startswith(f"{TOPIC} 0 ") else line for line in lines]
    ckpt.write_text("\n".join(lines) + "\n")
    results = {r.partition: r for r in restarted.run_once(gc=False)}
    assert results[0].copied and not results[0].idle
    assert results[1].idle and results[2].idle
    check_store([env.logs], env.backend.inner)


def test_retention_by_time_fires_when_due_without_any_file_change(tmp_path: Path) -> None:
    env = Env(tmp_path, retention_ms=3_600_000)
    env.clock[0] = 1_700_000_000_000  # before the generated data: nothing expired
    manager = env.manager()
    manager.run_once(gc=False)
    env.settle()
    manager.run_once(gc=False)
    assert all(r.idle for r in manager.run_once(gc=False))
    oldest = min(
        json.loads(env.backend.inner.read(k.key))["max_timestamp"]
        for k in env.backend.inner.list(f"{TOPIC}-0/manifests/")
    )
    env.clock[0] = oldest + 3_600_000 + 1  # only time passed
    results = {r.partition: r for r in manager.run_once(gc=False)}
    assert results[0].deleted and not results[0].idle
    check_store([env.logs], env.backend.inner)


def _drop_snapshot(state: Path, _part: Path) -> None:
    (state / MANIFEST_SNAPSHOT_FILE).unlink()


def _flip_snapshot_byte(state: Path, _part: Path) -> None:
    path = state / MANIFEST_SNAPSHOT_FILE
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01
    path.write_bytes(bytes(data))


def _open_journal_attempt(state: Path, _part: Path) -> None:
    with (state / "journal.jsonl").open("a") as fh:
        fh.write(
            json.dumps({"type": "COPY_STARTED", "base": 10**9, "attempt": "0000000000000-dead", "at": 1})
            + "\n"
        )


def _stale_progress(state: Path, _part: Path) -> None:
    path = state / PROGRESS_FILE
    doc = json.loads(path.read_text())
    doc["highest_tiered_offset"] -= 1
    path.write_text(json.dumps(doc))


def _torn_index_tail(_state: Path, part: Path) -> None:
    newest = sorted(part.glob(f"*{naming.REMOTE_LOG_INDEX}"))[-1]
    with newest.open("ab") as fh:
        fh.write(b"\x00\x01torn")


def _lost_dir_token(_state: Path, part: Path) -> None:
    (part / ".rlm-incarnation").unlink()


@pytest.mark.parametrize(
    "damage",
    [
        _drop_snapshot,
        _flip_snapshot_byte,
        _open_journal_attempt,
        _stale_progress,
        _torn_index_tail,
        _lost_dir_token,
    ],
)
def test_local_state_that_does_not_agree_is_recovered_from_the_store(
    tmp_path: Path, damage: Callable[[Path, Path], None]
) -> None:
    env = Env(tmp_path)
    first = env.manager()
    first.run_once(gc=False)
    before = _rows(first)
    damage(env.state_dir(0), env.logs / f"{TOPIC}-0")
    again = env.manager()
    assert [r.error for r in again.run_once(gc=False)] == [None] * PARTITIONS
    assert _metric(again, "rlm_partition_recoveries_total", {"source": "store"}) == 1
    assert _metric(again, "rlm_partition_recoveries_total", {"source": "local"}) == PARTITIONS - 1
    assert env.backend.calls["list"] >= 1  # only partition 0 asked the store
    assert _rows(again) == before
    check_store([env.logs], env.backend.inner)
    # Recovery rewrote what agrees: the next restart trusts it again.
    third = env.manager()
    third.run_once(gc=False)
    assert _metric(third, "rlm_partition_recoveries_total", {"source": "local"}) == PARTITIONS
    assert env.backend.total == 0


def test_trust_local_state_false_recovers_every_partition_from_the_store(tmp_path: Path) -> None:
    env = Env(tmp_path, trust_local_state=False)
    env.manager().run_once(gc=False)
    # One manifest rewritten behind rlm's back (the same bytes, a new file): its stamp (size, mtime)
    # is not the one the copy's create was answered, kept in the snapshot with every other one.
    inner = env.backend.inner
    manifests = sorted(i.key for i in inner.list(f"{TOPIC}-") if "/manifests/0" in i.key)
    assert len(manifests) > PARTITIONS
    inner.put(manifests[0], inner.read(manifests[0]))
    again = env.manager()
    again.run_once(gc=False)
    assert _metric(again, "rlm_partition_recoveries_total", {"source": "store"}) == PARTITIONS
    assert env.backend.calls["list"] >= PARTITIONS  # every partition lists the store
    assert {key for key, _s, _e in env.backend.ranges if "/manifests/" in key} == {manifests[0]}
    # That recovery's listing gave the rewritten manifest its stamp (kept in the snapshot): the next
    # full recovery lists once per partition and reads no manifest — only the lineage probe's range.
    third = env.manager()
    assert [r.error for r in third.run_once(gc=False)] == [None] * PARTITIONS
    assert env.backend.calls["list"] == PARTITIONS and env.backend.calls["read"] == PARTITIONS
    assert all(key[1:] != (0, None) for key in env.backend.ranges)  # ranged probes, no whole object
    check_store([env.logs], env.backend.inner)


def test_gc_reads_a_manifest_only_once_per_process(tmp_path: Path) -> None:
    env = Env(tmp_path)
    manager = env.manager()
    manager.run_once(gc=False)
    env.backend.calls.clear()
    assert manager.collect_garbage() == []
    # committed here: the stamps the creates were answered (a local store's, as its listing shows)
    assert env.backend.calls == {"list": 2 * PARTITIONS}  # data, then manifests; no read
    env.backend.calls.clear()
    assert manager.collect_garbage() == []
    assert env.backend.calls == {"list": 2 * PARTITIONS}


def test_a_trusted_restart_clears_stale_pins_and_keeps_the_staging_dir(tmp_path: Path) -> None:
    """Pins left in the staging dir (no attempt can be in flight at a restart) are removed; the
    directory itself stays, as every copy leaves it (removing it costs a metadata write)."""
    env = Env(tmp_path)
    assert all(r.error is None for r in env.manager().run_once(gc=False))
    staging = env.state_dir(0) / "staging"
    assert staging.is_dir() and not any(staging.iterdir())
    stale = staging / "00000000000000000000-0123456789a-abcdef01"
    stale.mkdir()
    (stale / "00000000000000000000.log").write_bytes(b"pinned")
    (staging / "stray").write_bytes(b"x")
    again = env.manager()
    assert [r.error for r in again.run_once(gc=False)] == [None] * PARTITIONS
    assert _metric(again, "rlm_partition_recoveries_total", {"source": "local"}) == PARTITIONS
    assert staging.is_dir() and not any(staging.iterdir())
