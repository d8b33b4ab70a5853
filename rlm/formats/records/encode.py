"""Encode record batches (v2) and control records: the inverse of decoding, for writers and tests."""

from __future__ import annotations

import struct
from collections.abc import Sequence

from rlm.errors import InvalidArgumentError
from rlm.formats.compression import Compression, compress
from rlm.formats.records.types import (
    _ATTR_CONTROL,
    _ATTR_TIMESTAMP_TYPE,
    _ATTR_TRANSACTIONAL,
    _CRC_START_V2,
    _END_TXN_MARKER,
    _I16X2,
    _V2_HEADER,
    LOG_OVERHEAD,
    V2_HEADER_SIZE,
    Record,
    RecordSpec,
    TimestampType,
    _crc32c_fn,
)
from rlm.formats.varint import encode_varint, encode_varlong

__all__ = ["build_batch", "encode_control_key", "encode_end_txn_marker"]

# Building v2 batches
# --------------------------------------------------------------------------------------------


def _encode_record(out: bytearray, offset_delta: int, ts_delta: int, rec: Record | RecordSpec) -> None:
    body = bytearray(b"\x00")  # attributes
    body += encode_varlong(ts_delta)
    body += encode_varint(offset_delta)
    for field in (rec.key, rec.value):
        if field is None:
            body += encode_varint(-1)
        else:
            body += encode_varint(len(field))
            body += field
    body += encode_varint(len(rec.headers))
    for h in rec.headers:
        hk = h.key.encode("utf-8")
        body += encode_varint(len(hk))
        body += hk
        if h.value is None:
            body += encode_varint(-1)
        else:
            body += encode_varint(len(h.value))
            body += h.value
    out += encode_varint(len(body))
    out += body


def build_batch(
    records: Sequence[RecordSpec | Record],
    *,
    base_offset: int,
    compression: Compression = Compression.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    log_append_time: int | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = -1,
    is_transactional: bool = False,
    is_control: bool = False,
    last_offset: int | None = None,
    max_timestamp: int | None = None,
    snappy_xerial: bool = True,
) -> bytes:
    """Encode a complete v2 batch exactly as Kafka lays it out (header, CRC-32C, records).

    Offsets: a :class:`Record` keeps its offset (``offsetDelta = offset - base_offset``; gaps are
    allowed, as compaction leaves them, but offsets must strictly increase and be ≥
    ``base_offset``); a :class:`RecordSpec` takes the offset after the previous record's (the first
    one ``base_offset``). ``lastOffsetDelta`` is the last record's delta, or ``last_offset -
    base_offset`` when given (a compacted batch keeps its original last offset; an empty batch
    needs it to cover offsets). ``baseTimestamp`` is the first record's timestamp and
    ``maxTimestamp`` the largest, or ``log_append_time`` for LogAppendTime (required then), or
    ``max_timestamp`` when given; an empty batch uses ``max_timestamp`` (default -1) for both, like
    Kafka's empty-header writer. snappy is xerial-framed by default because Java producers write it
    that way (``snappy_xerial=False`` gives librdkafka's raw block). The payload is compressed even
    when that does not make it smaller (a broker never re-decides the codec).
    """
    if timestamp_type is TimestampType.NO_TIMESTAMP:
        raise InvalidArgumentError("v2 batches always carry a timestamp type (CreateTime or LogAppendTime)")
    if timestamp_type is TimestampType.LOG_APPEND_TIME and log_append_time is None:
        raise InvalidArgumentError("LogAppendTime batches need log_append_time")
    deltas, last_delta = _offset_deltas(records, base_offset, last_offset)
    append_time = log_append_time if timestamp_type is TimestampType.LOG_APPEND_TIME else None
    base_ts, max_ts = _batch_timestamps(records, max_timestamp, append_time)
    body = bytearray()
    for delta, rec in zip(deltas, records, strict=True):
        _encode_record(body, delta, rec.timestamp - base_ts, rec)
    payload = compress(compression, body, xerial=snappy_xerial) if compression else bytes(body)
    attrs = int(compression)
    if timestamp_type is TimestampType.LOG_APPEND_TIME:
        attrs |= _ATTR_TIMESTAMP_TYPE
    if is_transactional:
        attrs |= _ATTR_TRANSACTIONAL
    if is_control:
        attrs |= _ATTR_CONTROL
    ids = (producer_id, producer_epoch, base_sequence, len(records))
    return _frame_batch(payload, base_offset, partition_leader_epoch, attrs, last_delta, base_ts, max_ts, ids)


def _offset_deltas(
    records: Sequence[RecordSpec | Record], base_offset: int, last_offset: int | None
) -> tuple[list[int], int]:
    """Each record's ``offsetDelta`` and the batch's ``lastOffsetDelta`` (see :func:`build_batch`)."""
    deltas: list[int] = []
    prev = -1
    for rec in records:
        delta = rec.offset - base_offset if isinstance(rec, Record) else prev + 1
        if delta <= prev:
            raise InvalidArgumentError(
                f"record offsets must strictly increase from base_offset {base_offset}: "
                f"delta {delta} after {prev}"
            )
        deltas.append(delta)
        prev = delta
    last_delta = deltas[-1] if deltas else 0
    if last_offset is not None:
        if last_offset - base_offset < last_delta:
            raise InvalidArgumentError(f"last_offset {last_offset} is before the last record")
        last_delta = last_offset - base_offset
    return deltas, last_delta


def _batch_timestamps(
    records: Sequence[RecordSpec | Record], max_timestamp: int | None, log_append_time: int | None
) -> tuple[int, int]:
    """``(baseTimestamp, maxTimestamp)`` in ms: the first record's and the largest, overridden by
    ``max_timestamp`` and then by ``log_append_time`` (LogAppendTime); -1 or ``max_timestamp`` for
    an empty batch."""
    if records:
        base_ts = records[0].timestamp
        max_ts = max(r.timestamp for r in records)
    else:
        base_ts = max_ts = -1 if max_timestamp is None else max_timestamp
    if max_timestamp is not None:
        max_ts = max_timestamp
    if log_append_time is not None:
        max_ts = log_append_time
    return base_ts, max_ts


def _frame_batch(
    payload: bytes,
    base_offset: int,
    epoch: int,
    attrs: int,
    last_delta: int,
    base_ts: int,
    max_ts: int,
    ids: tuple[int, int, int, int],
) -> bytes:
    """The batch bytes: the 61-byte big-endian v2 header, then ``payload``, CRC-32C last
    (docs/formats.md). ``ids`` is ``(producerId, producerEpoch, baseSequence, recordCount)``."""
    total = V2_HEADER_SIZE + len(payload)
    out = bytearray(total)
    # magic 2; the CRC (0 here) covers attributes..end, so it is computed once the rest is laid out
    _V2_HEADER.pack_into(
        out, 0, base_offset, total - LOG_OVERHEAD, epoch, 2, 0, attrs, last_delta, base_ts, max_ts, *ids
    )
    out[V2_HEADER_SIZE:] = payload
    struct.pack_into(">I", out, 17, _crc32c_fn(memoryview(out)[_CRC_START_V2:]))
    return bytes(out)


def encode_control_key(control_type: int, version: int = 0) -> bytes:
    """The 4-byte key of a control record (``version int16, type int16``)."""
    return _I16X2.pack(version, control_type)


def encode_end_txn_marker(coordinator_epoch: int, version: int = 0) -> bytes:
    """Value of a COMMIT/ABORT control record: ``version int16, coordinatorEpoch int32``."""
    return _END_TXN_MARKER.pack(version, coordinator_epoch)


# --------------------------------------------------------------------------------------------
