"""Magic 0/1 message sets: wrapper messages, compressed inner sets and their offsets."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from rlm.errors import CompressionError, CorruptRecordError
from rlm.formats.compression import Compression, decompress
from rlm.formats.records.types import (
    _ATTR_CODEC_MASK,
    _ATTR_TIMESTAMP_TYPE,
    _CODECS,
    _CRC_START_LEGACY,
    _HEADER_UP_TO_MAGIC,
    _I32,
    _I64,
    _LEGACY_HEADER,
    _OFFSET_SIZE,
    _TS_BY_BIT,
    _V1_MIN_SIZE,
    LOG_OVERHEAD,
    MIN_ENTRY_SIZE,
    Buffer,
    Record,
    RecordBatch,
    TimestampType,
)

# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _LegacyMessage:
    offset: int
    crc: int
    crc_valid: bool
    magic: int
    attributes: int
    timestamp: int
    key: bytes | None
    value: bytes | None


def _parse_legacy(buf: Buffer, pos: int, total: int, *, verify_crc: bool, where: int) -> _LegacyMessage:
    """Parse the v0/v1 message occupying ``buf[pos:pos+total]``; ``where`` is the position to report."""
    offset, size, crc, magic, attrs = _LEGACY_HEADER.unpack_from(buf, pos)
    if magic == 1 and size < _V1_MIN_SIZE:
        raise CorruptRecordError(
            f"v1 message size {size} is smaller than the minimum {_V1_MIN_SIZE}",
            position=where,
            offset=offset,
        )
    end = pos + total
    computed = zlib.crc32(memoryview(buf)[pos + _CRC_START_LEGACY : end])
    crc_ok = computed == crc
    if not crc_ok and verify_crc:
        raise CorruptRecordError(
            f"message CRC-32 mismatch: stored {crc:#010x}, computed {computed:#010x}",
            position=where,
            offset=offset,
        )
    p = pos + 18
    timestamp = -1
    if magic == 1:
        (timestamp,) = _I64.unpack_from(buf, p)
        p += 8
    fields: list[bytes | None] = []
    for name in ("key", "value"):
        if p + 4 > end:
            raise CorruptRecordError(
                f"message {name} length runs past the entry", position=where, offset=offset
            )
        (length,) = _I32.unpack_from(buf, p)
        p += 4
        if length < 0:
            fields.append(None)
            continue
        if p + length > end:
            raise CorruptRecordError(
                f"message {name} of {length} bytes runs past the entry", position=where, offset=offset
            )
        fields.append(bytes(buf[p : p + length]))
        p += length
    if p != end:
        raise CorruptRecordError(
            f"message has {end - p} bytes after its value (size field {size})", position=where, offset=offset
        )
    return _LegacyMessage(offset, crc, crc_ok, magic, attrs, timestamp, fields[0], fields[1])


def _legacy_inner(wrapper: _LegacyMessage, where: int) -> list[_LegacyMessage]:
    """Decompress a wrapper's value and parse its inner messages (offsets still as stored)."""
    codec = Compression.from_id(wrapper.attributes & _ATTR_CODEC_MASK)
    if wrapper.value is None:
        raise CorruptRecordError(
            "compressed wrapper message has a null value", position=where, offset=wrapper.offset
        )
    try:
        # Kafka before KIP-57 wrote LZ4 frames with a wrong header checksum; as Kafka does, the
        # checksum is ignored for magic 0 only (magic 1 producers already wrote correct frames).
        data = decompress(codec, wrapper.value, legacy_lz4=wrapper.magic == 0)
    except CompressionError as exc:
        raise CompressionError(exc.reason, position=where, offset=wrapper.offset) from exc
    inner: list[_LegacyMessage] = []
    p = 0
    n = len(data)
    while p < n:
        if n - p < _HEADER_UP_TO_MAGIC:
            raise CorruptRecordError(
                f"compressed message set ends with {n - p} stray bytes", position=where, offset=wrapper.offset
            )
        _, size = _OFFSET_SIZE.unpack_from(data, p)
        if size < MIN_ENTRY_SIZE or p + size + LOG_OVERHEAD > n:
            raise CorruptRecordError(
                f"inner message at byte {p} of the decompressed set has bad size {size}",
                position=where,
                offset=wrapper.offset,
            )
        msg = _parse_legacy(data, p, size + LOG_OVERHEAD, verify_crc=True, where=where)
        if msg.magic != wrapper.magic:
            raise CorruptRecordError(
                f"inner message magic {msg.magic} does not match wrapper magic {wrapper.magic}",
                position=where,
                offset=wrapper.offset,
            )
        if msg.attributes & _ATTR_CODEC_MASK:
            raise CorruptRecordError(
                "compressed message nested in a compressed wrapper", position=where, offset=msg.offset
            )
        inner.append(msg)
        p += size + LOG_OVERHEAD
    if not inner:
        raise CorruptRecordError(
            "compressed wrapper holds no messages", position=where, offset=wrapper.offset
        )
    return inner


def _inner_offset_shift(wrapper: _LegacyMessage, inner: list[_LegacyMessage]) -> int:
    # v1 inner offsets are relative: the wrapper carries the absolute offset of the last one.
    return wrapper.offset - inner[-1].offset if wrapper.magic >= 1 else 0


def _legacy_batch(buf: Buffer, pos: int, total: int, verify_crc: bool) -> RecordBatch:
    msg = _parse_legacy(buf, pos, total, verify_crc=verify_crc, where=pos)
    codec_id = msg.attributes & _ATTR_CODEC_MASK
    codec = _CODECS[codec_id]
    if codec is None:
        raise CompressionError(f"unknown compression codec id {codec_id}", position=pos, offset=msg.offset)
    if msg.magic == 0:
        ts_type = TimestampType.NO_TIMESTAMP
    else:
        ts_type = _TS_BY_BIT[(msg.attributes & _ATTR_TIMESTAMP_TYPE) >> 3]
    base_offset = msg.offset
    count = 1
    if codec is not Compression.NONE:
        inner = _legacy_inner(msg, pos)
        base_offset = inner[0].offset + _inner_offset_shift(msg, inner)
        count = len(inner)
    return RecordBatch(
        pos,
        total,
        base_offset,
        msg.offset,
        msg.magic,
        msg.crc,
        msg.crc_valid,
        codec,
        ts_type,
        msg.timestamp,
        msg.timestamp,
        -1,
        -1,
        -1,
        -1,
        False,
        False,
        count,
        msg.attributes,
    )


def _decode_legacy_records(buf: Buffer, batch: RecordBatch) -> list[Record]:
    msg = _parse_legacy(buf, batch.position, batch.size, verify_crc=False, where=batch.position)
    if batch.compression is Compression.NONE:
        return [Record(msg.offset, msg.timestamp, msg.key, msg.value)]
    inner = _legacy_inner(msg, batch.position)
    shift = _inner_offset_shift(msg, inner)
    log_append = batch.timestamp_type is TimestampType.LOG_APPEND_TIME
    return [
        Record(m.offset + shift, msg.timestamp if log_append else m.timestamp, m.key, m.value) for m in inner
    ]


# --------------------------------------------------------------------------------------------
