"""What is assumed without a high-watermark checkpoint, what is (and is not) a DeleteRecords point,
and retention's "log-start" reason (docs/visibility.md). Generated partitions (LogWriter), the
real tiering engine and the local store."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlm.formats.checkpoint import format_offset_checkpoint
from rlm.logdir.discovery import REPLICATION_OFFSET_CHECKPOINT, list_segments
from rlm.storage.local import LocalBackend
from rlm.tiering.expire.retention import plan_retention
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read.readers import TieredReaders
from rlm.tiering.store import object_keys
from rlm.tiering.store.manifest import SegmentManifest, StoredObject
from tests.lookup.edges import write_log_start_checkpoint
from tests.lookup.helpers import BruteLog, delete_local_segments, settings_for, write_generated


def _setup(tmp_path: Path, eligibility: str) -> tuple[Path, RemoteLogManager, TieredReaders, BruteLog]:
    logs, store = tmp_path / "logs", tmp_path / "store"
    write_generated(logs, "t", 0, batches=120, seed=5, segment_bytes=8_000)
    settings = settings_for([logs], options={"root": str(store)}, eligibility=eligibility)
    manager = RemoteLogManager(settings, LocalBackend(root=str(store)))
    readers = TieredReaders(settings, LocalBackend(root=str(store)), progress=manager.live_progress)
    return logs, manager, readers, BruteLog.scan(logs / "t-0")


def _status(manager: RemoteLogManager) -> dict[str, object]:
    return manager.status()[0]


def test_without_a_checkpoint_rolled_eligibility_serves_the_rolled_segments(tmp_path: Path) -> None:
    logs, manager, readers, brute = _setup(tmp_path, "rolled")
    (logs / REPLICATION_OFFSET_CHECKPOINT).unlink()
    active = list_segments(logs / "t-0")[-1].base_offset
    assert 0 < active < brute.records[-1].offset
    reader = readers.reader("t", 0)
    assert reader.lookup_offset(active - 1).found
    assert not reader.lookup_offset(active).found  # the active segment is not declared committed
    assert reader.lookup_timestamp(-1).offset == active
    assert reader.fetch(active, 1 << 20).batches == []
    row = _status(manager)
    assert (row["high_watermark"], row["visible_end_offset"], row["high_watermark_source"]) == (
        None,
        active,
        "rolled-segments",
    )


def test_without_a_checkpoint_high_watermark_eligibility_serves_only_what_was_tiered(tmp_path: Path) -> None:
    logs, manager, readers, brute = _setup(tmp_path, "high-watermark")
    hw_file = logs / REPLICATION_OFFSET_CHECKPOINT
    saved = hw_file.read_text()
    hw_file.unlink()
    reader = readers.reader("t", 0)
    assert not reader.lookup_offset(0).found  # nothing is provably committed yet
    assert reader.lookup_timestamp(-1).offset == 0
    assert _status(manager)["high_watermark_source"] == "tiered"
    hw_file.write_text(saved)
    assert all(r.error is None and r.copied for r in manager.run_once())
    highest = manager.live_progress(manager.discover()[0]).highest_tiered_offset
    hw_file.unlink()  # the checkpoint vanishes: what was tiered under a known HW stays visible
    reader = readers.reader("t", 0)
    assert reader.lookup_offset(highest).found and not reader.lookup_offset(highest + 1).found
    assert reader.lookup_timestamp(-1).offset == highest + 1
    row = _status(manager)
    assert (row["visible_end_offset"], row["high_watermark_source"]) == (highest + 1, "tiered")
    assert brute.records[-1].offset > highest


def test_local_retention_is_not_a_deletion(tmp_path: Path) -> None:
    logs, manager, readers, _ = _setup(tmp_path, "high-watermark")
    assert all(r.error is None and r.copied for r in manager.run_once())
    before = sorted(i.key for i in manager.shared.backend.list(object_keys.manifests_prefix("t", 0)))
    delete_local_segments(logs / "t-0", keep_last=2)
    first = list_segments(logs / "t-0")[0].base_offset
    write_log_start_checkpoint(logs, {("t", 0): first})  # = the first local base: not DeleteRecords
    results = manager.run_once()
    assert results[0].error is None and results[0].deleted == []
    assert sorted(i.key for i in manager.shared.backend.list(object_keys.manifests_prefix("t", 0))) == before
    assert manager.live_progress(manager.discover()[0]).delete_records_offset == -1
    found = readers.reader("t", 0).lookup_offset(0)
    assert found.found and found.tier == "remote" and found.offset == 0
    assert readers.reader("t", 0).lookup_timestamp(-2).offset == 0


def test_segments_wholly_below_a_delete_records_point_are_never_copied(tmp_path: Path) -> None:
    logs, manager, readers, brute = _setup(tmp_path, "high-watermark")
    bases = [s.base_offset for s in list_segments(logs / "t-0")]
    point = bases[2] + 3  # inside segment 2; the broker has not deleted segments 0-1 yet
    write_log_start_checkpoint(logs, {("t", 0): point})
    result = manager.run_once()[0]
    assert result.error is None and result.copied[0] == bases[2]
    assert manager.live_progress(manager.discover()[0]).delete_records_offset == point
    reader = readers.reader("t", 0)
    assert not reader.lookup_offset(bases[1]).found and reader.lookup_offset(point).offset == point
    assert reader.lookup_timestamp(-2).offset == point
    assert reader.lookup_timestamp(0).offset == point  # the first VISIBLE record with ts >= 0
    assert brute.records[0].offset == 0


def _m(base: int, last: int) -> SegmentManifest:
    return SegmentManifest(
        "t", 0, base, last, 0, 10**13, 100, 1, 1, f"a{base}", 0, {"log": StoredObject(f"k{base}", 100, 0)}
    )


@pytest.mark.parametrize(
    ("log_start", "expected"),
    [
        (-1, []),
        (0, []),
        (9, []),
        (10, [0]),
        (25, [0, 10]),
        (30, [0, 10, 20]),
        (10**6, [0, 10, 20]),
    ],
)
def test_plan_deletes_segments_wholly_below_the_log_start(log_start: int, expected: list[int]) -> None:
    segs = [_m(0, 9), _m(10, 19), _m(20, 29)]
    plan = plan_retention(segs, now_ms=0, retention_ms=-1, retention_bytes=-1, log_start_offset=log_start)
    assert [m.base_offset for m in plan.expired] == expected
    assert set(plan.reason.values()) <= {"log-start"}
    # Size retention goes on after the log-start deletions, counting only what remains.
    sized = plan_retention(segs, now_ms=0, retention_ms=-1, retention_bytes=100, log_start_offset=10)
    assert sized.reason == {0: "log-start", 10: "size"}


def test_a_checkpointed_high_watermark_above_the_log_end_is_another_logs(tmp_path: Path) -> None:
    """A topic deleted and created again within the broker's HW checkpoint interval: the file
    still holds the old topic's high watermark under the name."""
    logs = tmp_path / "logs"
    write_generated(logs, "t", 0, batches=40, seed=3, segment_bytes=8_000)
    settings = settings_for([logs], options={"root": str(tmp_path / "store")}, eligibility="high-watermark")
    readers = TieredReaders(settings, LocalBackend(root=str(tmp_path / "store")))
    ranges = readers.reader("t", 0).offsets()
    end = ranges.log_end_offset
    assert end is not None and ranges.visible_end_offset == ranges.high_watermark == end
    (logs / REPLICATION_OFFSET_CHECKPOINT).write_text(format_offset_checkpoint({("t", 0): end + 2500}))
    reader = readers.reader("t", 0)
    ranges = reader.offsets()
    assert (ranges.high_watermark, ranges.high_watermark_source, ranges.visible_end_offset) == (
        end + 2500,
        "tiered",
        0,
    )
    assert reader.lookup_timestamp(-1).offset == 0  # less than the broker knows, never the old end
    assert reader.fetch(0, 1 << 20).batches == []
