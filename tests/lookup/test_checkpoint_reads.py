"""The read path takes a log dir's checkpoints from the cache (rlm/logdir/checkpoint_cache.py,
docs/read-path.md): a lookup sees the broker's rewrite of the high watermark at once, and a pass
over P partitions of one log dir parses the checkpoint files once, not P times. Real partitions
(LogWriter), real readers over the local store."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from rlm.formats.checkpoint import format_offset_checkpoint
from rlm.fsutil import SETTLE_NS
from rlm.logdir import checkpoint_cache
from rlm.logdir.discovery import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    offset_checkpoint_entries,
)
from rlm.storage.local import LocalBackend
from rlm.tiering.read.readers import TieredReaders
from tests.lookup.helpers import settings_for, write_generated


def _rewrite_hw(log_dir: Path, hws: dict[tuple[str, int], int], mtime_ns: int) -> None:
    """As a broker does: a new file renamed over the old one (a new inode), here with an old mtime
    so that the cache may keep it (it only keeps parses of settled files)."""
    tmp = log_dir / (REPLICATION_OFFSET_CHECKPOINT + ".tmp")
    tmp.write_text(format_offset_checkpoint(hws))
    os.utime(tmp, ns=(mtime_ns, mtime_ns))
    os.replace(tmp, log_dir / REPLICATION_OFFSET_CHECKPOINT)


def _readers(tmp_path: Path, partitions: int) -> tuple[Path, TieredReaders]:
    logs = tmp_path / "logs"
    for p in range(partitions):
        write_generated(logs, "t", p, batches=40, seed=p)
    old = time.time_ns() - 10 * SETTLE_NS
    for name in (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT):
        if (logs / name).exists():  # settled, as a broker's are between its flushes
            os.utime(logs / name, ns=(old, old))
    settings = settings_for([logs], options={"root": str(tmp_path / "store")}, eligibility="high-watermark")
    return logs, TieredReaders(settings, LocalBackend(root=str(tmp_path / "store")))


def _settled_readers_counting_parses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, partitions: int, *, hw: int
) -> tuple[Path, TieredReaders, list[Path], int]:
    """Readers over `partitions` partitions of topic t whose settled checkpoint puts every high
    watermark at `hw`; returns (log dir, readers, the checkpoint files parsed since, the settled
    mtime in ns)."""
    logs, readers = _readers(tmp_path, partitions)
    settled = time.time_ns() - 10 * SETTLE_NS
    _rewrite_hw(logs, {("t", p): hw for p in range(partitions)}, settled)
    parsed: list[Path] = []

    def counting(data: bytes, path: Path) -> dict[tuple[str, int], int]:
        parsed.append(path)
        return offset_checkpoint_entries(data, path)

    monkeypatch.setattr(checkpoint_cache, "offset_checkpoint_entries", counting)
    return logs, readers, parsed, settled


def _once_each(parsed: list[Path], logs: Path) -> bool:
    """Every checkpoint file of ``logs`` parsed exactly once (the high watermark's at least)."""
    return logs / REPLICATION_OFFSET_CHECKPOINT in parsed and len(set(parsed)) == len(parsed)


def test_a_lookup_sees_a_high_watermark_rewritten_by_rename(tmp_path: Path) -> None:
    logs, readers = _readers(tmp_path, 1)
    settled = time.time_ns() - 10 * SETTLE_NS
    _rewrite_hw(logs, {("t", 0): 100}, settled)
    reader = readers.reader("t", 0)
    assert reader.lookup_offset(99).found
    assert not reader.lookup_offset(150).found  # above the high watermark
    cached = readers.resources.checkpoints.get(logs)
    assert readers.resources.checkpoints.get(logs) is cached  # settled: kept, not parsed again
    # Same size, same mtime: only the inode (a rename) tells the versions apart.
    _rewrite_hw(logs, {("t", 0): 200}, settled)
    found = readers.reader("t", 0).lookup_offset(150)
    assert found.found and found.offset == 150
    assert found.ranges.visible_end_offset == 200


def test_offsets_for_times_over_many_partitions_parses_the_checkpoints_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs, readers, parsed, _ = _settled_readers_counting_parses(tmp_path, monkeypatch, 6, hw=120)
    rows = readers.offsets_for_times(-1)  # latest: the visible end of every partition
    assert sorted((r.partition, r.offset) for r in rows) == [(p, 120) for p in range(6)]
    assert _once_each(parsed, logs)
    before = list(parsed)
    readers.offsets_for_times(-2)
    assert parsed == before  # nothing changed: no parse at all


def test_a_plan_over_many_partitions_without_a_cache_parses_the_checkpoints_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlm.tiering.local.state import Progress
    from rlm.tiering.read.visibility import partition_offsets

    logs, readers, parsed, settled = _settled_readers_counting_parses(tmp_path, monkeypatch, 5, hw=90)
    parts = readers.partitions()
    # As the jobs' planners and restore ask: one partition at a time, no cache of their own.
    assert [partition_offsets(p, Progress()).visible_end_offset for p in parts] == [90] * 5
    assert _once_each(parsed, logs)
    _rewrite_hw(logs, {("t", p): 95 for p in range(5)}, settled)  # a rename: seen at once
    assert partition_offsets(parts[0], Progress()).visible_end_offset == 95
