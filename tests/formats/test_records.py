"""Record batches built by rlm: header fields, record round trips, torn tails and corruption."""

from __future__ import annotations

import mmap
import struct
import zlib

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlm.errors import CompressionError, CorruptRecordError, InvalidArgumentError, UnsupportedMagicError
from rlm.formats.compression import Compression, compress
from rlm.formats.records import (
    ControlRecord,
    ControlRecordType,
    Header,
    Record,
    RecordBatch,
    RecordSpec,
    TimestampType,
    build_batch,
    decode_records,
    encode_control_key,
    encode_end_txn_marker,
    iter_batches,
    parse_control_record,
    valid_bytes,
)

T0 = 1_700_000_000_000


def specs(n: int, *, start_ts: int = T0) -> list[RecordSpec]:
    return [
        RecordSpec(
            timestamp=start_ts + (i * 7) % 5,  # out of order on purpose: maxTimestamp ≠ last
            key=None if i % 3 == 0 else f"k{i}".encode(),
            value=None if i % 4 == 1 else b"v" * i,
            headers=(Header("h", b"x"), Header("null", None)) if i % 2 else (),
        )
        for i in range(n)
    ]


def test_v2_header_fields_match_kafka_layout() -> None:
    raw = build_batch(
        specs(5),
        base_offset=1000,
        producer_id=42,
        producer_epoch=3,
        base_sequence=17,
        partition_leader_epoch=9,
        is_transactional=True,
    )
    (base, length, ple, magic, crc, attrs, lod, base_ts, max_ts, pid, epoch, seq, count) = struct.unpack_from(
        ">qiibIhiqqqhii", raw
    )
    assert (base, length, ple, magic) == (1000, len(raw) - 12, 9, 2)
    assert crc == crc32c.crc32c(raw[21:])
    assert attrs == 0x10
    assert (lod, count) == (4, 5)
    assert (base_ts, max_ts) == (T0, T0 + 4)
    assert (pid, epoch, seq) == (42, 3, 17)

    (batch,) = iter_batches(raw)
    assert batch == RecordBatch(
        position=0,
        size=len(raw),
        base_offset=1000,
        last_offset=1004,
        magic=2,
        crc=crc,
        crc_valid=True,
        compression=Compression.NONE,
        timestamp_type=TimestampType.CREATE_TIME,
        base_timestamp=T0,
        max_timestamp=T0 + 4,
        producer_id=42,
        producer_epoch=3,
        base_sequence=17,
        partition_leader_epoch=9,
        is_transactional=True,
        is_control=False,
        record_count=5,
        attributes=0x10,
    )
    assert batch.next_offset == 1005
    assert batch.end_position == len(raw)
    assert not batch.has_delete_horizon


@pytest.mark.parametrize("codec", list(Compression))
def test_records_round_trip_all_codecs(codec: Compression) -> None:
    recs = specs(30)
    raw = build_batch(recs, base_offset=77, compression=codec)
    (batch,) = iter_batches(raw)
    assert batch.compression is codec
    out = decode_records(raw, batch)
    assert [r.offset for r in out] == list(range(77, 107))
    assert [(r.timestamp, r.key, r.value, r.headers) for r in out] == [
        (s.timestamp, s.key, s.value, s.headers) for s in recs
    ]


def test_snappy_framing_choice() -> None:
    xerial = build_batch(specs(3), base_offset=0, compression=Compression.SNAPPY)
    raw = build_batch(specs(3), base_offset=0, compression=Compression.SNAPPY, snappy_xerial=False)
    assert xerial[61:69] == b"\x82SNAPPY\x00"
    assert raw[61:69] != b"\x82SNAPPY\x00"
    assert decode_records(raw, next(iter_batches(raw))) == decode_records(xerial, next(iter_batches(xerial)))


def test_log_append_time_gives_every_record_the_batch_max_timestamp() -> None:
    raw = build_batch(
        specs(4), base_offset=0, timestamp_type=TimestampType.LOG_APPEND_TIME, log_append_time=T0 + 999
    )
    (batch,) = iter_batches(raw)
    assert batch.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert batch.attributes & 0x08
    assert batch.max_timestamp == T0 + 999
    assert {r.timestamp for r in decode_records(raw, batch)} == {T0 + 999}
    with pytest.raises(InvalidArgumentError):
        build_batch(specs(1), base_offset=0, timestamp_type=TimestampType.LOG_APPEND_TIME)


