"""LogWriter: Kafka-identical segments, indexes, rolls and checkpoints, checked against kafka-python's
independent record codec, the Kafka index invariants of the fixtures README, and brute force."""

from __future__ import annotations

import itertools
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder

from rlm.errors import InvalidArgumentError, LogDirError
from rlm.formats.checkpoint import parse_leader_epoch_checkpoint, parse_offset_checkpoint
from rlm.formats.compression import Compression
from rlm.formats.indexes.offset_index import OffsetIndex
from rlm.formats.indexes.time_index import TimeIndex
from rlm.formats.records import Header, Record, RecordBatch, RecordSpec, TimestampType, build_batch
from rlm.logdir.discovery import discover_partitions, list_segments, read_checkpoints
from rlm.logdir.segment import LogSegment
from rlm.logdir.writer import LogWriter


class FakeClock:
    """Milliseconds under test control."""

    def __init__(self, now: int = 1_700_000_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def _spec(ts: int, i: int, size: int = 50) -> RecordSpec:
    return RecordSpec(ts, f"k{i}".encode(), bytes([i % 251]) * size, (Header("h", str(i).encode()),))


@dataclass
class _Seg:
    base: int
    batches: list[RecordBatch]
    records: list[Record]
    index: list[tuple[int, int]]
    timeindex: list[tuple[int, int]]
    size: int


def _read_partition(part: Path) -> list[_Seg]:
    out = []
    listed = list_segments(part)
    for n, files in enumerate(listed):
        # A rolled segment's index is trimmed to its entries (Kafka's roll does the same), so an
        # all-zero entry there is real: (timestamp 0, relative offset 0). Only the active one's
        # file may end with preallocated zeros.
        rolled = n < len(listed) - 1
        with LogSegment.open(files) as seg:
            batches = list(seg.batches())
            records = [r for b in batches for r in seg.read_records(b)]
            raw_index = files.index.read_bytes() if files.index else b""
            raw_time = files.time_index.read_bytes() if files.time_index else b""
            index = [(e.offset, e.position) for e in OffsetIndex(files.base_offset, raw_index)]
            time_index = TimeIndex(files.base_offset, raw_time, preallocated=not rolled)
            times = [(e.timestamp, e.offset) for e in time_index]
            out.append(_Seg(files.base_offset, batches, records, index, times, seg.size))
    return out


def assert_kafka_index_invariants(part: Path, index_interval_bytes: int) -> list[_Seg]:
    """The README's invariants, plus the exact entries Kafka's append rule produces for one-batch appends."""
    segments = _read_partition(part)
    for n, seg in enumerate(segments):
        closed = n < len(segments) - 1
        by_pos = {b.position: b for b in seg.batches}
        # .index: entry offset == lastOffset of the batch starting at its position; gaps > interval.
        prev_pos = 0
        for offset, pos in seg.index:
            assert offset == by_pos[pos].last_offset
            assert pos - prev_pos > index_interval_bytes
            prev_pos = pos
        # Exactly Kafka's rule: the entry is taken at the first batch that follows more than
        # index_interval_bytes since the previous entry (checked before counting the batch).
        expected_index, since = [], 0
        for b in seg.batches:
            if since > index_interval_bytes:
                expected_index.append((b.last_offset, b.position))
                since = 0
            since += b.size
        assert seg.index == expected_index
        # .timeindex: offsets are batch lastOffsets, timestamps the running max maxTimestamp there.
        running, max_at = -1, {}
        for b in seg.batches:
            running = max(running, b.max_timestamp)
            max_at[b.last_offset] = running
        stamps = [t for t, _ in seg.timeindex]
        assert stamps == sorted(set(stamps))  # strictly increasing
        for ts, offset in seg.timeindex:
            assert max_at[offset] == ts
        seg_max = max((b.max_timestamp for b in seg.batches), default=-1)
        if closed and seg_max >= 0:
            assert seg.timeindex[-1][0] == seg_max
        assert len(seg.timeindex) <= len(seg.index) + 1
    return segments


def _kafka_python_records(
    log: Path,
) -> list[tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes]]]]:
    out = []
    records = MemoryRecords(log.read_bytes())
    while records.has_next():
        batch = records.next_batch()
        for r in batch:
            out.append((r.offset, r.timestamp, r.key, r.value, [(k, v) for k, v in r.headers]))
    return out


