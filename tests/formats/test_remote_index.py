from __future__ import annotations

import itertools
import struct
import zlib
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlm.errors import CorruptIndexError, CorruptRemoteIndexError, InvalidArgumentError, UnsupportedMagicError
from rlm.formats.indexes.offset_index import INT32_MAX, OffsetIndex, OffsetPosition
from rlm.formats.indexes.remote_index import (
    ENTRY_HEADER_SIZE,
    RemoteDataIdentifier,
    RemoteLogIndexEntry,
    build_entries,
    decode_entry,
    iter_entries,
    scan_entries,
)
from rlm.formats.indexes.remote_index_derived import (
    RemoteIndexSetBuilder,
    derive_remote_indexes,
    find_entry_for_offset,
    find_entry_for_timestamp,
)
from rlm.formats.indexes.time_index import TimeIndex, TimestampOffset

URL = "s3://bkt/pfx/orders-3/00000000000000001000-abc.log"


@dataclass(frozen=True, slots=True)
class FakeBatch:
    """Stand-in with the RecordBatch attributes build_entries may use."""

    position: int
    size: int
    base_offset: int
    last_offset: int
    base_timestamp: int
    max_timestamp: int
    magic: int = 2


def entry(
    first: int, last: int, last_ts: int = 100, *, pos: int = 0, length: int = 50
) -> RemoteLogIndexEntry:
    return RemoteLogIndexEntry(first, last, last_ts - 5, last_ts, length, RemoteDataIdentifier(URL, pos))


def test_encode_layout_matches_formats_4_1() -> None:
    e = RemoteLogIndexEntry(1000, 1012, 111, 222, 4096, RemoteDataIdentifier("u#x", 65536))
    data = e.encode()
    rdi = b"u#x#65536"
    assert len(data) == ENTRY_HEADER_SIZE + len(rdi) == 46 + 9
    magic, length, crc = struct.unpack_from(">hhI", data)
    assert (magic, length) == (0, 42 + len(rdi))
    assert crc == zlib.crc32(data[8:])
    assert struct.unpack_from(">qqqqih", data, 8) == (1000, 1012, 111, 222, 4096, len(rdi))
    assert data[46:] == rdi
    assert e.byte_range == (65536, 65536 + 4096)


def test_rdi_parse_uses_last_hash() -> None:
    rdi = RemoteDataIdentifier.parse("s3://b/k#frag/x.log#123")
    assert rdi == RemoteDataIdentifier("s3://b/k#frag/x.log", 123)
    assert str(rdi) == "s3://b/k#frag/x.log#123"
    for bad in ("s3://b/k", "s3://b/k#", "s3://b/k#-1", "s3://b/k#1a", "#5"):
        with pytest.raises(InvalidArgumentError):
            RemoteDataIdentifier.parse(bad)


url_strategy = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)


@given(
    url=url_strategy,
    pos=st.integers(0, 2**63 - 1),
    first=st.integers(0, 2**62),
    span=st.integers(0, 2**20),
    ts=st.tuples(st.integers(-1, 2**62), st.integers(-1, 2**62)),
    length=st.integers(1, INT32_MAX),
)
def test_entry_round_trip(
    url: str, pos: int, first: int, span: int, ts: tuple[int, int], length: int
) -> None:
    e = RemoteLogIndexEntry(first, first + span, ts[0], ts[1], length, RemoteDataIdentifier(url, pos))
    data = e.encode()
    decoded = decode_entry(b"xx" + data, 2)
    assert decoded.entry == e
    assert (decoded.position, decoded.size) == (2, len(data))
    assert RemoteDataIdentifier.parse(str(e.rdi)) == e.rdi


def test_entry_field_validation() -> None:
    with pytest.raises(InvalidArgumentError):
        entry(10, 9)
    with pytest.raises(InvalidArgumentError):
        entry(10, 12, length=0)
    with pytest.raises(InvalidArgumentError):
        RemoteLogIndexEntry(1, 2, 0, 0, 1, RemoteDataIdentifier(URL, 0), magic=1)
    with pytest.raises(InvalidArgumentError):
        RemoteLogIndexEntry(1, 2, 0, 0, 1, RemoteDataIdentifier("x" * 40_000, 0))


def three_entries() -> tuple[bytes, list[int]]:
    parts = [entry(100, 109).encode(), entry(110, 130).encode(), entry(140, 150).encode()]
    positions = [0, len(parts[0]), len(parts[0]) + len(parts[1])]
    return b"".join(parts), positions


