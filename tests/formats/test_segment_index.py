"""Kafka's index rules in one place (rlm.formats.indexes.segment_index) and the checks of a broker index
against its .log; LogSegment's use of them (docs/broker-files.md)."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

from rlm.errors import CorruptIndexError
from rlm.formats.indexes.offset_index import OffsetIndex
from rlm.formats.indexes.segment_index import check_offset_index, check_time_index, rebuild_indexes
from rlm.formats.indexes.time_index import TimeIndex
from rlm.formats.records import RecordBatch, RecordSpec, iter_batches
from rlm.logdir.discovery import list_segments
from rlm.logdir.segment import LogSegment
from rlm.logdir.writer import LogWriter

T0 = 1_700_000_000_000


def _partition(tmp_path: Path, interval: int, seed: int = 1) -> Path:
    rnd = random.Random(seed)
    ts = T0
    with LogWriter(
        tmp_path, "t", 0, segment_bytes=20_000, index_interval_bytes=interval, clock=lambda: T0
    ) as w:
        for _i in range(120):
            recs = []
            for _ in range(rnd.randint(1, 5)):
                ts += rnd.randint(-100, 500)
                recs.append(RecordSpec(ts, None, rnd.randbytes(rnd.randint(5, 150))))
            w.append(recs)
    return tmp_path / "t-0"


def _batches(path: Path) -> list[RecordBatch]:
    return list(iter_batches(path.read_bytes()))


@pytest.mark.parametrize("interval", [0, 100, 1_024, 4_096])
def test_rebuild_equals_what_the_writer_wrote(tmp_path: Path, interval: int) -> None:
    for seg in list_segments(_partition(tmp_path, interval)):
        assert seg.index is not None and seg.time_index is not None
        batches = _batches(seg.log)
        index, times = seg.index.read_bytes(), seg.time_index.read_bytes()
        assert rebuild_indexes(seg.base_offset, batches, interval) == (index, times)
        check_offset_index(OffsetIndex(seg.base_offset, index), batches)
        check_time_index(TimeIndex(seg.base_offset, times), batches)


def _pairs(raw: bytes, fmt: str) -> list[tuple[int, int]]:
    return [tuple(e) for e in struct.iter_unpack(fmt, raw)]


def test_offset_entries_must_point_at_their_batch(tmp_path: Path) -> None:
    seg = list_segments(_partition(tmp_path, 100))[0]
    assert seg.index is not None
    batches = _batches(seg.log)
    entries = _pairs(seg.index.read_bytes(), ">ii")
    assert len(entries) > 4

    def check(bad: list[tuple[int, int]]) -> CorruptIndexError:
        with pytest.raises(CorruptIndexError) as info:
            check_offset_index(
                OffsetIndex(seg.base_offset, b"".join(struct.pack(">ii", *e) for e in bad)), batches
            )
        return info.value

    rel, pos = entries[2]
    assert check([*entries[:2], (rel, pos + 1), *entries[3:]]).position == 16  # not a batch start
    # An offset below the last offset of the batch at its position: records before it would be
    # skipped by a floor lookup.
    assert check([*entries[:2], (entries[1][0] + 1, entries[3][1]), *entries[3:]]).position == 16
    last_rel = batches[-1].last_offset - seg.base_offset
    assert check([*entries, (last_rel + 1, batches[-1].position)]).offset == batches[-1].last_offset + 1


def test_time_entries_must_name_where_the_max_first_rose(tmp_path: Path) -> None:
    seg = list_segments(_partition(tmp_path, 100))[0]
    assert seg.time_index is not None
    batches = _batches(seg.log)
    entries = _pairs(seg.time_index.read_bytes(), ">qi")
    assert len(entries) > 4

    def check(bad: list[tuple[int, int]]) -> None:
        index = TimeIndex(seg.base_offset, b"".join(struct.pack(">qi", *e) for e in bad))
        with pytest.raises(CorruptIndexError):
            check_time_index(index, batches)

    ts, rel = entries[2]
    check([*entries[:2], (ts - 1, rel), *entries[3:]])  # a timestamp the log does not have there
    check([*entries[:2], (ts, rel + 1000000)])  # past the segment
    # The next batch: its running max is either above ts or was already ts one batch earlier.
    later = next(b for b in batches if b.last_offset > seg.base_offset + rel)
    check([*entries[:2], (ts, later.last_offset - seg.base_offset)])


def test_log_segment_rebuilds_an_index_whose_used_entry_is_wrong(tmp_path: Path) -> None:
    """Structurally fine (increasing, inside the file) but entry 2 points at entry 3's batch: a
    floor lookup through it would skip records. The entry is checked when used."""
    part = _partition(tmp_path, 100)
    seg = list_segments(part)[0]
    assert seg.index is not None
    entries = _pairs(seg.index.read_bytes(), ">ii")
    with LogSegment.open(seg) as clean:
        target = seg.base_offset + entries[2][0]
        expected = clean.find_batch(target)
        assert expected is not None
    entries[2] = (entries[2][0], entries[3][1])
    seg.index.write_bytes(b"".join(struct.pack(">ii", *e) for e in entries))
    with LogSegment.open(seg, index_interval_bytes=100) as broken:
        assert broken.find_batch(target) == expected
        rebuilt = broken.offset_index
        assert rebuilt is not None and rebuilt.lookup(target).position != entries[3][1]


def test_log_segment_keeps_entries_of_a_growing_active_segment(tmp_path: Path) -> None:
    """Entries appended after the .log was mapped are not corruption: they are ignored."""
    part = _partition(tmp_path, 100)
    seg = list_segments(part)[-1]
    with LogSegment.open(seg) as mapped:
        with seg.log.open("ab") as fh:
            fh.write(bytes(64))  # the log grew after the mapping was taken
        assert seg.index is not None
        raw = seg.index.read_bytes()
        seg.index.write_bytes(raw + struct.pack(">ii", 10**6, mapped.size + 10))
        index = mapped.offset_index
        assert index is not None and len(index) == len(raw) // 8