@pytest.mark.parametrize("codec", list(Compression))
def test_kafka_python_reads_what_we_write(tmp_path: Path, codec: Compression) -> None:
    clock = FakeClock()
    written = []
    with LogWriter(
        tmp_path, "my.topic_x-y", 3, segment_bytes=6000, index_interval_bytes=700, clock=clock
    ) as w:
        offset = 0
        for i in range(60):
            specs = [
                _spec(clock.now + (i * 7919 + j * 104729) % 5000, i * 10 + j, 20 + i)
                for j in range(1 + i % 4)
            ]
            w.append(specs, compression=codec)
            for s in specs:
                written.append((offset, s.timestamp, s.key, s.value, [(h.key, h.value) for h in s.headers]))
                offset += 1
    part = tmp_path / "my.topic_x-y-3"
    logs = sorted(part.glob("*.log"))
    assert len(logs) > 1, "expected several segments"
    theirs = [rec for log in logs for rec in _kafka_python_records(log)]
    assert theirs == written
    ours = [
        (r.offset, r.timestamp, r.key, r.value, [(h.key, h.value) for h in r.headers])
        for seg in assert_kafka_index_invariants(part, 700)
        for r in seg.records
    ]
    assert ours == written
    segments = _read_partition(part)
    assert all(b.compression == codec and b.crc_valid for s in segments for b in s.batches)


def test_append_raw_from_kafka_python_builder(tmp_path: Path) -> None:
    with LogWriter(tmp_path, "raw", 0, index_interval_bytes=100, leader_epoch=4) as w:
        for n, codec in enumerate((0, 1, 2, 3, 4)):
            builder = MemoryRecordsBuilder(magic=2, compression_type=codec, batch_size=1 << 20)
            for i in range(5):
                builder.append(timestamp=1000 + n * 10 + i, key=b"k", value=b"v" * 300, headers=[("a", b"b")])
            builder.close()
            infos = w.append_raw(builder.buffer())
            assert [(i.base_offset, i.last_offset) for i in infos] == [(n * 5, n * 5 + 4)]
    part = tmp_path / "raw-0"
    segments = assert_kafka_index_invariants(part, 100)
    (seg,) = segments
    assert [r.offset for r in seg.records] == list(range(25))
    assert [b.compression.value for b in seg.batches] == [0, 1, 2, 3, 4]
    assert {b.partition_leader_epoch for b in seg.batches} == {4}  # stamped like a leader
    assert all(b.crc_valid for b in seg.batches)
    assert [r[0] for r in _kafka_python_records(part / "00000000000000000000.log")] == list(range(25))
    epochs = parse_leader_epoch_checkpoint((part / "leader-epoch-checkpoint").read_text())
    assert [(e.epoch, e.start_offset) for e in epochs.entries] == [(4, 0)]


def test_append_raw_as_follower_keeps_offsets_and_rejects_going_back(tmp_path: Path) -> None:
    raw = build_batch([_spec(5, 0)], base_offset=10, partition_leader_epoch=2)
    with LogWriter(tmp_path, "f", 0) as w:
        (info,) = w.append_raw(raw, assign_offsets=False)
        assert (info.base_offset, w.log_end_offset) == (10, 11)
        with pytest.raises(InvalidArgumentError):
            w.append_raw(raw, assign_offsets=False)  # offsets never go back
        with pytest.raises(InvalidArgumentError):
            w.append_raw(raw + b"\x00\x01")  # trailing garbage
    (seg,) = _read_partition(tmp_path / "f-0")
    assert seg.batches[0].partition_leader_epoch == 2  # kept, as a follower does


def test_roll_by_bytes(tmp_path: Path) -> None:
    with LogWriter(tmp_path, "r", 0, segment_bytes=2000, index_interval_bytes=300) as w:
        infos = [w.append([_spec(1000 + i, i, 100 + (i * 37) % 200)]) for i in range(80)]
    segments = assert_kafka_index_invariants(tmp_path / "r-0", 300)
    assert len(segments) > 5
    for seg, following in itertools.pairwise(segments):
        assert seg.size <= 2000
        assert seg.size + following.batches[0].size > 2000  # rolled only because the next did not fit
        assert following.base == seg.batches[-1].last_offset + 1
    assert [i.segment_base_offset for i in infos][-1] == segments[-1].base


