"""The compiled record decoder (C extension ``rlm.formats.records._columns``): records → column buffers.

Which decoder runs is :mod:`rlm.formats.records.choice`'s (``RLM_DECODER``, one log line; re-exported
here). ``make test`` sets ``RLM_REQUIRE_NATIVE=1`` so a build that silently fell back fails
tests/formats/test_native_decoder.py.

A :class:`Builder` accumulates rows; :func:`add_batch` appends the records of one batch that fall
in a :class:`Window` (offsets ``lo ≤ offset ≤ hi``, timestamps ``ts_lo ≤ ts < ts_hi``; the row filter
of ``rlm.jobs.reading.decode.iter_task_records``). ``Builder.take(n)`` hands over the first ``n`` rows as
:class:`Columns`, the Arrow buffers of Spark's Kafka schema, all in native byte order
(little-endian on every platform rlm runs on):

* ``offsets``: int64 per row (Kafka offset); ``stamps``: int64 per row, **microseconds** since the
  epoch (the record's ms × 1000; LogAppendTime batches give every record the batch's max
  timestamp); ``types``: int32 per row (-1 none, 0 CreateTime, 1 LogAppendTime).
* ``key_*`` / ``value_*``: Arrow binary: ``*_validity`` an LSB-first bitmap (bit set = not null) or
  None when no row is null, ``*_offsets`` rows + 1 int32 starting at 0, ``*_data`` the bytes.
* headers, Arrow ``list<struct<key string, value binary>>``: ``headers_validity`` (null list = a
  record without headers), ``headers_offsets`` rows + 1 int32 into the ``n_headers`` headers;
  ``hkey_offsets``/``hkey_data`` (UTF-8, never null, validated), ``hval_*`` like ``value_*``.

Bounds: a chunk's var-length bytes stay below 2 GiB per column (Arrow int32 offsets): callers take
rows once :attr:`Builder.pending_bytes` passes :data:`FLUSH_BYTES`; a batch holds at most
``MAX_DECOMPRESSED_BYTES`` (256 MiB), so no column can reach 2 GiB. The C code reads only inside
the batch's bytes ``[start, end)`` and never trusts a length before checking it against them.

Errors: a batch the reference decoder rejects is rejected by the C code too (the builder rolls it
back) and the reference is re-run on it to raise its exact error (same class, position, offset,
text). Pure: buffers in, buffers out; no I/O beyond the one log line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, NamedTuple, NoReturn

from rlm.errors import CompressionError, CorruptRecordError, RlmError
from rlm.formats.compression import Compression, decompress
from rlm.formats.records.choice import (
    DECODER_ENV,
    Decoder,
    active_decoder,
    extension,
    extension_error,
    set_decoder,
)
from rlm.formats.records.decode import decode_records
from rlm.formats.records.legacy import _parse_legacy
from rlm.formats.records.types import V2_HEADER_SIZE, Buffer, RecordBatch, TimestampType

_columns = extension()
if TYPE_CHECKING:
    from rlm.formats.records._columns import Builder
else:
    Builder = getattr(_columns, "Builder", None)

__all__ = [
    "DECODER_ENV",
    "FLUSH_BYTES",
    "Builder",
    "Columns",
    "Decoder",
    "Window",
    "active_decoder",
    "add_batch",
    "extension_error",
    "set_decoder",
    "take",
]

#: Take rows once this many key/value/header bytes are pending (well below Arrow's 2 GiB).
FLUSH_BYTES: Final = 1 << 30


class Columns(NamedTuple):
    """The buffers of ``rows`` rows (see the module docstring for units and layout)."""

    rows: int
    offsets: bytes
    stamps: bytes
    types: bytes
    key_validity: bytes | None
    key_offsets: bytes
    key_data: bytes
    value_validity: bytes | None
    value_offsets: bytes
    value_data: bytes
    headers_validity: bytes | None
    headers_offsets: bytes
    n_headers: int
    hkey_offsets: bytes
    hkey_data: bytes
    hval_validity: bytes | None
    hval_offsets: bytes
    hval_data: bytes


@dataclass(frozen=True, slots=True)
class Window:
    """Rows kept: ``lo ≤ offset ≤ hi`` (int64 bounds) and ``ts_lo ≤ timestamp ms < ts_hi`` (None = open)."""

    lo: int
    hi: int
    ts_lo: int | None = None
    ts_hi: int | None = None

    def keeps(self, offset: int, ts: int) -> bool:
        """The same test as the C code (for rows decoded in Python: v0/v1 messages)."""
        if offset < self.lo or offset > self.hi:
            return False
        below = self.ts_lo is not None and ts < self.ts_lo
        return not (below or (self.ts_hi is not None and ts >= self.ts_hi))


def take(builder: Builder, n: int) -> Columns:
    """The first ``n`` rows of ``builder`` (0 ≤ n ≤ rows) as :class:`Columns`; the rest stay."""
    return Columns(*builder.take(n))


def add_batch(builder: Builder, buf: Buffer, batch: RecordBatch, window: Window) -> int:
    """Append the records of ``batch`` (from :func:`iter_batches` over ``buf``) that ``window``
    keeps; return how many. Bad records → the reference decoder's exact error; a kept timestamp
    whose µs value overflows int64 → :class:`CorruptRecordError`."""
    if batch.magic != 2:
        return _add_legacy(builder, buf, batch, window)
    start = batch.position + V2_HEADER_SIZE
    end = batch.position + batch.size
    data: Buffer | None = buf
    if batch.compression is not Compression.NONE:
        try:
            # A copy of the (compressed) block: no view of the caller's buffer outlives the call.
            data = decompress(batch.compression, bytes(memoryview(buf)[start:end]))
        except CompressionError:
            data = None  # raised below, outside this handler: no chained context keeps frames alive
        start, end = 0, len(data or b"")
    if data is None:
        return _raise_rejected(buf, batch, _columns.ERR_FRAMING)
    w = window
    rc: int = builder.add_v2(
        data,
        start,
        end,
        batch.base_offset,
        batch.base_timestamp,
        batch.max_timestamp,
        batch.timestamp_type is TimestampType.LOG_APPEND_TIME,
        int(batch.timestamp_type),
        batch.record_count,
        w.lo,
        w.hi,
        w.ts_lo or 0,
        w.ts_hi or 0,
        w.ts_lo is not None,
        w.ts_hi is not None,
    )
    if rc < 0:
        _raise_rejected(buf, batch, rc)
    return rc


def _add_legacy(builder: Builder, buf: Buffer, batch: RecordBatch, window: Window) -> int:
    """v0/v1 (pre-0.11 logs): a compressed wrapper's inner messages are parsed (CRC-32 checked) in C;
    a plain message is one row."""
    if batch.compression is Compression.NONE:
        return _add_legacy_rows(builder, buf, batch, window)
    try:
        wrapper = _parse_legacy(buf, batch.position, batch.size, verify_crc=False, where=batch.position)
        data = None
        if wrapper.value is not None:
            data = decompress(batch.compression, wrapper.value, legacy_lz4=batch.magic == 0)
    except RlmError:
        data = None  # raised below, outside this handler (see add_batch)
    if data is None:
        return _raise_rejected(buf, batch, _columns.ERR_FRAMING)
    w = window
    rc: int = builder.add_legacy(
        data,
        batch.last_offset,
        batch.magic,
        batch.max_timestamp,
        batch.timestamp_type is TimestampType.LOG_APPEND_TIME,
        int(batch.timestamp_type),
        w.lo,
        w.hi,
        w.ts_lo or 0,
        w.ts_hi or 0,
        w.ts_lo is not None,
        w.ts_hi is not None,
    )
    if rc == _columns.ERR_FALLBACK:  # offsets beyond int64 in the C arithmetic: exact in Python
        return _add_legacy_rows(builder, buf, batch, window)
    if rc < 0:
        _raise_rejected(buf, batch, rc)
    return rc


def _add_legacy_rows(builder: Builder, buf: Buffer, batch: RecordBatch, window: Window) -> int:
    # Decoded by the reference, one append per kept message.
    ts_type = int(batch.timestamp_type)
    added = 0
    for r in decode_records(buf, batch):
        if window.keeps(r.offset, r.timestamp):
            rc: int = builder.append_row(r.offset, r.timestamp, ts_type, r.key, r.value)
            if rc < 0:
                _raise_rejected(buf, batch, rc)
            added += 1
    return added


def _raise_rejected(buf: Buffer, batch: RecordBatch, rc: int) -> NoReturn:
    if rc == _columns.ERR_RANGE:
        raise CorruptRecordError(
            "a record timestamp does not fit int64 microseconds",
            position=batch.position,
            offset=batch.base_offset,
        )
    if rc == _columns.ERR_TOO_BIG:
        raise CorruptRecordError(
            "records of one batch pass 2 GiB in a column", position=batch.position, offset=batch.base_offset
        )
    decode_records(buf, batch)  # raises the reference's own error for this batch
    raise CorruptRecordError(
        "the compiled decoder rejected a batch the reference decoder accepts "
        "(a bug: set RLM_DECODER=python and report it)",
        position=batch.position,
        offset=batch.base_offset,
    )
