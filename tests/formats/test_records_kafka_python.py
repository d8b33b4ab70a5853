"""Cross-check with an independent codec (kafka-python), in both directions.

kafka-python → rlm: v2 batches (every codec, headers, null keys/values, transactional) and
v0/v1 message sets (plain and compressed wrappers) parse to the same fields and records.
rlm → kafka-python: every batch rlm's build_batch writes (all codecs, xerial and raw snappy,
LogAppendTime, control batches, compacted offsets) is read identically by DefaultRecordBatch.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import codec as kp_codec
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatch, LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder

from rlm.formats.compression import Compression, xxh32
from rlm.formats.records import (
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
)

T0 = 1_726_000_000_000
V2_CODECS = list(Compression)
LEGACY_CODECS = [Compression.NONE, Compression.GZIP, Compression.SNAPPY, Compression.LZ4]

Rows = list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]]


def sample_rows(n: int = 25) -> Rows:
    rows: Rows = []
    for i in range(n):
        key = None if i % 4 == 0 else f"key-{i}".encode()
        value = None if i % 5 == 3 else (f"value-{i}-".encode() * (i + 1))
        headers: list[tuple[str, bytes | None]] = (
            [("trace", f"{i}".encode()), ("empty", None)] if i % 3 == 1 else []
        )
        rows.append((T0 + (i * 37) % 11, key, value, headers))
    return rows


def kp_records(
    batch: Any,
) -> list[tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]]:
    return [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in batch]


def rlm_records(
    records: list[Record],
) -> list[tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]]:
    return [
        (r.offset, r.timestamp, r.key, r.value, tuple((h.key, h.value) for h in r.headers)) for r in records
    ]


def assert_same_v2(raw: bytes, mine: RecordBatch) -> None:
    """Header fields of rlm's view equal kafka-python's view of the same bytes."""
    kp = DefaultRecordBatch(bytearray(raw))
    assert kp.validate_crc()
    assert mine.crc_valid
    assert (mine.base_offset, mine.last_offset, mine.next_offset) == (
        kp.base_offset,
        kp.last_offset,
        kp.next_offset,
    )
    assert (mine.crc, mine.attributes, int(mine.compression)) == (kp.crc, kp.attributes, kp.compression_type)
    assert int(mine.timestamp_type) == kp.timestamp_type
    assert (mine.base_timestamp, mine.max_timestamp) == (kp.first_timestamp, kp.max_timestamp)
    assert (mine.producer_id, mine.producer_epoch, mine.base_sequence) == (
        kp.producer_id,
        kp.producer_epoch,
        kp.base_sequence,
    )
    assert mine.partition_leader_epoch == kp.leader_epoch
    assert (mine.is_transactional, mine.is_control) == (kp.is_transactional, kp.is_control_batch)
    assert mine.record_count == kp.records_count
    assert mine.size == kp.size_in_bytes == len(raw)


# --- kafka-python → rlm: v2 ---------------------------------------------------------------------


def kp_v2_batch(codec: Compression, rows: Rows, *, base_offset: int, transactional: bool) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=int(codec),
        is_transactional=transactional,
        producer_id=4242 if transactional else -1,
        producer_epoch=7 if transactional else -1,
        base_sequence=100 if transactional else -1,
        batch_size=10**7,
    )
    for i, (ts, key, value, headers) in enumerate(rows):
        assert builder.append(i, timestamp=ts, key=key, value=value, headers=headers) is not None
    raw = bytearray(builder.build())
    # The broker assigns the base offset and leader epoch; neither is covered by the CRC.
    struct.pack_into(">qii", raw, 0, base_offset, len(raw) - 12, 17)
    return bytes(raw)


@pytest.mark.parametrize("codec", V2_CODECS, ids=lambda c: c.label)
@pytest.mark.parametrize("transactional", [False, True], ids=["plain", "txn"])
def test_kafka_python_v2_batches_parse_identically(codec: Compression, transactional: bool) -> None:
    rows = sample_rows()
    raw = kp_v2_batch(codec, rows, base_offset=9000, transactional=transactional)
    (mine,) = iter_batches(raw)
    assert mine.compression is codec  # kafka-python would fall back to none if compression did not help
    assert_same_v2(raw, mine)
    records = decode_records(raw, mine)
    assert rlm_records(records) == kp_records(DefaultRecordBatch(bytearray(raw)))
    assert [r.offset for r in records] == list(range(9000, 9000 + len(rows)))
    assert records[0].headers == () and records[1].headers == (Header("trace", b"1"), Header("empty", None))


def test_kafka_python_multi_batch_log() -> None:
    log = bytearray()
    expected_positions = []
    next_offset = 500
    for i, codec in enumerate(V2_CODECS * 2):
        builder = MemoryRecordsBuilder(magic=2, compression_type=int(codec), batch_size=10**7, offset=0)
        for ts, key, value, headers in sample_rows(3 + i):
            builder.append(ts, key, value, headers)
        builder.close()
        raw = bytearray(builder.buffer())
        struct.pack_into(">q", raw, 0, next_offset)
        expected_positions.append(len(log))
        log += raw
        next_offset += 3 + i + 2  # leave offset gaps between batches, as compaction does
    batches = list(iter_batches(log))
    assert [b.position for b in batches] == expected_positions
    kp_log = MemoryRecords(bytes(log))
    for mine in batches:
        kp = kp_log.next_batch()
        assert kp.base_offset == mine.base_offset
        assert rlm_records(decode_records(log, mine)) == kp_records(kp)
    assert kp_log.next_batch() is None


# --- kafka-python → rlm: v0 / v1 ----------------------------------------------------------------


class _XxhashShim:
    """Stands in for the optional ``xxhash`` package kafka-python needs for magic-0 lz4 frames."""

    class _Digest:
        def __init__(self, value: int) -> None:
            self._value = value

        def digest(self) -> bytes:
            return self._value.to_bytes(4, "big")  # xxhash's canonical (big-endian) digest

    @classmethod
    def xxh32(cls, data: bytes) -> _XxhashShim._Digest:
        return cls._Digest(xxh32(bytes(data)))


@pytest.fixture
def old_kafka_lz4(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if kp_codec.xxhash is None:
        monkeypatch.setattr(kp_codec, "xxhash", _XxhashShim)
    yield


def kp_legacy(magic: int, codec: Compression, rows: Rows, *, base_offset: int) -> bytes:
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=int(codec), batch_size=10**7)
    for i, (ts, key, value, _) in enumerate(rows):
        # v1 producers write relative inner offsets; v0 ones absolute offsets.
        offset = i if (magic == 1 or codec is Compression.NONE) else base_offset + i
        assert builder.append(offset, timestamp=ts, key=key, value=value) is not None
    raw = bytearray(builder.build())
    if codec is Compression.NONE:
        # A plain message set: the broker assigns absolute offsets to every message.
        pos = 0
        for i in range(len(rows)):
            struct.pack_into(">q", raw, pos, base_offset + i)
            pos += 12 + struct.unpack_from(">i", raw, pos + 8)[0]
    else:
        # The wrapper carries the absolute offset of its last inner message.
        struct.pack_into(">q", raw, 0, base_offset + len(rows) - 1)
    return bytes(raw)


@pytest.mark.parametrize("codec", LEGACY_CODECS, ids=lambda c: c.label)
@pytest.mark.parametrize("magic", [0, 1])
def test_kafka_python_legacy_messages(magic: int, codec: Compression, old_kafka_lz4: None) -> None:
    rows = sample_rows(12)
    raw = kp_legacy(magic, codec, rows, base_offset=3000)
    if magic == 0 and codec is Compression.LZ4:
        # the frame really carries Kafka 0.8's wrong header checksum
        frame = raw[12 + 4 + 2 + 4 + 4 :]  # prefix, crc, magic+attributes, null key, value length
        assert frame[:4] == b"\x04\x22\x4d\x18" and not frame[4] & 0x08  # no content size: HC at 6
        assert frame[6] != (xxh32(frame[4:6]) >> 8) & 0xFF
    batches = list(iter_batches(raw))
    expected_ts = [ts if magic == 1 else -1 for ts, *_ in rows]
    expected = [(3000 + i, expected_ts[i], key, value, ()) for i, (_, key, value, _) in enumerate(rows)]
    if codec is Compression.NONE:
        assert len(batches) == len(rows)
        assert [b.base_offset for b in batches] == [b.last_offset for b in batches] == list(range(3000, 3012))
        got = [r for b in batches for r in decode_records(raw, b)]
    else:
        (wrapper,) = batches
        assert (wrapper.base_offset, wrapper.last_offset, wrapper.record_count) == (3000, 3011, 12)
        assert wrapper.compression is codec and wrapper.size == len(raw)
        got = decode_records(raw, wrapper)
    for b in batches:
        assert b.magic == magic and b.crc_valid
        assert b.timestamp_type is (TimestampType.NO_TIMESTAMP if magic == 0 else TimestampType.CREATE_TIME)
        assert (b.producer_id, b.partition_leader_epoch, b.is_transactional, b.is_control) == (
            -1,
            -1,
            False,
            False,
        )
    assert rlm_records(got) == expected
    # and kafka-python reads the same bytes the same way
    kp_got: list[Any] = []
    for b in batches:
        kp_batch = LegacyRecordBatch(bytearray(raw[b.position : b.end_position]), magic)
        assert kp_batch.validate_crc()
        kp_got.extend((r.offset, r.timestamp if magic == 1 else -1, r.key, r.value, ()) for r in kp_batch)
    assert kp_got == expected


def test_legacy_v1_log_append_time_wrapper_overrides_inner_timestamps() -> None:
    raw = bytearray(kp_legacy(1, Compression.GZIP, sample_rows(4), base_offset=10))
    # Broker-side LogAppendTime: set wrapper attribute bit 3 + timestamp, recompute the CRC-32.
    raw[17] |= 0x08
    struct.pack_into(">q", raw, 18, T0 + 999)
    import zlib

    struct.pack_into(">I", raw, 12, zlib.crc32(raw[16:]))
    (wrapper,) = iter_batches(raw)
    assert wrapper.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert wrapper.max_timestamp == T0 + 999
    mine = decode_records(raw, wrapper)
    assert {r.timestamp for r in mine} == {T0 + 999}
    assert [r.timestamp for r in LegacyRecordBatch(raw, 1)] == [r.timestamp for r in mine]


# --- rlm → kafka-python ---------------------------------------------------------------------------


def rlm_specs(rows: Rows) -> list[RecordSpec]:
    return [RecordSpec(ts, key, value, tuple(Header(k, v) for k, v in hs)) for ts, key, value, hs in rows]


@pytest.mark.parametrize(
    ("codec", "xerial"),
    [(c, False) for c in V2_CODECS] + [(Compression.SNAPPY, True)],
    ids=[c.label for c in V2_CODECS] + ["snappy-xerial"],
)
@pytest.mark.parametrize(
    "ts_type", [TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME], ids=lambda t: t.label
)
def test_rlm_batches_read_by_kafka_python(codec: Compression, xerial: bool, ts_type: TimestampType) -> None:
    rows = sample_rows()
    raw = build_batch(
        rlm_specs(rows),
        base_offset=123_456_789_012,
        compression=codec,
        snappy_xerial=xerial,
        timestamp_type=ts_type,
        log_append_time=T0 + 5000 if ts_type is TimestampType.LOG_APPEND_TIME else None,
        producer_id=99,
        producer_epoch=2,
        base_sequence=40,
        partition_leader_epoch=12,
        is_transactional=True,
    )
    if codec is Compression.SNAPPY:
        assert raw[61:69].startswith(b"\x82SNAPPY") is xerial
    (mine,) = iter_batches(raw)
    assert_same_v2(raw, mine)
    kp = DefaultRecordBatch(bytearray(raw))
    assert kp_records(kp) == rlm_records(decode_records(raw, mine))
    assert [o for o, *_ in kp_records(DefaultRecordBatch(bytearray(raw)))] == list(
        range(123_456_789_012, 123_456_789_012 + len(rows))
    )


@pytest.mark.parametrize("control_type", [ControlRecordType.ABORT, ControlRecordType.COMMIT])
def test_rlm_control_batch_read_by_kafka_python(control_type: ControlRecordType) -> None:
    marker = Record(77, T0, encode_control_key(control_type), encode_end_txn_marker(3))
    raw = build_batch(
        [marker],
        base_offset=77,
        producer_id=5,
        producer_epoch=1,
        is_transactional=True,
        is_control=True,
    )
    kp = DefaultRecordBatch(bytearray(raw))
    assert kp.validate_crc() and kp.is_control_batch and kp.is_transactional
    (kp_rec,) = list(kp)
    assert (kp_rec.version, kp_rec.type) == (0, int(control_type))
    assert kp_rec.commit is (control_type is ControlRecordType.COMMIT)
    (mine,) = iter_batches(raw)
    assert_same_v2(raw, mine)
    assert parse_control_record(decode_records(raw, mine)[0]).type == control_type


def test_rlm_compacted_and_empty_batches_read_by_kafka_python() -> None:
    sparse = build_batch([Record(o, T0 + o, b"k", b"v") for o in (1014, 1030, 1049)], base_offset=1000)
    empty = build_batch([], base_offset=1050, last_offset=1060, max_timestamp=T0)
    log = sparse + empty
    kp_log = MemoryRecords(log)
    kp_sparse, kp_empty = kp_log.next_batch(), kp_log.next_batch()
    assert [r.offset for r in kp_sparse] == [1014, 1030, 1049]
    assert (kp_sparse.base_offset, kp_sparse.last_offset) == (1000, 1049)
    assert (kp_empty.base_offset, kp_empty.last_offset, kp_empty.records_count) == (1050, 1060, 0)
    assert list(kp_empty) == []
    for mine, raw in zip(iter_batches(log), (sparse, empty), strict=True):
        assert_same_v2(raw, mine)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2**40),
            st.none() | st.binary(max_size=30),
            st.none() | st.binary(max_size=300),
            st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=6)), max_size=2),
        ),
        min_size=1,
        max_size=15,
    ),
    st.sampled_from(V2_CODECS),
    st.integers(0, 2**50),
)
def test_rlm_to_kafka_python_property(rows: Rows, codec: Compression, base: int) -> None:
    raw = build_batch(rlm_specs(rows), base_offset=base, compression=codec)
    kp = DefaultRecordBatch(bytearray(raw))
    assert kp.validate_crc()
    assert kp_records(kp) == [(base + i, ts, k, v, tuple(hs)) for i, (ts, k, v, hs) in enumerate(rows)]