def test_roll_by_time_uses_record_time_then_clock(tmp_path: Path) -> None:
    clock = FakeClock(10_000)
    with LogWriter(tmp_path, "t", 0, segment_ms=1000, clock=clock) as w:
        w.append([_spec(10_000, 0)])
        w.append([_spec(10_999, 1)])  # age 999: stays
        assert w.segment_base_offsets == [0]
        w.append([_spec(11_001, 2)])  # age 1001 > segment.ms: rolls
        assert w.segment_base_offsets == [0, 2]
        # An out-of-order old timestamp does not roll, whatever the clock says (Kafka uses record time).
        clock.now = 50_000
        w.append([_spec(11_500, 3)])
        assert w.segment_base_offsets == [0, 2]
        # A segment whose first batch has no timestamp ages by the clock since its creation.
        w.roll()
        created = clock.now
        w.append([_spec(-1, 4)])
        clock.now = created + 1000
        w.append([_spec(-1, 5)])
        assert w.segment_base_offsets == [0, 2, 4]
        clock.now = created + 1001
        w.append([_spec(-1, 6)])
        assert w.segment_base_offsets == [0, 2, 4, 6]
    segments = _read_partition(tmp_path / "t-0")
    assert [s.base for s in segments] == [0, 2, 4, 6]
    # Closed segments end their time index with their max timestamp (onBecomeInactiveSegment).
    assert segments[0].timeindex == [(10_999, 1)]
    assert segments[1].timeindex == [(11_500, 3)]
    assert segments[2].timeindex == []  # no timestamps at all


def test_roll_is_noop_on_empty_active_segment(tmp_path: Path) -> None:
    with LogWriter(tmp_path, "e", 0, start_offset=100) as w:
        assert w.roll() == 100
        w.append([_spec(1, 0)])
        assert w.roll() == 101
        assert w.roll() == 101
        # A gap within int32 of the base stays in the segment, as in Kafka ...
        w.append_raw(build_batch([_spec(2, 0)], base_offset=150), assign_offsets=False)
        w.roll()
        # ... one beyond it rolls; the empty active segment is replaced, not left behind.
        far = 151 + 2**31
        w.append_raw(build_batch([_spec(3, 0)], base_offset=far), assign_offsets=False)
    assert [s.base_offset for s in list_segments(tmp_path / "e-0")] == [100, 101, far]


def test_time_index_final_entry_on_close(tmp_path: Path) -> None:
    with LogWriter(tmp_path, "c", 0, index_interval_bytes=10**9) as w:
        w.append([_spec(500, 0), _spec(900, 1)])
        w.append([_spec(700, 2)])
    (seg,) = _read_partition(tmp_path / "c-0")
    assert seg.index == []
    assert seg.timeindex == [(900, 1)]  # offset of the batch holding the max, not the last offset


def test_index_full_rolls(tmp_path: Path) -> None:
    # 24 bytes: the time index holds 2 entries and keeps the last for the roll, so it is full at 1.
    with LogWriter(tmp_path, "full", 0, index_interval_bytes=0, max_index_bytes=24) as w:
        for i in range(6):
            w.append([_spec(100 + i, i)])
    segments = assert_kafka_index_invariants(tmp_path / "full-0", 0)
    assert len(segments) > 1
    assert all(len(s.timeindex) <= 2 and len(s.index) <= 3 for s in segments)


def test_checkpoints_parse_back_and_merge(tmp_path: Path) -> None:
    with (
        LogWriter(tmp_path, "a", 0) as a,
        LogWriter(tmp_path, "b-c.d", 1, topic_id="h21Hd1FxRjC-20k1lF5oYA") as b,
    ):
        for i in range(10):
            a.append([_spec(i, i)])
            b.append([_spec(i, i)])
        a.roll()
        a.append([_spec(20, 20)])
        a.high_watermark = 8
        b.leader_epoch = 3
        b.append([_spec(30, 30)])
        b.log_start_offset = 4
        with pytest.raises(InvalidArgumentError):
            a.high_watermark = 12  # beyond the log end
    hw = parse_offset_checkpoint((tmp_path / "replication-offset-checkpoint").read_text()).entries
    assert hw == {("a", 0): 8, ("b-c.d", 1): 11}
    rp = parse_offset_checkpoint((tmp_path / "recovery-point-offset-checkpoint").read_text()).entries
    assert rp == {("a", 0): 11, ("b-c.d", 1): 11}
    lso = parse_offset_checkpoint((tmp_path / "log-start-offset-checkpoint").read_text()).entries
    assert lso == {("b-c.d", 1): 4}  # Kafka records it only above the first segment's base
    epochs = parse_leader_epoch_checkpoint((tmp_path / "b-c.d-1" / "leader-epoch-checkpoint").read_text())
    assert [(e.epoch, e.start_offset) for e in epochs.entries] == [(0, 0), (3, 10)]
    assert "topic_id: h21Hd1FxRjC-20k1lF5oYA" in (tmp_path / "b-c.d-1" / "partition.metadata").read_text()
    # And discovery sees the same state.
    cps = read_checkpoints(tmp_path)
    parts = {p.name: p for p in discover_partitions([tmp_path])}
    assert set(parts) == {"a-0", "b-c.d-1"}
    assert cps.state_for("a", 0).high_watermark == 8


