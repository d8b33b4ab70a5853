"""The compiled record decoder (C extension ``rlm.formats.records._columns``): records → column buffers.

Which decoder runs (docs/decoder.md): ``RLM_DECODER=native`` forces the C extension (an error if it
is not built), ``RLM_DECODER=python`` the pure-Python reference (:func:`decode_records`); unset or
``auto`` picks the extension when it imports. The choice is made once per process and logged once
(logger ``rlm.decoder``). ``make test`` sets ``RLM_REQUIRE_NATIVE=1`` so a build that silently fell
back fails tests/formats/test_native_decoder.py.

A :class:`Builder` accumulates rows; :func:`add_batch` appends the records of one batch that fall
in a :class:`Window` (offsets ``lo ≤ offset ≤ hi``, timestamps ``ts_lo ≤ ts < ts_hi``; the row filter
of ``rlm.jobs.decode.iter_task_records``). ``Builder.take(n)`` hands over the first ``n`` rows as
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

import logging
import os
from dataclasses import dataclass
from typing import Final, Literal, NamedTuple, NoReturn

from rlm.errors import CompressionError, ConfigError, CorruptRecordError
from rlm.formats.compression import Compression, decompress
from rlm.formats.records.decode import decode_records
from rlm.formats.records.types import V2_HEADER_SIZE, Buffer, RecordBatch, TimestampType

try:
    from rlm.formats.records import _columns
    from rlm.formats.records._columns import Builder

    _IMPORT_ERROR: str | None = None
except ImportError as exc:  # no compiler when rlm was installed: the Python decoder serves
    _columns = None  # type: ignore[assignment]
    _IMPORT_ERROR = str(exc)

__all__ = ["DECODER_ENV", "FLUSH_BYTES", "Builder", "Columns", "Window", "active_decoder", "add_batch",
           "extension_error", "set_decoder", "take"]

log = logging.getLogger("rlm.decoder")

DECODER_ENV: Final = "RLM_DECODER"
#: Take rows once this many key/value/header bytes are pending (well below Arrow's 2 GiB).
FLUSH_BYTES: Final = 1 << 30

Decoder = Literal["native", "python"]
_chosen: Decoder | None = None


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


def extension_error() -> str | None:
    """Why the extension does not import (None when it does)."""
    return _IMPORT_ERROR


def set_decoder(name: Decoder | None) -> None:
    """Force a decoder for this process (tests); None re-reads ``RLM_DECODER`` on next use."""
    global _chosen
    _chosen = None if name is None else _resolve(name)


def active_decoder() -> Decoder:
    """``native`` or ``python``: decided on first use from ``RLM_DECODER`` and logged once."""
    global _chosen
    if _chosen is None:
        _chosen = _resolve(os.environ.get(DECODER_ENV, "auto").strip().lower() or "auto")
        if _chosen == "native":
            log.info("record decoder: native (C extension rlm.formats.records._columns)")
        else:
            why = f"{DECODER_ENV}=python" if _IMPORT_ERROR is None else f"not built: {_IMPORT_ERROR}"
            log.info("record decoder: python (%s; docs/decoder.md)", why)
    return _chosen


def _resolve(name: str) -> Decoder:
    if name not in ("auto", "native", "python"):
        raise ConfigError(f"{DECODER_ENV}={name!r}: use native, python or auto")
    if name == "python" or (name == "auto" and _columns is None):
        return "python"
    if _columns is None:
        raise ConfigError(f"{DECODER_ENV}=native but the compiled decoder does not import "
                          f"({_IMPORT_ERROR}): run `make install` (needs a C compiler)")
    return "native"


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
        data, start, end, batch.base_offset, batch.base_timestamp, batch.max_timestamp,
        batch.timestamp_type is TimestampType.LOG_APPEND_TIME, int(batch.timestamp_type),
        batch.record_count, w.lo, w.hi, w.ts_lo or 0, w.ts_hi or 0, w.ts_lo is not None,
        w.ts_hi is not None)
    if rc < 0:
        _raise_rejected(buf, batch, rc)
    return rc


def _add_legacy(builder: Builder, buf: Buffer, batch: RecordBatch, window: Window) -> int:
    # v0/v1 messages (pre-0.11 logs): decoded by the reference, one append per kept message.
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
        raise CorruptRecordError("a record timestamp does not fit int64 microseconds",
                                 position=batch.position, offset=batch.base_offset)
    if rc == _columns.ERR_TOO_BIG:
        raise CorruptRecordError("records of one batch pass 2 GiB in a column", position=batch.position,
                                 offset=batch.base_offset)
    decode_records(buf, batch)  # raises the reference's own error for this batch
    raise CorruptRecordError("the compiled decoder rejected a batch the reference decoder accepts "
                             "(a bug: set RLM_DECODER=python and report it)",
                             position=batch.position, offset=batch.base_offset)
