"""Decode the records of a batch (v2 and legacy) and parse control records."""

from __future__ import annotations

from rlm.errors import CompressionError, CorruptRecordError
from rlm.formats.compression import Compression, decompress
from rlm.formats.records import choice
from rlm.formats.records.legacy import _decode_legacy_records
from rlm.formats.records.types import (
    _I16X2,
    _MIN_RECORD_SIZE,
    V2_HEADER_SIZE,
    Buffer,
    ControlRecord,
    Header,
    Record,
    RecordBatch,
    TimestampType,
)
from rlm.formats.varint import decode_varint, decode_varlong

__all__ = ["decode_records", "parse_control_record"]

# Records of a v2 batch
# --------------------------------------------------------------------------------------------


def decode_records(buf: Buffer, batch: RecordBatch) -> list[Record]:
    """Decode every record of ``batch`` (as yielded by :func:`iter_batches` over the same ``buf``).

    Decompresses as needed. v2 offsets are ``base_offset + offsetDelta`` (sparse after
    compaction); timestamps follow the batch's timestamp type (module docstring). Control batch
    records are returned like any other (see :func:`parse_control_record`). v0/v1: the message
    itself, or a wrapper's inner messages with absolute offsets. Framing errors →
    :class:`CorruptRecordError` (position of the record when uncompressed, else of the batch).
    """
    if batch.magic != 2:
        return _decode_legacy_records(buf, batch)
    if choice.active_decoder() == "native":
        native = _native_records(buf, batch)
        if native is not None:
            return native
        # rejected: the reference below raises its own error for the batch
    body_start = batch.position + V2_HEADER_SIZE
    # A copy, never a view kept in a local: the frames of an error raised below would keep an
    # export of the caller's buffer alive, and closing an mmap then raises BufferError in place
    # of the real error (found by fuzzing `rlm dump`, docs/fuzzing.md).
    body = bytes(memoryview(buf)[body_start : batch.position + batch.size])
    if batch.compression is Compression.NONE:
        data = body
        report_base: int | None = body_start
    else:
        try:
            data = decompress(batch.compression, body)
        except CompressionError as exc:
            raise CompressionError(exc.reason, position=batch.position, offset=batch.base_offset) from exc
        report_base = None
    try:
        return _parse_v2_records(data, batch)
    except CorruptRecordError as exc:
        rel = exc.position if exc.position is not None else 0
        if report_base is not None:
            raise CorruptRecordError(exc.reason, position=report_base + rel, offset=exc.offset) from exc
        raise CorruptRecordError(
            f"{exc.reason} (at byte {rel} of the decompressed records)",
            position=batch.position,
            offset=exc.offset,
        ) from exc


def _native_records(buf: Buffer, batch: RecordBatch) -> list[Record] | None:
    """The compiled decoder's records of a v2 batch (docs/decoder.md); None when the reference
    would reject the batch (it is then run for its exact error)."""
    start = batch.position + V2_HEADER_SIZE
    end = batch.position + batch.size
    data: Buffer = buf
    if batch.compression is not Compression.NONE:
        try:
            data = decompress(batch.compression, bytes(memoryview(buf)[start:end]))
        except CompressionError:
            return None
        start, end = 0, len(data)
    out: list[Record] | int = choice.native_records(
        data,
        start,
        end,
        batch.base_offset,
        batch.base_timestamp,
        batch.max_timestamp,
        batch.timestamp_type is TimestampType.LOG_APPEND_TIME,
        batch.record_count,
    )
    return None if isinstance(out, int) else out


def _field(data: bytes, p: int) -> tuple[bytes | None, int]:
    """A length-prefixed field at ``p`` (varint length, -1 = null) and the position after it. A
    length running past ``data`` is not checked here: the record's length prefix catches it."""
    length, p = decode_varint(data, p)
    if length < 0:
        return None, p
    return data[p : p + length], p + length