def test_iter_entries_positions() -> None:
    buf, positions = three_entries()
    assert [d.position for d in iter_entries(buf)] == positions
    assert [d.position for d in iter_entries(buf, positions[1])] == positions[1:]


def corrupt(buf: bytes, at: int, value: bytes) -> bytes:
    return buf[:at] + value + buf[at + len(value) :]


def test_bad_crc_detected_on_read() -> None:
    buf, positions = three_entries()
    bad = corrupt(buf, positions[1] + 20, b"\xff")  # a byte of lastOffset
    with pytest.raises(CorruptRemoteIndexError, match="CRC") as err:
        list(iter_entries(bad))
    assert err.value.position == positions[1]
    scan = scan_entries(bad)
    assert [d.position for d in scan.entries] == positions[:1]
    assert scan.valid_length == positions[1]
    assert isinstance(scan.error, CorruptRemoteIndexError)


def test_bad_magic_names_the_value() -> None:
    buf, positions = three_entries()
    bad = corrupt(buf, positions[2], struct.pack(">h", 7))
    with pytest.raises(UnsupportedMagicError, match="magic 7") as err:
        list(iter_entries(bad))
    assert err.value.position == positions[2]
    scan = scan_entries(bad)
    assert len(scan.entries) == 2
    assert scan.valid_length == positions[2]
    assert isinstance(scan.error, UnsupportedMagicError)


@pytest.mark.parametrize("length", [0, 41, -3])
def test_bad_length(length: int) -> None:
    buf, positions = three_entries()
    bad = corrupt(buf, positions[1] + 2, struct.pack(">h", length))
    with pytest.raises(CorruptRemoteIndexError, match="length") as err:
        list(iter_entries(bad))
    assert err.value.position == positions[1]
    assert scan_entries(bad).valid_length == positions[1]


def test_length_disagreeing_with_rdi_length() -> None:
    e = entry(1, 2).encode()
    bad = corrupt(e, 44, struct.pack(">h", 3))
    with pytest.raises(CorruptRemoteIndexError, match="rdiLength"):
        decode_entry(bad, 0)


@pytest.mark.parametrize("cut", [1, 3, 10, 45, 47])
def test_torn_tail(cut: int) -> None:
    buf, positions = three_entries()
    torn = buf[: positions[2] + cut]
    with pytest.raises(CorruptRemoteIndexError, match="truncated") as err:
        list(iter_entries(torn))
    assert err.value.position == positions[2]
    scan = scan_entries(torn)
    assert (len(scan.entries), scan.valid_length) == (2, positions[2])


def test_scan_of_valid_file_has_no_error() -> None:
    buf, _ = three_entries()
    scan = scan_entries(buf)
    assert (len(scan.entries), scan.valid_length, scan.error) == (3, len(buf), None)
    assert scan_entries(b"") == scan_entries(b"")
    assert scan_entries(b"").valid_length == 0


def test_crc_valid_entry_with_bad_fields_is_corrupt() -> None:
    data = bytearray(entry(1, 2).encode())
    struct.pack_into(">q", data, 16, 0)  # lastOffset < firstOffset
    struct.pack_into(">I", data, 4, zlib.crc32(data[8:]))
    with pytest.raises(CorruptRemoteIndexError, match="invalid entry"):
        decode_entry(data, 0)


def test_entries_out_of_order_are_corrupt() -> None:
    buf = entry(100, 120).encode() + entry(120, 130).encode()
    with pytest.raises(CorruptRemoteIndexError, match="not after"):
        list(iter_entries(buf))


# -- build_entries --------------------------------------------------------------------------------


def batches_of(sizes: list[int], *, start_pos: int = 0, base: int = 0) -> list[FakeBatch]:
    out, pos, off = [], start_pos, base
    for i, size in enumerate(sizes):
        out.append(FakeBatch(pos, size, off, off + 2, 1000 + i, 1000 + i + 1))
        pos, off = pos + size, off + 3
    return out


def test_build_entries_packs_up_to_limit() -> None:
    batches = batches_of([40, 40, 30, 50, 120, 10])
    entries = build_entries(batches, object_url=URL, index_entry_bytes=110)
    assert [(e.rdi.position, e.data_length) for e in entries] == [(0, 110), (110, 50), (160, 120), (280, 10)]
    assert [(e.first_offset, e.last_offset) for e in entries] == [(0, 8), (9, 11), (12, 14), (15, 17)]
    assert all(e.rdi.url == URL for e in entries)