def test_sparse_offsets_after_compaction() -> None:
    # Mirrors __consumer_offsets-19 @551: base 258466, last 258515, records 258480/258496/258515.
    recs = [Record(o, T0, b"k", b"v") for o in (258480, 258496, 258515)]
    raw = build_batch(recs, base_offset=258466)
    (batch,) = iter_batches(raw)
    assert (batch.base_offset, batch.last_offset, batch.record_count) == (258466, 258515, 3)
    assert [r.offset for r in decode_records(raw, batch)] == [258480, 258496, 258515]
    with pytest.raises(InvalidArgumentError):
        build_batch([Record(5, T0, None, None), Record(5, T0, None, None)], base_offset=0)
    with pytest.raises(InvalidArgumentError):
        build_batch([Record(4, T0, None, None)], base_offset=5)


def test_empty_batch_after_compaction_is_header_only() -> None:
    raw = build_batch([], base_offset=500, last_offset=520, max_timestamp=T0, producer_id=7, producer_epoch=1)
    assert len(raw) == 61
    (batch,) = iter_batches(raw)
    assert (batch.base_offset, batch.last_offset, batch.record_count) == (500, 520, 0)
    assert (batch.base_timestamp, batch.max_timestamp) == (T0, T0)
    assert decode_records(raw, batch) == []


def test_control_batch_commit_marker() -> None:
    ctrl = Record(10, T0, encode_control_key(ControlRecordType.COMMIT), encode_end_txn_marker(5))
    raw = build_batch(
        [ctrl], base_offset=10, producer_id=1, producer_epoch=0, is_transactional=True, is_control=True
    )
    (batch,) = iter_batches(raw)
    assert batch.is_control and batch.is_transactional
    assert batch.attributes == 0x30
    (rec,) = decode_records(raw, batch)
    assert rec.key == b"\x00\x00\x00\x01"
    assert rec.value == b"\x00\x00\x00\x00\x00\x05"
    marker = parse_control_record(rec)
    assert marker == ControlRecord(version=0, type=1)
    assert marker.type_name == "COMMIT"
    assert ControlRecord(0, 2).type_name == "LEADER_CHANGE"
    assert ControlRecord(0, 99).type_name == "UNKNOWN(99)"


@pytest.mark.parametrize("key", [None, b"", b"\x00\x00\x01"])
def test_short_control_key_is_corrupt(key: bytes | None) -> None:
    with pytest.raises(CorruptRecordError) as info:
        parse_control_record(Record(3, T0, key, None))
    assert info.value.offset == 3


def test_unicode_header_keys() -> None:
    recs = [RecordSpec(T0, b"k", b"v", (Header("ключ-🔑", b"\x00\xff"),))]
    raw = build_batch(recs, base_offset=0)
    assert decode_records(raw, next(iter_batches(raw)))[0].headers == (Header("ключ-🔑", b"\x00\xff"),)


# --- iteration over several batches --------------------------------------------------------------


def log_of(n_batches: int) -> tuple[bytes, list[int]]:
    parts: list[bytes] = []
    positions: list[int] = []
    pos = 0
    for i in range(n_batches):
        b = build_batch(specs(3 + i), base_offset=100 * i, compression=Compression(i % 5))
        positions.append(pos)
        parts.append(b)
        pos += len(b)
    return b"".join(parts), positions


def test_iterates_positions_and_honours_start_and_end() -> None:
    log, positions = log_of(6)
    assert [b.position for b in iter_batches(log)] == positions
    assert [b.position for b in iter_batches(log, positions[2])] == positions[2:]
    # end cuts through batch 4: batches 0-3 complete, 4 is a torn tail for this window
    assert [b.position for b in iter_batches(log, end=positions[4] + 30)] == positions[:4]
    assert valid_bytes(log) == len(log)
    assert valid_bytes(log, positions[3]) == len(log)


def test_works_over_mmap_and_mmap_can_close_while_generator_suspended(tmp_path: object) -> None:
    log, positions = log_of(4)
    m = mmap.mmap(-1, len(log))
    m.write(log)
    gen = iter_batches(m)
    first = next(gen)
    assert first.position == 0
    assert decode_records(m, first)[0].offset == 0
    m.close()  # would raise BufferError if the generator kept a buffer export alive
    assert [b.position for b in iter_batches(memoryview(log))] == positions


@pytest.mark.parametrize("cut", [1, 16, 17, 60, 61, -1])
def test_torn_tail_stops_cleanly(cut: int) -> None:
    log, positions = log_of(3)
    last = positions[-1]
    torn = log[: last + cut] if cut > 0 else log[:cut]
    batches = list(iter_batches(torn))
    assert [b.position for b in batches] == positions[:-1]
    assert valid_bytes(torn) == last


def test_empty_buffer() -> None:
    assert list(iter_batches(b"")) == []
    assert valid_bytes(b"") == 0


# --- corruption ------------------------------------------------------------------------------------