def test_writer_refuses_existing_segments_and_bad_args(tmp_path: Path) -> None:
    with LogWriter(tmp_path, "x", 0) as w:
        w.append([_spec(1, 1)])
    with pytest.raises(LogDirError):
        LogWriter(tmp_path, "x", 0)
    with pytest.raises(LogDirError):
        LogWriter(tmp_path, "bad/topic", 0)
    with pytest.raises(InvalidArgumentError):
        LogWriter(tmp_path, "y", 0, segment_bytes=1)
    w = LogWriter(tmp_path, "z", 0)
    w.close()
    with pytest.raises(InvalidArgumentError):
        w.append([_spec(1, 1)])


def test_log_append_time_uses_clock(tmp_path: Path) -> None:
    clock = FakeClock(123_456)
    with LogWriter(tmp_path, "lat", 0, clock=clock) as w:
        w.append([_spec(1, 0), _spec(2, 1)], timestamp_type=TimestampType.LOG_APPEND_TIME)
    (seg,) = _read_partition(tmp_path / "lat-0")
    assert [r.timestamp for r in seg.records] == [123_456, 123_456]
    assert seg.timeindex == [(123_456, 1)]


# -- property: index-assisted lookups == brute force ------------------------------------------

_batch = st.tuples(
    st.lists(st.integers(min_value=0, max_value=5_000), min_size=1, max_size=6),  # out-of-order timestamps
    st.integers(min_value=0, max_value=400),  # value size
    st.sampled_from(list(Compression)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(_batch, min_size=1, max_size=30),
    interval=st.integers(min_value=0, max_value=1500),
    segment_bytes=st.integers(min_value=1500, max_value=8000),
    probes=st.lists(st.integers(min_value=-5, max_value=5_010), min_size=1, max_size=15),
    data=st.data(),
)
def test_lookups_match_brute_force(
    batches: list[tuple[list[int], int, Compression]],
    interval: int,
    segment_bytes: int,
    probes: list[int],
    data: st.DataObject,
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        with LogWriter(tmp, "p", 0, segment_bytes=segment_bytes, index_interval_bytes=interval) as w:
            n = 0
            for stamps, size, codec in batches:
                w.append([_spec(ts, n + i, size) for i, ts in enumerate(stamps)], compression=codec)
                n += len(stamps)
        part = Path(tmp) / "p-0"
        assert_kafka_index_invariants(part, interval)
        for files in list_segments(part):
            with LogSegment.open(files) as seg:
                all_batches = list(seg.batches())
                records = [(r, b) for b in all_batches for r in seg.read_records(b)]
                first, last = records[0][0].offset, records[-1][0].offset
                for ts in probes:
                    start = data.draw(st.integers(min_value=first - 2, max_value=last + 1), label="start")
                    want = next(((r, b) for r, b in records if r.timestamp >= ts and r.offset >= start), None)
                    got = seg.find_offset_by_timestamp(ts, start)
                    if want is None:
                        assert got is None
                    else:
                        assert got is not None
                        assert (got.offset, got.timestamp, got.batch.position) == (
                            want[0].offset,
                            want[0].timestamp,
                            want[1].position,
                        )
                for offset in range(first - 1, last + 2):
                    want_batch = next((b for b in all_batches if b.last_offset >= offset), None)
                    assert seg.find_batch(offset) == want_batch


def test_a_rolled_segments_time_index_entry_at_timestamp_zero_is_an_entry(tmp_path: Path) -> None:
    """Found by the property above: a segment rolled after one batch stamped 0 has the single
    time index entry (0, relative offset 0) — twelve zero bytes, like a preallocated slot. In a
    rolled (trimmed) index it is an entry, and Kafka's invariants hold."""
    with LogWriter(tmp_path, "p", 0, segment_bytes=1500, index_interval_bytes=1260) as w:
        w.append([_spec(0, 0, 74)], compression=Compression.SNAPPY)
        w.append([_spec(ts, 1 + i, 343) for i, ts in enumerate([302, 1338, 363, 1233])])
    segments = assert_kafka_index_invariants(tmp_path / "p-0", 1260)
    assert len(segments) == 2 and segments[0].timeindex == [(0, 0)]
