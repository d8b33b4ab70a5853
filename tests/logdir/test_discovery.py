"""Discovery of partitions/segments, checkpoint state and eligibility, on real and synthetic log dirs."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from rlm.errors import CheckpointError, InvalidArgumentError, LogDirError
from rlm.fsutil import SETTLE_NS
from rlm.logdir import discovery
from rlm.logdir.discovery import (
    PartitionState,
    SegmentFiles,
    discover_partitions,
    eligible_segments,
    list_segments,
    partition_state,
    read_checkpoints,
)

ARTHUR = "ArthurArutunyan04__Backend_labs"
ITUMELENG = "ItumelengMogase__Real-Time-Data-Pipeline-for-Patient-Admissions"
BERKAY = "berkayakcay__toy-node-log-collector"
ID_A = "AAAAAAAAAAAAAAAAAAAAAQ"
ID_B = "BBBBBBBBBBBBBBBBBBBBBQ"


def _logs(fixtures_dir: Path, source: str) -> Path:
    return fixtures_dir / "kafka-logs" / source


def test_discovers_every_fixture_partition(fixtures_dir: Path) -> None:
    dirs = [_logs(fixtures_dir, s) for s in (ARTHUR, ITUMELENG, BERKAY)]
    found = {(p.topic, p.partition): p for p in discover_partitions(dirs)}
    assert ("__cluster_metadata", 0) in found
    assert ("_confluent-ksql-default__command_topic", 0) in found
    assert ("topic-logx-001", 2) in found
    assert ("oms_order_created", 1) in found
    assert ("__consumer_offsets", 19) in found
    p = found[("_confluent-ksql-default__command_topic", 0)]
    assert p.log_dir == _logs(fixtures_dir, ITUMELENG)
    assert p.path.name == "_confluent-ksql-default__command_topic-0" == p.name
    # 8 + 7 + 3 partition dirs; __cluster_metadata-0 exists in two log dirs and is kept once.
    assert len(found) == 8 + 7 + 3 - 1


def test_discovery_is_sorted(fixtures_dir: Path) -> None:
    found = discover_partitions([_logs(fixtures_dir, ARTHUR)])
    keys = [(p.topic, p.partition) for p in found]
    assert keys == sorted(keys)
    assert keys[:2] == [("__cluster_metadata", 0), ("__consumer_offsets", 19)]


def test_segments_in_offset_order_with_companions(fixtures_dir: Path) -> None:
    part = _logs(fixtures_dir, ARTHUR) / "__cluster_metadata-0"
    segments = list_segments(part)
    assert [s.base_offset for s in segments] == [0, 5151]
    first, second = segments
    assert first.size == 359259 and second.size == 142722
    assert first.index is not None and first.index.name == "00000000000000000000.index"
    assert first.time_index is not None and first.snapshot is None
    assert second.snapshot is not None and second.snapshot.name == "00000000000000005151.snapshot"
    assert discovery.active_segment(segments) == second


def test_partition_without_logs_and_without_indexes(fixtures_dir: Path) -> None:
    # Itumeleng's metadata dir only holds KRaft .checkpoint snapshots and producer snapshots.
    assert list_segments(_logs(fixtures_dir, ITUMELENG) / "__cluster_metadata-0") == []
    (seg,) = list_segments(_logs(fixtures_dir, BERKAY) / "topic-logx-001-1")
    assert seg.index is None and seg.time_index is None


def test_high_watermarks_from_checkpoint(fixtures_dir: Path) -> None:
    cps = read_checkpoints(_logs(fixtures_dir, ARTHUR))
    assert cps.high_watermarks[("oms_order_created", 1)] == 94646
    assert cps.log_start_offsets == {}  # file is "0\n0\n"
    parts = {p.name: p for p in discover_partitions([_logs(fixtures_dir, ARTHUR)])}
    state = partition_state(parts["oms_order_status_changed-1"])
    assert state == PartitionState(high_watermark=24651, log_start_offset=None, recovery_point=24651)
    # KRaft's metadata log is not in replication-offset-checkpoint: its HW is unknown.
    assert partition_state(parts["__cluster_metadata-0"]).high_watermark is None
    berkay = {p.name: p for p in discover_partitions([_logs(fixtures_dir, BERKAY)])}
    assert partition_state(berkay["topic-logx-001-1"]).high_watermark == 16


def test_eligibility_on_cluster_metadata(fixtures_dir: Path) -> None:
    parts = {p.name: p for p in discover_partitions([_logs(fixtures_dir, ARTHUR)])}
    meta = parts["__cluster_metadata-0"]
    state = partition_state(meta)
    # No HW recorded for the metadata log: nothing is provably committed.
    assert eligible_segments(meta, state, "high-watermark") == []
    rolled = eligible_segments(meta, state, "rolled")
    assert [s.base_offset for s in rolled] == [0]  # the active 5151 segment never is
    # With a HW at the next segment's base the first segment becomes eligible; one below, not.
    assert [s.base_offset for s in eligible_segments(meta, PartitionState(high_watermark=5151))] == [0]
    assert eligible_segments(meta, PartitionState(high_watermark=5150)) == []


def test_single_segment_partitions_have_nothing_eligible(fixtures_dir: Path) -> None:
    for part in discover_partitions([_logs(fixtures_dir, ARTHUR)]):
        if part.name == "__cluster_metadata-0":
            continue
        state = partition_state(part)
        assert eligible_segments(part, state, "rolled") == []
        assert eligible_segments(part, state, "high-watermark") == []


def _seg(base: int) -> SegmentFiles:
    return SegmentFiles(base_offset=base, log=Path(f"{base:020d}.log"), size=1)


def test_eligibility_rule_on_listed_segments() -> None:
    segments = [_seg(200), _seg(0), _seg(100), _seg(300)]  # unsorted input is sorted
    hw = [s.base_offset for s in eligible_segments(segments, PartitionState(high_watermark=250))]
    assert hw == [0, 100]
    assert [s.base_offset for s in eligible_segments(segments, PartitionState(high_watermark=300))] == [
        0,
        100,
        200,
    ]
    assert [s.base_offset for s in eligible_segments(segments, PartitionState(), "rolled")] == [0, 100, 200]
    assert eligible_segments(segments, PartitionState(), "high-watermark") == []
    with pytest.raises(InvalidArgumentError):
        eligible_segments(segments, PartitionState(), "everything")  # type: ignore[arg-type]


def _touch(path: Path, data: bytes = b"") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


# Directory names a broker's log dir may hold that are not live partitions (each is skipped with a reason).
_NOT_PARTITIONS = (
    "-5",
    "t-",
    "topic",
    "t-01a",
    "my.topic-3.abc123-delete",
    "orders-1.9f8e-future",
    "orders-2.1a2b-stray",
    ".hidden-0",
    "bad$topic-1",
)


def test_weird_names_and_non_partition_dirs(tmp_path: Path) -> None:
    log_dir = tmp_path / "kafka logs"  # a space in the log dir path itself
    for name in ("a.b_c-d-0", "x-y-12", *_NOT_PARTITIONS):
        (log_dir / name).mkdir(parents=True)
    _touch(log_dir / "replication-offset-checkpoint", b"0\n0\n")
    _touch(log_dir / "file-0")  # a file, not a dir
    skipped: list[tuple[str, str]] = []
    found = discover_partitions([log_dir], on_skip=lambda p, why: skipped.append((p.name, why)))
    assert [(p.topic, p.partition) for p in found] == [("a.b_c-d", 0), ("x-y", 12)]
    reasons = dict(skipped)
    assert set(reasons) == set(_NOT_PARTITIONS)
    assert "delete" in reasons["my.topic-3.abc123-delete"]
    assert "future" in reasons["orders-1.9f8e-future"]


def test_missing_log_dir_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(LogDirError) as info:
        discover_partitions([tmp_path / "nope"])
    assert "nope" in str(info.value)


def test_transient_and_foreign_files_ignored(tmp_path: Path) -> None:
    part = tmp_path / "t-0"
    for name in (
        "00000000000000000000.log.deleted",
        "00000000000000000000.index.deleted",
        "00000000000000000010.log",
        "00000000000000000010.index",
        "00000000000000000010.timeindex.swap",
        "00000000000000000020.log.cleaned",
        "00000000000000000030.log.swap",
        "00000000000000000040.log",
        "00000000000000000040.txnindex",
        "00000000000000000001-0000000001.checkpoint",
        "leader-epoch-checkpoint",
        "partition.metadata",
        "00000000000000000010.remotelogindex",
        "garbage.log",
    ):
        _touch(part / name)
    skipped: list[str] = []
    segments = list_segments(part, on_skip=lambda p, why: skipped.append(p.name))
    assert [s.base_offset for s in segments] == [10, 40]
    assert segments[0].index is not None and segments[0].time_index is None  # .swap ignored
    assert segments[1].txn_index is not None
    assert skipped == ["garbage.log"]


def test_vanishing_segment_between_listdir_and_stat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retention renames a .log to .deleted right after the directory listing: that segment is skipped."""
    part = tmp_path / "orders-0"
    for base in (0, 100, 200):
        _touch(part / f"{base:020d}.log", b"x" * 10)
        _touch(part / f"{base:020d}.index")
    real_listdir = discovery.os.listdir

    def listdir_then_retention(path: str | Path) -> list[str]:
        names = real_listdir(path)
        victim = part / f"{0:020d}.log"
        if victim.exists():
            victim.rename(victim.with_name(victim.name + ".deleted"))
        return names

    monkeypatch.setattr(discovery.os, "listdir", listdir_then_retention)
    skipped: list[tuple[str, str]] = []
    segments = list_segments(part, on_skip=lambda p, why: skipped.append((p.name, why)))
    assert [s.base_offset for s in segments] == [100, 200]
    assert skipped and skipped[0][0] == f"{0:020d}.log" and "vanished" in skipped[0][1]
    # The next listing sees the renamed file as transient and no longer reports it.
    monkeypatch.setattr(discovery.os, "listdir", real_listdir)
    assert [s.base_offset for s in list_segments(part)] == [100, 200]