def test_flipped_byte_is_a_crc_error_naming_position_and_offset() -> None:
    log, positions = log_of(3)
    bad = bytearray(log)
    bad[positions[1] + 70] ^= 0x01  # inside batch 1's records
    with pytest.raises(CorruptRecordError) as info:
        list(iter_batches(bad))
    err = info.value
    assert (err.position, err.offset) == (positions[1], 100)
    assert "CRC" in str(err)
    assert f"byte {positions[1]}" in str(err) and "offset 100" in str(err)
    named = err.in_file("seg.log")
    assert str(named).startswith(f"seg.log: byte {positions[1]}: offset 100:")
    # without verification the batch is reported, flagged
    flagged = list(iter_batches(bad, verify_crc=False))
    assert [b.crc_valid for b in flagged] == [True, False, True]
    with pytest.raises(CorruptRecordError):
        valid_bytes(bad)


def test_flipped_header_byte_covered_by_crc() -> None:
    raw = bytearray(build_batch(specs(2), base_offset=0))
    raw[40] ^= 0x80  # maxTimestamp
    with pytest.raises(CorruptRecordError, match="CRC"):
        list(iter_batches(raw))


@pytest.mark.parametrize("size", [-1, 0, 13])
def test_size_below_minimum_is_corrupt(size: int) -> None:
    log, positions = log_of(2)
    bad = bytearray(log)
    struct.pack_into(">i", bad, positions[1] + 8, size)
    with pytest.raises(CorruptRecordError) as info:
        list(iter_batches(bad))
    assert (info.value.position, info.value.offset) == (positions[1], 100)
    assert "smaller than the minimum" in str(info.value)


def test_v2_size_below_header_is_corrupt() -> None:
    raw = bytearray(build_batch(specs(2), base_offset=0))
    struct.pack_into(">i", raw, 8, 30)
    with pytest.raises(CorruptRecordError, match="v2 header"):
        list(iter_batches(raw))


@pytest.mark.parametrize("magic", [3, 0x7F, 0xFF])
def test_bad_magic(magic: int) -> None:
    log, positions = log_of(2)
    bad = bytearray(log)
    bad[positions[1] + 16] = magic
    with pytest.raises(UnsupportedMagicError) as info:
        list(iter_batches(bad))
    assert info.value.position == positions[1]
    assert str(magic) in str(info.value)


def _with_payload(codec: Compression, payload: bytes, count: int = 1) -> bytes:
    """A v2 batch whose records section is ``payload`` verbatim, with a valid CRC."""
    raw = bytearray(build_batch(specs(count), base_offset=5))
    raw[61:] = payload
    struct.pack_into(">i", raw, 8, len(raw) - 12)
    struct.pack_into(">h", raw, 21, int(codec))
    struct.pack_into(">I", raw, 17, crc32c.crc32c(bytes(raw[21:])))
    return bytes(raw)


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD])
def test_garbage_compressed_payload(codec: Compression) -> None:
    raw = _with_payload(codec, b"\xde\xad\xbe\xef not a compressed stream at all")
    (batch,) = iter_batches(raw)  # header-only: the payload is not touched
    with pytest.raises(CompressionError) as info:
        decode_records(raw, batch)
    assert (info.value.position, info.value.offset) == (0, 5)


def test_unknown_codec_id() -> None:
    raw = bytearray(build_batch(specs(1), base_offset=0))
    struct.pack_into(">h", raw, 21, 6)
    struct.pack_into(">I", raw, 17, crc32c.crc32c(bytes(raw[21:])))
    with pytest.raises(CompressionError, match="codec id 6"):
        list(iter_batches(raw))


def test_record_framing_errors() -> None:
    good = build_batch(specs(3), base_offset=5)
    body = good[61:]
    # declared count larger than the records present
    raw = bytearray(good)
    struct.pack_into(">i", raw, 57, 4)
    struct.pack_into(">I", raw, 17, crc32c.crc32c(bytes(raw[21:])))
    with pytest.raises(CorruptRecordError, match=r"runs past|truncated"):
        decode_records(raw, next(iter_batches(raw)))
    # trailing bytes after the declared records
    raw = _with_payload(Compression.NONE, body + b"\x00\x00", count=3)
    with pytest.raises(CorruptRecordError, match="remain after") as info:
        decode_records(raw, next(iter_batches(raw)))
    assert info.value.position == 61 + len(body)
    # a key length running past the record (compressed: position is the batch's)
    rec = bytes.fromhex("0c") + b"\x00\x00\x00" + bytes.fromhex("40") + b"abc" + b"\x01\x00"  # keyLen 32
    raw = _with_payload(Compression.GZIP, compress(Compression.GZIP, rec))
    with pytest.raises(CorruptRecordError, match="decompressed") as info:
        decode_records(raw, next(iter_batches(raw)))
    assert info.value.position == 0


# --- legacy v0/v1 by hand (kafka-python cross-checks live in test_records_kafka_python.py) --------