def test_build_entries_last_timestamp_is_max_and_first_is_base() -> None:
    batches = [
        FakeBatch(0, 10, 0, 0, 500, 900),
        FakeBatch(10, 10, 1, 1, 100, 200),  # out-of-order timestamps: last batch is not the max
    ]
    (e,) = build_entries(batches, object_url=URL, index_entry_bytes=1 << 20)
    assert (e.first_timestamp, e.last_timestamp) == (500, 900)


def test_build_entries_legacy_first_timestamp_is_minus_one() -> None:
    batches = [FakeBatch(0, 10, 0, 0, 1234, 1234, magic=1), FakeBatch(10, 10, 1, 1, -1, -1, magic=0)]
    (e,) = build_entries(batches, object_url=URL, index_entry_bytes=100)
    assert (e.first_timestamp, e.last_timestamp) == (-1, 1234)


def test_build_entries_rdi_relative_to_segment_start() -> None:
    entries = build_entries(
        batches_of([30, 30], start_pos=1000),
        object_url=URL,
        index_entry_bytes=30,
        segment_start_position=1000,
    )
    assert [e.byte_range for e in entries] == [(0, 30), (30, 60)]


def test_build_entries_rejects_gaps_and_bad_limits() -> None:
    gap = [FakeBatch(0, 10, 0, 0, 1, 1), FakeBatch(11, 10, 1, 1, 1, 1)]
    with pytest.raises(InvalidArgumentError, match="does not follow"):
        build_entries(gap, object_url=URL, index_entry_bytes=100)
    overlap = [FakeBatch(0, 10, 0, 5, 1, 1), FakeBatch(10, 10, 5, 6, 1, 1)]
    with pytest.raises(InvalidArgumentError, match="not after"):
        build_entries(overlap, object_url=URL, index_entry_bytes=100)
    with pytest.raises(InvalidArgumentError):
        build_entries([], object_url=URL, index_entry_bytes=0)
    assert build_entries([], object_url=URL, index_entry_bytes=10) == []


@given(st.lists(st.integers(61, 3000), min_size=1, max_size=40), st.integers(1, 5000))
def test_build_entries_properties(sizes: list[int], limit: int) -> None:
    batches = batches_of(sizes, start_pos=7)
    entries = build_entries(batches, object_url=URL, index_entry_bytes=limit, segment_start_position=7)
    # Contiguous, covering [0, total) exactly, never exceeding the limit unless a single batch.
    assert entries[0].rdi.position == 0
    for a, b in itertools.pairwise(entries):
        assert a.byte_range[1] == b.rdi.position
        assert a.last_offset + 1 == b.first_offset
    assert entries[-1].byte_range[1] == sum(sizes)
    starts = {b.position - 7: b for b in batches}
    for e in entries:
        first = starts[e.rdi.position]
        covered = [b for b in batches if e.rdi.position <= b.position - 7 < e.byte_range[1]]
        assert covered[0] is first
        assert e.data_length <= limit or len(covered) == 1
        assert e.last_timestamp == max(b.max_timestamp for b in covered)
        # Greedy: the next batch would not have fitted.
        following = [b for b in batches if b.position - 7 == e.byte_range[1]]
        if following:
            assert e.data_length + following[0].size > limit


# -- the set: derived indexes and lookups ---------------------------------------------------------


def test_set_builder_and_derived_bytes_agree() -> None:
    entries = [entry(1000, 1009, 50), entry(1010, 1019, 40), entry(1025, 1030, 70), entry(1031, 1040, 70)]
    builder = RemoteIndexSetBuilder(1000)
    appended = [builder.append(e) for e in entries]
    log = b"".join(a.log_index for a in appended)
    assert [a.position for a in appended] == [d.position for d in iter_entries(log)]
    # Time index grows only when the running max strictly grows: 50, (40 no), 70, (70 no).
    assert [bool(a.time_index) for a in appended] == [True, False, True, False]
    offset_bytes, time_bytes = derive_remote_indexes(log, 1000)
    assert offset_bytes == builder.offset_index_bytes() == b"".join(a.offset_index for a in appended)
    assert time_bytes == builder.time_index_bytes() == b"".join(a.time_index for a in appended)
    first = OffsetIndex(1000, offset_bytes, preallocated=False)[0]
    assert first == OffsetPosition(1000, 0)  # first entry (0, 0) is real
    times = list(TimeIndex(1000, time_bytes, preallocated=False))
    assert times == [TimestampOffset(50, 1009), TimestampOffset(70, 1030)]
    replay = RemoteIndexSetBuilder.from_log_index(log, 1000)
    assert replay.offset_index_bytes() == offset_bytes
    assert replay.log_index_size == len(log)