def test_vanished_partition_dir(tmp_path: Path) -> None:
    assert list_segments(tmp_path / "gone-0") == []


def test_checkpoint_edge_cases(tmp_path: Path) -> None:
    assert read_checkpoints(tmp_path) == discovery.LogDirCheckpoints()  # all absent
    _touch(tmp_path / "replication-offset-checkpoint", b"")  # Kafka creates them empty
    _touch(tmp_path / "recovery-point-offset-checkpoint", b"0\n1\nweird.topic-x 3 17\n")
    cps = read_checkpoints(tmp_path)
    assert cps.high_watermarks == {}
    assert cps.recovery_points == {("weird.topic-x", 3): 17}
    _touch(tmp_path / "replication-offset-checkpoint", b"0\n2\nt 0 5\n")  # count mismatch
    with pytest.raises(CheckpointError) as info:
        read_checkpoints(tmp_path)
    assert "replication-offset-checkpoint" in str(info.value)


def _write_topic_id(part_dir: Path, topic_id: str, mtime_ns: int, *, rename: bool = True) -> None:
    from rlm.formats.partition_metadata import format_partition_metadata

    target = part_dir / "partition.metadata"
    tmp = part_dir / "partition.metadata.tmp" if rename else target
    tmp.write_bytes(format_partition_metadata(topic_id))
    os.utime(tmp, ns=(mtime_ns, mtime_ns))
    if rename:
        os.replace(tmp, target)