def _parse_v2_records(data: bytes, batch: RecordBatch) -> list[Record]:
    """Parse ``batch.record_count`` records from ``data``; error positions are relative to ``data``.

    Per-record work stays inline (the reference decoder's whole cost, docs/decoder.md); headers,
    rare in practice, and every error are helpers.
    """
    count = batch.record_count
    base_offset = batch.base_offset
    n = len(data)
    _check_record_count(count, n, base_offset)
    log_append = batch.timestamp_type is TimestampType.LOG_APPEND_TIME
    base_ts = batch.base_timestamp
    max_ts = batch.max_timestamp
    p = 0
    out: list[Record] = []
    for _ in range(count):
        rec_start = p
        length, p = decode_varint(data, p)
        rec_end = p + length
        if length < 0 or rec_end > n:
            raise CorruptRecordError(
                f"record length {length} runs past the batch ({n - p} bytes left)",
                position=rec_start,
                offset=base_offset,
            )
        p += 1  # record attributes: unused by Kafka
        ts_delta, p = decode_varlong(data, p)
        off_delta, p = decode_varint(data, p)
        offset = base_offset + off_delta
        key, p = _field(data, p)
        value, p = _field(data, p)
        header_count, p = decode_varint(data, p)
        headers: tuple[Header, ...] = ()
        if header_count:
            headers, p = _parse_headers(data, p, header_count, rec_start, offset)
        if p != rec_end:
            # Also catches key/value/header lengths running past the record: slices never raise.
            raise CorruptRecordError(
                f"record fields take {p - rec_start} bytes but its length prefix says {rec_end - rec_start}",
                position=rec_start,
                offset=offset,
            )
        out.append(Record(offset, max_ts if log_append else base_ts + ts_delta, key, value, headers))
    if p != n:
        raise CorruptRecordError(
            f"{n - p} bytes remain after the declared {count} records", position=p, offset=base_offset
        )
    return out


def _check_record_count(count: int, n: int, base_offset: int) -> None:
    """The header's record count, checked against the ``n`` bytes present before any work: it is
    not trusted (a record takes at least ``_MIN_RECORD_SIZE`` bytes)."""
    if count < 0:
        raise CorruptRecordError(f"negative record count {count}", position=0, offset=base_offset)
    if count > n // _MIN_RECORD_SIZE:
        raise CorruptRecordError(
            f"record count {count} cannot fit in {n} bytes of records "
            f"(a record takes at least {_MIN_RECORD_SIZE})",
            position=0,
            offset=base_offset,
        )


def _parse_headers(
    data: bytes, p: int, header_count: int, rec_start: int, offset: int
) -> tuple[tuple[Header, ...], int]:
    """``header_count`` headers from byte ``p`` of ``data``, and the position after them. Errors
    name the record's start position and offset; a negative count is one."""
    if header_count < 0:
        raise CorruptRecordError(f"negative header count {header_count}", position=rec_start, offset=offset)
    headers: list[Header] = []
    for _ in range(header_count):
        hk_len, p = decode_varint(data, p)
        if hk_len < 0:
            raise CorruptRecordError(
                f"negative header key length {hk_len}", position=rec_start, offset=offset
            )
        try:
            hkey = data[p : p + hk_len].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptRecordError(
                f"header key is not UTF-8: {exc}", position=rec_start, offset=offset
            ) from None
        p += hk_len
        hval, p = _field(data, p)
        headers.append(Header(hkey, hval))
    return tuple(headers), p


# --------------------------------------------------------------------------------------------
# Control records
# --------------------------------------------------------------------------------------------


def parse_control_record(record: Record) -> ControlRecord:
    """Read the ``version int16, type int16`` key of a control record (Kafka ``ControlRecordType``).

    A null key, one shorter than 4 bytes or a negative version → :class:`CorruptRecordError`.
    Unknown types are returned as is (Kafka treats them as UNKNOWN, not as corruption).
    """
    key = record.key
    if key is None or len(key) < 4:
        raise CorruptRecordError(
            f"control record key must be at least 4 bytes, got {None if key is None else len(key)}",
            offset=record.offset,
        )
    version, ctype = _I16X2.unpack_from(key, 0)
    if version < 0:
        raise CorruptRecordError(f"negative control record version {version}", offset=record.offset)
    return ControlRecord(version, ctype)