def test_torn_tail_repair_flow() -> None:
    entries = [entry(0, 9), entry(10, 19), entry(20, 29)]
    log = b"".join(e.encode() for e in entries)
    torn = log + entry(30, 39).encode()[:20]
    scan = scan_entries(torn)
    assert scan.valid_length == len(log)
    assert derive_remote_indexes(torn[: scan.valid_length], 0) == derive_remote_indexes(log, 0)
    with pytest.raises(CorruptRemoteIndexError):
        derive_remote_indexes(torn, 0)


def test_set_builder_int32_guards() -> None:
    builder = RemoteIndexSetBuilder(0)
    assert not builder.fits(entry(0, INT32_MAX + 1))
    with pytest.raises(InvalidArgumentError, match="rotate"):
        builder.append(entry(0, INT32_MAX + 1))
    builder.append(entry(0, 5))
    with pytest.raises(InvalidArgumentError, match="not after"):
        builder.append(entry(5, 6))
    below = RemoteIndexSetBuilder(100)
    assert not below.fits(entry(99, 120))


def open_set(entries: list[RemoteLogIndexEntry], base: int) -> tuple[OffsetIndex, TimeIndex, bytes]:
    builder = RemoteIndexSetBuilder(base)
    log = b"".join(builder.append(e).log_index for e in entries)
    return (
        OffsetIndex(base, builder.offset_index_bytes(), preallocated=False),
        TimeIndex(base, builder.time_index_bytes(), preallocated=False),
        log,
    )


def test_offset_lookup_gap_and_bounds() -> None:
    entries = [entry(100, 109), entry(120, 130), entry(131, 131)]
    oi, _, log = open_set(entries, 100)
    assert find_entry_for_offset(oi, log, 100).entry == entries[0]  # type: ignore[union-attr]
    assert find_entry_for_offset(oi, log, 109).entry == entries[0]  # type: ignore[union-attr]
    assert find_entry_for_offset(oi, log, 115).entry == entries[1]  # type: ignore[union-attr]  # gap → next
    assert find_entry_for_offset(oi, log, 131).entry == entries[2]  # type: ignore[union-attr]
    assert find_entry_for_offset(oi, log, 50).entry == entries[0]  # type: ignore[union-attr]  # before set
    assert find_entry_for_offset(oi, log, 132) is None
    assert find_entry_for_offset(OffsetIndex(0, b""), b"", 5) is None


def test_offset_lookup_detects_disagreeing_files() -> None:
    _oi, _, log = open_set([entry(100, 109), entry(120, 130)], 100)
    other = OffsetIndex(100, bytes(OffsetIndex.ENTRY_SIZE) + struct.pack(">ii", 19, 0), preallocated=False)
    with pytest.raises(CorruptIndexError, match="disagree"):
        find_entry_for_offset(other, log, 125)


def test_timestamp_lookup_rejects_negative() -> None:
    oi, ti, log = open_set([entry(0, 1)], 0)
    with pytest.raises(InvalidArgumentError):
        find_entry_for_timestamp(ti, oi, log, -1)


@st.composite
def entry_lists(draw: st.DrawFn) -> list[RemoteLogIndexEntry]:
    count = draw(st.integers(1, 25))
    offset = draw(st.integers(0, 10**6))
    out = []
    for _ in range(count):
        offset += draw(st.integers(0, 20))  # gap before the entry (compaction)
        span = draw(st.integers(0, 30))
        last_ts = draw(st.integers(-1, 300))  # out of order on purpose; -1 = no timestamp (v0)
        out.append(RemoteLogIndexEntry(offset, offset + span, -1, last_ts, 10, RemoteDataIdentifier(URL, 0)))
        offset += span + 1
    return out


@given(entry_lists(), st.integers(0, 10**6 + 2000))
def test_offset_lookup_matches_brute_force(entries: list[RemoteLogIndexEntry], target: int) -> None:
    oi, _, log = open_set(entries, entries[0].first_offset)
    expected = next((e for e in entries if e.last_offset >= target), None)
    found = find_entry_for_offset(oi, log, target)
    assert (found.entry if found else None) == expected


@given(entry_lists(), st.data())
def test_timestamp_lookup_matches_brute_force(
    entries: list[RemoteLogIndexEntry], data: st.DataObject
) -> None:
    oi, ti, log = open_set(entries, entries[0].first_offset)
    candidates = [0, 301] + [e.last_timestamp + d for e in entries for d in (-1, 0, 1)]
    target = data.draw(st.sampled_from([c for c in candidates if c >= 0]))
    expected = next((e for e in entries if e.last_timestamp >= target), None)
    found = find_entry_for_timestamp(ti, oi, log, target)
    assert (found.entry if found else None) == expected