def test_discovery_sees_a_new_topic_id_a_new_and_a_vanished_partition(tmp_path: Path) -> None:
    """Discovery keeps the last one's partition dirs while their partition.metadata keeps its
    signature: a re-created topic (another id), a new and a deleted partition are seen all the same."""
    old = time.time_ns() - 10 * SETTLE_NS
    (tmp_path / "t-0").mkdir()
    _write_topic_id(tmp_path / "t-0", ID_A, old)
    first = discover_partitions([tmp_path])
    assert [(p.name, p.topic_id) for p in first] == [("t-0", ID_A)]
    assert discover_partitions([tmp_path])[0] is first[0]  # unchanged: the same one
    _write_topic_id(tmp_path / "t-0", ID_B, old + 1)  # the same size: only the signature tells
    (tmp_path / "t-1").mkdir()
    assert [(p.name, p.topic_id) for p in discover_partitions([tmp_path])] == [("t-0", ID_B), ("t-1", None)]
    shutil.rmtree(tmp_path / "t-0")
    assert [p.name for p in discover_partitions([tmp_path])] == ["t-1"]


def test_discovery_reads_again_a_topic_id_written_in_the_same_tick(tmp_path: Path) -> None:
    """A partition.metadata that had not settled when read is not kept: a successor written in
    place in the same timestamp tick (same inode, size and mtime) is read."""
    now = time.time_ns()
    (tmp_path / "t-0").mkdir()
    _write_topic_id(tmp_path / "t-0", ID_A, now, rename=False)
    assert discover_partitions([tmp_path])[0].topic_id == ID_A
    _write_topic_id(tmp_path / "t-0", ID_B, now, rename=False)
    assert discover_partitions([tmp_path])[0].topic_id == ID_B