def legacy_message(
    offset: int, magic: int, key: bytes | None, value: bytes | None, *, attrs: int = 0, ts: int = -1
) -> bytes:
    body = struct.pack(">bb", magic, attrs)
    if magic == 1:
        body += struct.pack(">q", ts)
    for f in (key, value):
        body += struct.pack(">i", -1) if f is None else struct.pack(">i", len(f)) + f
    crc = zlib.crc32(body)
    return struct.pack(">qiI", offset, len(body) + 4, crc) + body


def test_legacy_v0_and_v1_plain_messages() -> None:
    log = legacy_message(7, 0, b"k", b"v0") + legacy_message(8, 1, None, b"v1", ts=T0, attrs=0x08)
    b0, b1 = iter_batches(log)
    assert (b0.magic, b0.base_offset, b0.last_offset, b0.record_count) == (0, 7, 7, 1)
    assert (b0.timestamp_type, b0.base_timestamp, b0.max_timestamp) == (TimestampType.NO_TIMESTAMP, -1, -1)
    assert (b0.producer_id, b0.partition_leader_epoch, b0.is_control) == (-1, -1, False)
    assert (b1.magic, b1.timestamp_type, b1.max_timestamp) == (1, TimestampType.LOG_APPEND_TIME, T0)
    assert decode_records(log, b0) == [Record(7, -1, b"k", b"v0")]
    assert decode_records(log, b1) == [Record(8, T0, None, b"v1")]


def test_legacy_v1_wrapper_resolves_relative_offsets() -> None:
    inner = b"".join(legacy_message(i, 1, None, f"m{i}".encode(), ts=T0 + i) for i in range(3))
    wrapper = legacy_message(52, 1, None, compress(Compression.GZIP, inner), attrs=1, ts=T0 + 2)
    (batch,) = iter_batches(wrapper)
    assert (batch.base_offset, batch.last_offset, batch.record_count) == (50, 52, 3)
    assert batch.compression is Compression.GZIP
    assert decode_records(wrapper, batch) == [
        Record(50 + i, T0 + i, None, f"m{i}".encode()) for i in range(3)
    ]


def test_legacy_crc_and_size_errors() -> None:
    msg = bytearray(legacy_message(3, 1, b"k", b"v", ts=T0))
    msg[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC-32") as info:
        list(iter_batches(msg))
    assert (info.value.position, info.value.offset) == (0, 3)
    (flagged,) = iter_batches(msg, verify_crc=False)
    assert not flagged.crc_valid
    short = bytearray(legacy_message(3, 1, None, None, ts=T0))
    struct.pack_into(">i", short, 8, 15)  # ≥ 14 but below v1's 22
    with pytest.raises(CorruptRecordError, match="v1 message size"):
        list(iter_batches(short + b"\x00" * 40))


def test_legacy_wrapper_with_garbage_payload() -> None:
    wrapper = legacy_message(9, 1, None, b"garbage!" * 4, attrs=2, ts=T0)
    with pytest.raises(CompressionError) as info:
        list(iter_batches(wrapper))
    assert (info.value.position, info.value.offset) == (0, 9)


# --- properties ---------------------------------------------------------------------------------------

header_st = st.builds(Header, st.text(max_size=8), st.none() | st.binary(max_size=8))
spec_st = st.builds(
    RecordSpec,
    st.integers(0, 2**41),
    st.none() | st.binary(max_size=40),
    st.none() | st.binary(max_size=200),
    st.lists(header_st, max_size=3).map(tuple),
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(spec_st, max_size=20),
    st.integers(0, 2**62),
    st.sampled_from(list(Compression)),
)
def test_build_decode_round_trip(recs: list[RecordSpec], base: int, codec: Compression) -> None:
    raw = build_batch(recs, base_offset=base, compression=codec, last_offset=base + max(len(recs) - 1, 0))
    (batch,) = iter_batches(raw)
    assert batch.crc_valid and batch.record_count == len(recs)
    assert batch.last_offset == base + max(len(recs) - 1, 0)
    if recs:
        assert batch.base_timestamp == recs[0].timestamp
        assert batch.max_timestamp == max(r.timestamp for r in recs)
    out = decode_records(raw, batch)
    assert out == [Record(base + i, s.timestamp, s.key, s.value, s.headers) for i, s in enumerate(recs)]


def test_record_length_prefix_must_match_its_fields() -> None:
    good = build_batch([RecordSpec(T0, b"k", b"v")], base_offset=5)
    body = bytearray(good[61:])
    assert body[0] == 2 * 8  # zig-zag length 8: attrs, ts, offset, keyLen, k, valueLen, v, headerCount
    body[0] = 2 * 9  # claim one more byte than the fields use, and supply it
    body += b"\x00"
    raw = _with_payload(Compression.NONE, bytes(body))
    with pytest.raises(CorruptRecordError, match="length prefix says 10") as info:
        decode_records(raw, next(iter_batches(raw)))
    assert (info.value.position, info.value.offset) == (61, 5)
