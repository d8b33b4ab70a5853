"""Property test: generated partitions (LogWriter) with out-of-order CreateTime timestamps, random
batch sizes and codecs, random segment sizes, index intervals and remote-index entry/rotation sizes,
tiered by RemoteLogManager to the memory backend, the oldest local segments then deleted.

For random offsets and timestamps, PartitionReader must equal a brute-force scan of the records as
they were written (offset: the first record offset ≥ X, not found before the log start or at/after
the log end; timestamp: the first record in offset order with ts ≥ T, or not found), including the
special timestamps −1…−5, and fetches must follow Kafka's fetch semantics from either tier.
Which tier answers: offsets are local iff ≥ local_log_start; timestamps search the remote tier
first (Kafka's ListOffsets), so they are remote iff ≤ highest_tiered_offset.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from rlm.formats.compression import Compression
from rlm.formats.records import Record, decode_records, iter_batches
from rlm.logdir.discovery import discover_partitions, list_segments
from rlm.logdir.writer import LogWriter
from rlm.storage.memory import MemoryBackend
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read.lookup import PartitionReader
from rlm.tiering.read.readers import TieredReaders
from tests.lookup.helpers import BruteLog, BruteRecord, delete_local_segments, expected_fetch, settings_for

CODECS = [Compression.NONE, Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD]
T0 = 1_700_000_000_000


@dataclass
class Spec:
    start_offset: int
    batches: list[tuple[int, list[tuple[int, int]]]]  # (codec index, [(offset step, ts delta)])
    segment_bytes: int
    index_interval_bytes: int
    index_entry_bytes: int
    index_rotate_bytes: int
    delete_segments: int


batch_st = st.tuples(
    st.integers(0, len(CODECS) - 1),
    st.lists(
        st.tuples(
            st.sampled_from([1, 1, 1, 2, 5]),  # offset gaps, as compaction leaves
            st.integers(-5_000, 20_000),
        ),
        min_size=1,
        max_size=12,
    ),
)
spec_st = st.builds(
    Spec,
    start_offset=st.sampled_from([0, 0, 17, 1_000_000]),
    batches=st.lists(batch_st, min_size=3, max_size=40),
    segment_bytes=st.integers(150, 1_500),
    index_interval_bytes=st.integers(0, 1_500),
    index_entry_bytes=st.integers(1, 2_500),
    index_rotate_bytes=st.integers(1, 1_500),
    delete_segments=st.integers(0, 50),
)


def _write(spec: Spec, log_dir: Path) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Write the partition; return its records as written (the independent truth)."""
    out: list[tuple[int, int, bytes | None, bytes | None]] = []
    offset, ts = spec.start_offset, T0
    with LogWriter(
        log_dir,
        "prop",
        0,
        segment_bytes=spec.segment_bytes,
        index_interval_bytes=spec.index_interval_bytes,
        start_offset=spec.start_offset,
        clock=lambda: T0,
    ) as w:
        for codec, recs in spec.batches:
            records = []
            offset = max(offset, w.log_end_offset)
            for i, (step, delta) in enumerate(recs):
                offset += step if (records or i) else 0
                ts = max(0, ts + delta)
                records.append(Record(offset, ts, f"k{offset}".encode(), b"v" * (offset % 50)))
            offset += 1
            w.append(records, compression=CODECS[codec])
            out.extend((r.offset, r.timestamp, r.key, r.value) for r in records)
    return out


def _queries(data: st.DataObject, lo: int, hi: int, label: str) -> list[int]:
    edges = [lo, hi, lo - 1, hi + 1]
    return [q for q in edges if q >= 0] + data.draw(
        st.lists(st.integers(max(0, lo - 3), hi + 3), min_size=5, max_size=15), label=label
    )


@settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate),  # no shrinking: a failure reports at once
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(spec=spec_st, data=st.data())
def test_lookups_equal_brute_force(spec: Spec, data: st.DataObject) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="rlm-prop-"))
    try:
        _check(spec, data, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass
class Tiered:
    """A generated partition after tiering and local deletion, with the brute-force truth."""

    reader: PartitionReader
    brute: BruteLog
    written: list[BruteRecord]
    start_offset: int
    log_end: int
    local_start: int  # the first local segment's base offset
    highest_tiered: int  # -1 when nothing was tiered


def _check(spec: Spec, data: st.DataObject, tmp: Path) -> None:
    log_dir = tmp / "logs"
    part = _tier_and_delete(spec, log_dir, tmp)
    _check_offsets(part, data)
    _check_timestamps(part, data)
    _check_special_timestamps(part)
    _check_fetches(part, data)
    assert discover_partitions([log_dir])[0].name == "prop-0"
    assert isinstance(part.reader, PartitionReader)


def _tier_and_delete(spec: Spec, log_dir: Path, tmp: Path) -> Tiered:
    """Writes the spec, tiers it to a memory backend, deletes the oldest local segments and checks
    the reader's ranges against what was written."""
    truth = _write(spec, log_dir)
    brute = BruteLog.scan(log_dir / "prop-0")
    written = brute.records
    assert [(r.offset, r.timestamp, r.key, r.value) for r in written] == truth
    settings_ = settings_for(
        [log_dir],
        backend="memory",
        state_dir=str(tmp / "state"),
        index_entry_bytes=spec.index_entry_bytes,
        index_rotate_bytes=spec.index_rotate_bytes,
    )
    backend = MemoryBackend()
    results = RemoteLogManager(settings_, backend).run_once()
    assert all(r.error is None for r in results), results
    segments = list_segments(log_dir / "prop-0")
    rolled = len(segments) - 1
    n_delete = min(spec.delete_segments % (rolled + 1), rolled)
    delete_local_segments(log_dir / "prop-0", keep_last=len(segments) - n_delete)

    reader = TieredReaders(settings_, backend).reader("prop", 0)
    ranges = reader.offsets()
    log_end = written[-1].offset + 1
    tiered = [b for b in brute.batches if b.segment_base != segments[-1].base_offset]
    highest_tiered = tiered[-1].batch.last_offset if tiered else -1
    local_start = segments[n_delete].base_offset
    assert ranges.log_end_offset == log_end
    assert ranges.highest_tiered_offset == highest_tiered
    assert ranges.local_log_start_offset == local_start
    assert ranges.log_start_offset == spec.start_offset
    assert ranges.remote_log_start_offset == (spec.start_offset if tiered else None)
    return Tiered(reader, brute, written, spec.start_offset, log_end, local_start, highest_tiered)


def _check_offsets(part: Tiered, data: st.DataObject) -> None:
    """Offsets: the first record offset >= X, or not found outside [log start, log end)."""
    for x in _queries(data, part.start_offset, part.log_end, "offsets"):
        got = part.reader.lookup_offset(x)
        want = part.brute.first_offset_ge(x) if part.start_offset <= x < part.log_end else None
        if want is None:
            assert not got.found, (x, got)
            continue
        assert got.found and got.offset == want.offset and got.timestamp == want.timestamp, (x, got, want)
        assert got.batch is not None and (got.batch.base_offset, got.batch.last_offset) == (
            want.batch_base,
            want.batch_last,
        )
        assert got.tier == ("local" if want.offset >= part.local_start else "remote"), (
            x,
            got,
            part.local_start,
        )


def _check_timestamps(part: Tiered, data: st.DataObject) -> None:
    """Timestamps: the first record in offset order with ts >= T."""
    ts_all = sorted({r.timestamp for r in part.written})
    ts_queries = [
        ts_all[0] - 1,
        ts_all[-1],
        ts_all[-1] + 1,
        *data.draw(
            st.lists(
                st.sampled_from(ts_all) | st.integers(ts_all[0] - 10, ts_all[-1] + 10),
                min_size=5,
                max_size=15,
            ),
            label="timestamps",
        ),
    ]
    for t in ts_queries:
        got = part.reader.lookup_timestamp(t)
        want = part.brute.first_ts_ge(t)
        if want is None:
            assert not got.found, (t, got)
            continue
        assert got.found and got.offset == want.offset and got.timestamp == want.timestamp, (t, got, want)
        assert got.tier == ("remote" if want.offset <= part.highest_tiered else "local"), (t, got)


def _check_special_timestamps(part: Tiered) -> None:
    """-1 latest, -2 earliest, -3 max timestamp, -4 earliest local, -5 latest tiered."""
    reader, written, local_start, highest_tiered = (
        part.reader,
        part.written,
        part.local_start,
        part.highest_tiered,
    )
    latest = reader.lookup_timestamp(-1)
    assert latest.found and latest.offset == part.log_end
    earliest = reader.lookup_timestamp(-2)
    assert earliest.found and earliest.offset == written[0].offset
    assert earliest.tier == ("remote" if written[0].offset < local_start else "local")
    max_ts = max(r.timestamp for r in written)
    top = reader.lookup_timestamp(-3)
    assert top.found and top.timestamp == max_ts
    assert top.offset == next(r.offset for r in written if r.timestamp == max_ts)
    early_local = reader.lookup_timestamp(-4)
    local_first = part.brute.first_offset_ge(local_start)
    if local_first is None:  # only the empty active segment is local
        assert not early_local.found
    else:
        assert early_local.found and early_local.tier == "local" and early_local.offset == local_first.offset
    latest_tiered = reader.lookup_timestamp(-5)
    if highest_tiered < 0:
        assert not latest_tiered.found
    else:
        last_tiered_record = [r for r in written if r.offset <= highest_tiered][-1]
        assert latest_tiered.found and latest_tiered.tier == "remote"
        assert latest_tiered.offset == last_tiered_record.offset == highest_tiered


def _check_fetches(part: Tiered, data: st.DataObject) -> None:
    """Fetch: from the batch holding X, whole batches up to max_bytes (at least one), one segment."""
    for x in data.draw(
        st.lists(st.integers(part.start_offset, part.log_end - 1), min_size=1, max_size=4),
        label="fetch offsets",
    ):
        max_bytes = data.draw(st.integers(1, 4_000), label="max_bytes")
        fetched = part.reader.fetch(x, max_bytes)
        want_batches = expected_fetch(part.brute, x, max_bytes)
        assert fetched.data == b"".join(b.data for b in want_batches), (x, max_bytes)
        parsed = list(iter_batches(fetched.data))
        assert [(b.base_offset, b.last_offset) for b in parsed] == [
            (b.batch.base_offset, b.batch.last_offset) for b in want_batches
        ]
        decoded = [
            (r.offset, r.timestamp, r.key, r.value) for b in parsed for r in decode_records(fetched.data, b)
        ]
        lo, hi = want_batches[0].batch.base_offset, want_batches[-1].batch.last_offset
        assert decoded == [
            (r.offset, r.timestamp, r.key, r.value) for r in part.written if lo <= r.offset <= hi
        ]
        answer = part.brute.first_offset_ge(x)
        assert answer is not None
        assert fetched.tier == ("local" if answer.offset >= part.local_start else "remote")
        assert fetched.next_offset == hi + 1
