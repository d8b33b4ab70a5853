"""LogSegment against real broker-written segments: every answer of expected.json and the README's
worked examples (../shared/fixtures)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlm.errors import CorruptRecordError
from rlm.logdir.segment import LogSegment


def _segments(expected: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for source, partitions in expected.items():
        for partition, segments in partitions.items():
            if partition == "_kraft_snapshots":
                continue  # snapshot files, not segments
            for segment in segments:
                yield source, partition, segment


def _open(fixtures_dir: Path, source: str, partition: str, file: str) -> LogSegment:
    return LogSegment(fixtures_dir / "kafka-logs" / source / partition / file)


def test_every_offset_query(fixtures_dir: Path, expected: dict[str, Any]) -> None:
    checked = 0
    for source, partition, seg in _segments(expected):
        with _open(fixtures_dir, source, partition, seg["file"]) as segment:
            for query in seg["offset_queries"]:
                where = f"{source}/{partition}/{seg['file']} offset {query['offset']}"
                batch = segment.find_batch(query["offset"])
                checked += 1
                if query["batch_pos"] is None:
                    assert batch is None, where
                    continue
                assert batch is not None, where
                assert (batch.position, batch.base_offset, batch.last_offset) == (
                    query["batch_pos"],
                    query["batch_base_offset"],
                    query["batch_last_offset"],
                ), where
                offsets = {r.offset for r in segment.read_records(batch)}
                assert (query["offset"] in offsets) == query["contained"], where
    assert checked >= 80  # guards against silently iterating nothing


def test_every_timestamp_query(fixtures_dir: Path, expected: dict[str, Any]) -> None:
    checked = 0
    for source, partition, seg in _segments(expected):
        with _open(fixtures_dir, source, partition, seg["file"]) as segment:
            for query in seg["timestamp_queries"]:
                where = f"{source}/{partition}/{seg['file']} ts {query['ts']}"
                found = segment.find_offset_by_timestamp(query["ts"])
                if query["first_offset_with_ts_ge"] is None:
                    assert found is None, where
                else:
                    assert found is not None, where
                    assert found.offset == query["first_offset_with_ts_ge"], where
                    assert found.batch.position == query["batch_pos"], where
                    assert found.timestamp >= query["ts"], where
                checked += 1
    assert checked >= 100  # guards against silently iterating nothing


def test_index_floors_match_expected(fixtures_dir: Path, expected: dict[str, Any]) -> None:
    """The indexes LogSegment loads give the floors an independent parser computed."""
    for source, partition, seg in _segments(expected):
        with _open(fixtures_dir, source, partition, seg["file"]) as segment:
            for query in seg["offset_queries"]:
                if "index_floor_offset_pos" not in query:
                    assert segment.offset_index is None  # no .index file upstream
                    continue
                floor = query["index_floor_offset_pos"]
                index = segment.offset_index
                got = (
                    [index.lookup(query["offset"]).offset, index.lookup(query["offset"]).position]
                    if index is not None
                    else [segment.base_offset, 0]
                )
                assert got == floor, (source, partition, query)
            for query in seg["timestamp_queries"]:
                if "timeindex_floor_ts_offset" not in query:
                    assert segment.time_index is None
                    continue
                tindex = segment.time_index
                got = (
                    [tindex.lookup(query["ts"]).timestamp, tindex.lookup(query["ts"]).offset]
                    if tindex is not None
                    else [-1, segment.base_offset]
                )
                assert got == query["timeindex_floor_ts_offset"], (source, partition, query)


ARTHUR = "ArthurArutunyan04__Backend_labs"
ITUMELENG = "ItumelengMogase__Real-Time-Data-Pipeline-for-Patient-Admissions"
BERKAY = "berkayakcay__toy-node-log-collector"


@pytest.mark.parametrize(
    ("source", "partition", "file", "ts", "offset", "position"),
    [
        # Exactly a time-index timestamp: equal timestamps earlier in the batch win over the entry's offset.
        (ARTHUR, "oms_order_created-1", "00000000000000081908.log", 1766799398881, 88245, 1547292),
        (ARTHUR, "oms_order_created-1", "00000000000000081908.log", 1766799400334, 88284, 1555137),
        (ARTHUR, "oms_order_created-1", "00000000000000081908.log", 1766802778446, 94636, None),
        (ARTHUR, "oms_order_created-1", "00000000000000081908.log", 1766802778447, None, None),
        (ARTHUR, "oms_order_created-1", "00000000000000081908.log", 1766799076130, 81908, 0),
        (ARTHUR, "oms_order_status_changed-0", "00000000000000000000.log", 1766799390331, 1674, 149063),
        (ARTHUR, "__cluster_metadata-0", "00000000000000000000.log", 1765394860694, 1656, 119270),
        # Compacted: sparse offsets inside batches.
        (ARTHUR, "__consumer_offsets-19", "00000000000000000000.log", 1765403766081, 258519, 867),
        (ARTHUR, "__consumer_offsets-19", "00000000000000000000.log", 1765403766080, 258480, 551),
        (ARTHUR, "__consumer_offsets-19", "00000000000000000000.log", 1765403766163, None, None),
        # Empty .index, time-index floor (-1, 0): the scan starts at 0.
        (ITUMELENG, "_schemas-0", "00000000000000000000.log", 1728581196965, 22, 2112),
        (BERKAY, "topic-logx-001-1", "00000000000000000000.log", 1726604049362, 9, 6975),
    ],
)
def test_readme_timestamp_answers(
    fixtures_dir: Path,
    source: str,
    partition: str,
    file: str,
    ts: int,
    offset: int | None,
    position: int | None,
) -> None:
    with _open(fixtures_dir, source, partition, file) as segment:
        found = segment.find_offset_by_timestamp(ts)
    if offset is None:
        assert found is None
        return
    assert found is not None
    assert found.offset == offset
    if position is not None:
        assert found.batch.position == position


@pytest.mark.parametrize(
    ("source", "partition", "file", "offset", "position", "floor", "contained"),
    [
        (ARTHUR, "oms_order_created-1", "00000000000000081908.log", 88238, 1544137, (88231, 1541424), True),
        (ARTHUR, "oms_order_created-1", "00000000000000081908.log", 88231, 1541424, (88231, 1541424), True),
        (ARTHUR, "oms_order_created-1", "00000000000000081908.log", 88232, 1544137, (88231, 1541424), True),
        (ARTHUR, "oms_order_created-1", "00000000000000081908.log", 94645, 3095665, (94635, 3092362), True),
        (
            ARTHUR,
            "oms_order_status_changed-0",
            "00000000000000000000.log",
            1647,
            146539,
            (1610, 143102),
            True,
        ),
        (ARTHUR, "__cluster_metadata-0", "00000000000000005151.log", 6357, 79163, (6313, 77978), True),
        (ARTHUR, "__cluster_metadata-0", "00000000000000005151.log", 7319, 142635, (7237, 138816), True),
        (ARTHUR, "__consumer_offsets-19", "00000000000000000000.log", 0, 0, None, False),
        (ARTHUR, "__consumer_offsets-19", "00000000000000000000.log", 258466, 551, None, False),
        (ARTHUR, "__consumer_offsets-19", "00000000000000000000.log", 258522, 867, None, True),
        (BERKAY, "topic-logx-001-1", "00000000000000000000.log", 8, 6156, None, True),
    ],
)
def test_readme_offset_answers(
    fixtures_dir: Path,
    source: str,
    partition: str,
    file: str,
    offset: int,
    position: int,
    floor: tuple[int, int] | None,
    contained: bool,
) -> None:
    with _open(fixtures_dir, source, partition, file) as segment:
        batch = segment.find_batch(offset)
        assert batch is not None
        assert batch.position == position
        assert (offset in {r.offset for r in segment.read_records(batch)}) == contained
        if floor is not None:
            index = segment.offset_index
            assert index is not None
            got = index.lookup(offset)
            assert (got.offset, got.position) == floor


def test_offset_past_the_end_is_none(fixtures_dir: Path) -> None:
    path = fixtures_dir / "kafka-logs" / ITUMELENG / "_confluent-ksql-default__command_topic-0"
    with LogSegment(path / "00000000000000000000.log") as segment:
        assert segment.find_batch(2) is None
        assert segment.find_batch(1) is not None


def test_compacted_segment_has_empty_offset_index(fixtures_dir: Path) -> None:
    path = fixtures_dir / "kafka-logs" / ARTHUR / "__consumer_offsets-19" / "00000000000000000000.log"
    with LogSegment(path) as segment:
        assert segment.offset_index is None  # 0-byte .index
        assert segment.time_index is not None and len(segment.time_index) == 1
        assert [b.position for b in segment.batches()] == [0, 551, 867]


def test_segment_without_index_files(fixtures_dir: Path) -> None:
    path = fixtures_dir / "kafka-logs" / BERKAY / "topic-logx-001-0" / "00000000000000000000.log"
    with LogSegment(path) as segment:
        assert segment.offset_index is None and segment.time_index is None
        assert sum(1 for _ in segment.batches()) == 17


def test_use_indexes_false_gives_same_answers(fixtures_dir: Path, expected: dict[str, Any]) -> None:
    """The index-assisted path and a plain scan from position 0 agree (guards the floor logic)."""
    seg = expected[ARTHUR]["oms_order_created-1"][0]
    path = fixtures_dir / "kafka-logs" / ARTHUR / "oms_order_created-1" / seg["file"]
    with LogSegment(path) as indexed, LogSegment(path, use_indexes=False) as plain:
        assert indexed.offset_index is not None and plain.offset_index is None
        for entry in list(indexed.time_index or [])[::25]:
            for ts in (entry.timestamp - 1, entry.timestamp, entry.timestamp + 1):
                a = indexed.find_offset_by_timestamp(ts)
                b = plain.find_offset_by_timestamp(ts)
                assert (a and a.offset) == (b and b.offset), ts


def test_empty_log_file(tmp_path: Path) -> None:
    log = tmp_path / "00000000000000000042.log"
    log.write_bytes(b"")
    with LogSegment(log) as segment:
        assert segment.base_offset == 42
        assert segment.size == 0
        assert list(segment.batches()) == []
        assert segment.find_batch(42) is None
        assert segment.find_offset_by_timestamp(0) is None


def test_errors_name_the_file(fixtures_dir: Path, tmp_path: Path) -> None:
    source = fixtures_dir / "kafka-logs" / ARTHUR / "oms_order_status_changed-0" / "00000000000000000000.log"
    data = bytearray(source.read_bytes()[:5000])
    data[100] ^= 0xFF  # inside the first batch's CRC-covered bytes
    broken = tmp_path / "00000000000000000000.log"
    broken.write_bytes(bytes(data))
    with LogSegment(broken) as segment, pytest.raises(CorruptRecordError) as info:
        list(segment.batches())
    assert info.value.file == str(broken)
    assert str(broken) in str(info.value)


def test_renamed_segment_stays_readable(fixtures_dir: Path, tmp_path: Path) -> None:
    """The mmap keeps the inode: retention renaming the .log mid-read does not break a reader."""
    source = fixtures_dir / "kafka-logs" / ARTHUR / "oms_order_status_changed-0" / "00000000000000000000.log"
    log = tmp_path / source.name
    log.write_bytes(source.read_bytes())
    with LogSegment(log, use_indexes=False) as segment:
        log.rename(log.with_name(log.name + ".deleted"))
        assert sum(1 for _ in segment.batches()) == 1257


def test_open_vanished_segment_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        LogSegment(tmp_path / "00000000000000000000.log")
