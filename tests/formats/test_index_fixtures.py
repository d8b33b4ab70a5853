"""The index, checkpoint and remote-index code against real broker-written files (shared/fixtures)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rlm.formats.checkpoint import EpochEntry, parse_leader_epoch_checkpoint, parse_offset_checkpoint
from rlm.formats.indexes.offset_index import OffsetIndex, OffsetPosition
from rlm.formats.indexes.remote_index import build_entries
from rlm.formats.indexes.remote_index_derived import (
    RemoteIndexSetBuilder,
    find_entry_for_offset,
    find_entry_for_timestamp,
)
from rlm.formats.indexes.time_index import TimeIndex, TimestampOffset
from rlm.formats.naming import parse_base_offset, parse_partition_dir

ARTHUR = "ArthurArutunyan04__Backend_labs"
ITUMELENG = "ItumelengMogase__Real-Time-Data-Pipeline-for-Patient-Admissions"


def segments(expected: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for source, partitions in expected.items():
        for partition, segs in partitions.items():
            if partition.startswith("_kraft"):
                continue
            for seg in segs:
                yield source, partition, seg


def seg_path(fixtures_dir: Path, source: str, partition: str, seg: dict[str, Any], suffix: str) -> Path:
    return fixtures_dir / "kafka-logs" / source / partition / seg["file"].replace(".log", suffix)


def check_index_files(
    fixtures_dir: Path,
    expected: dict[str, Any],
    kind: str,
    check_file: Callable[[Path, int, dict[str, Any], dict[str, Any], str], tuple[int, int]],
) -> tuple[int, int, int]:
    """Checks every fixture segment's index file of `kind` ("index" or "timeindex") with
    `check_file(path, base, want, seg, where)` -> (entries, queries); a segment the inventory lists
    without one must have no such file. Returns (files checked, entries, queries)."""
    checked = total_entries = queries = 0
    for source, partition, seg in segments(expected):
        path = seg_path(fixtures_dir, source, partition, seg, "." + kind)
        if kind not in seg:
            assert not path.exists()
            continue
        entries, asked = check_file(path, seg["base"], seg[kind], seg, f"{source}/{partition}/{path.name}")
        checked += 1
        total_entries += entries
        queries += asked
    return checked, total_entries, queries


def _check_offset_index(
    path: Path, base: int, want: dict[str, Any], seg: dict[str, Any], where: str
) -> tuple[int, int]:
    data = path.read_bytes()
    index = OffsetIndex(base, data)
    assert len(data) == want["file_bytes"], where
    assert len(index) == want["entries"], where
    assert [[e.offset - base, e.position] for e in index[:3]] == want["first_entries_rel_pos"], where
    last = [index[-1].offset - base, index[-1].position] if len(index) else None
    assert last == want["last_entry_rel_pos"], where
    for q in seg["offset_queries"]:
        assert index.lookup(q["offset"]) == OffsetPosition(*q["index_floor_offset_pos"]), (where, q)
    return len(index), len(seg["offset_queries"])


def _check_time_index(
    path: Path, base: int, want: dict[str, Any], seg: dict[str, Any], where: str
) -> tuple[int, int]:
    data = path.read_bytes()
    index = TimeIndex(base, data)
    assert len(data) == want["file_bytes"], where
    assert len(index) == want["entries"], where
    assert [[e.timestamp, e.offset - base] for e in index[:3]] == want["first_entries_ts_rel"], where
    last = [index.last_entry.timestamp, index.last_entry.offset - base] if len(index) else None
    assert last == want["last_entry_ts_rel"], where
    for q in seg["timestamp_queries"]:
        assert index.lookup(q["ts"]) == TimestampOffset(*q["timeindex_floor_ts_offset"]), (where, q)
    return len(index), len(seg["timestamp_queries"])


def test_every_offset_index_matches_expected(fixtures_dir: Path, expected: dict[str, Any]) -> None:
    checked, total_entries, queries = check_index_files(fixtures_dir, expected, "index", _check_offset_index)
    assert checked == 15
    assert total_entries == 1051  # the inventory's .index column
    assert queries > 0


def test_every_time_index_matches_expected(fixtures_dir: Path, expected: dict[str, Any]) -> None:
    checked, total_entries, queries = check_index_files(
        fixtures_dir, expected, "timeindex", _check_time_index
    )
    assert checked == 15
    assert total_entries == 1081  # the inventory's .timeindex column
    assert queries > 0


def test_oms_order_created_worked_answers(fixtures_dir: Path) -> None:
    part = fixtures_dir / "kafka-logs" / ARTHUR / "oms_order_created-1"
    base = parse_base_offset("00000000000000081908.index")
    index = OffsetIndex(base, (part / "00000000000000081908.index").read_bytes())
    assert index[0] == OffsetPosition(81939, 4609)
    assert index.last_offset == 94635
    assert index.lookup(88238) == OffsetPosition(88231, 1541424)
    assert index.lookup(88232) == OffsetPosition(88231, 1541424)
    assert index.lookup(81908) == OffsetPosition(81908, 0)
    assert index.lookup(94645) == OffsetPosition(94635, 3092362)
    times = TimeIndex(base, (part / "00000000000000081908.timeindex").read_bytes())
    # The final entry written on roll: the segment's max timestamp at its own last offset.
    assert times.last_entry == TimestampOffset(1766802778446, 94645)
    assert times.lookup(1766799400334) == TimestampOffset(1766799399854, 88276)


def test_zero_byte_index_and_two_entry_time_index(fixtures_dir: Path) -> None:
    for partition in ("_schemas-0", "docker-connect-configs-0"):
        part = fixtures_dir / "kafka-logs" / ITUMELENG / partition
        assert len(OffsetIndex(0, (part / "00000000000000000000.index").read_bytes())) == 0
        assert len(TimeIndex(0, (part / "00000000000000000000.timeindex").read_bytes())) == 2
    schemas = TimeIndex(
        0,
        (fixtures_dir / "kafka-logs" / ITUMELENG / "_schemas-0/00000000000000000000.timeindex").read_bytes(),
    )
    assert list(schemas) == [TimestampOffset(1728588424578, 37), TimestampOffset(1728596416496, 41)]
    assert schemas.lookup(1728581196965) == TimestampOffset(-1, 0)


def test_compacted_consumer_offsets_floor_is_base(fixtures_dir: Path) -> None:
    part = fixtures_dir / "kafka-logs" / ARTHUR / "__consumer_offsets-19"
    index = OffsetIndex(0, (part / "00000000000000000000.index").read_bytes())
    for offset in (0, 186795, 258466, 258522, 10**9):
        assert index.lookup(offset) == OffsetPosition(0, 0)
    times = TimeIndex(0, (part / "00000000000000000000.timeindex").read_bytes())
    assert list(times) == [TimestampOffset(1765403766162, 258526)]


OFFSET_CHECKPOINTS = (
    "replication-offset-checkpoint",
    "recovery-point-offset-checkpoint",
    "log-start-offset-checkpoint",
    "cleaner-offset-checkpoint",
)


def test_every_checkpoint_parses(fixtures_dir: Path) -> None:
    log_dirs = sorted(p for p in (fixtures_dir / "kafka-logs").iterdir() if p.is_dir())
    assert len(log_dirs) == 3
    parsed = epochs = 0
    for log_dir in log_dirs:
        for name in OFFSET_CHECKPOINTS:
            path = log_dir / name
            if path.exists():
                text = path.read_text()
                cp = parse_offset_checkpoint(text)
                count = int(text.splitlines()[1]) if text else 0
                assert len(cp.entries) == count, path
                parsed += 1
        for part in log_dir.iterdir():
            if part.is_dir():
                parse_partition_dir(part.name)
                cp_epochs = parse_leader_epoch_checkpoint((part / "leader-epoch-checkpoint").read_bytes())
                assert cp_epochs.entries, part
                assert [e.epoch for e in cp_epochs.entries] == sorted(e.epoch for e in cp_epochs.entries)
                epochs += 1
    assert parsed == 12
    assert epochs == 18


def test_checkpoint_values(fixtures_dir: Path) -> None:
    arthur = fixtures_dir / "kafka-logs" / ARTHUR
    epochs = parse_leader_epoch_checkpoint(
        (arthur / "oms_order_created-1/leader-epoch-checkpoint").read_text()
    )
    assert epochs.entries == [EpochEntry(10, 81908), EpochEntry(12, 91078), EpochEntry(14, 94005)]
    hw = parse_offset_checkpoint((arthur / "replication-offset-checkpoint").read_text())
    assert len(hw.entries) == 60
    assert hw.entries[("__consumer_offsets", 19)] == 330479
    cleaner = parse_offset_checkpoint((arthur / "cleaner-offset-checkpoint").read_text())
    assert cleaner.entries == {("__consumer_offsets", 19): 258527}
    assert (
        parse_offset_checkpoint(
            (fixtures_dir / "kafka-logs" / ITUMELENG / "cleaner-offset-checkpoint").read_text()
        ).entries
        == {}
    )


# -- remote index entries built from real segment batches ----------------------------------------

records = pytest.importorskip("rlm.formats.records")


@pytest.mark.parametrize("entry_bytes", [16384, 1 << 20])
def test_build_entries_over_real_segment(
    fixtures_dir: Path, expected: dict[str, Any], entry_bytes: int
) -> None:
    seg = expected[ARTHUR]["oms_order_created-1"][0]
    data = (fixtures_dir / "kafka-logs" / ARTHUR / "oms_order_created-1" / seg["file"]).read_bytes()
    batches = list(records.iter_batches(data))
    valid = records.valid_bytes(data)
    entries = build_entries(
        batches, object_url="mem://t/oms_order_created-1/81908.log", index_entry_bytes=entry_bytes
    )
    assert entries[0].rdi.position == 0
    for a, b in itertools.pairwise(entries):
        assert a.byte_range[1] == b.rdi.position  # contiguous
        assert a.last_offset < b.first_offset
        assert a.data_length <= entry_bytes
    assert entries[-1].byte_range[1] == valid == seg["bytes"]
    assert (entries[0].first_offset, entries[-1].last_offset) == (seg["first_offset"], seg["last_offset"])
    assert entries[0].first_timestamp == seg["first_batch"]["base_ts"]
    assert max(e.last_timestamp for e in entries) == seg["max_ts"]

    # The whole set built from them answers like a brute-force scan, and every entry's bytes parse.
    builder = RemoteIndexSetBuilder(entries[0].first_offset)
    log = b"".join(builder.append(e).log_index for e in entries)
    oi = OffsetIndex(builder.base_offset, builder.offset_index_bytes(), preallocated=False)
    ti = TimeIndex(builder.base_offset, builder.time_index_bytes(), preallocated=False)
    for q in seg["offset_queries"]:
        found = find_entry_for_offset(oi, log, q["offset"])
        assert found is not None
        start, end = found.entry.byte_range
        assert start <= q["batch_pos"] < end
    for q in seg["timestamp_queries"]:
        found = find_entry_for_timestamp(ti, oi, log, q["ts"])
        if q["first_offset_with_ts_ge"] is None:
            assert found is None
        else:
            assert found is not None
            assert found.entry.first_offset <= q["first_offset_with_ts_ge"] <= found.entry.last_offset
            in_entry = list(
                records.iter_batches(data, found.entry.rdi.position, end=found.entry.byte_range[1])
            )
            assert q["batch_pos"] in [b.position for b in in_entry]
