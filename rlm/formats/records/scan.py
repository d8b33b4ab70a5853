"""Iterate the entries of a log buffer, v2 batches and legacy messages alike, reading headers only.

Two implementations of one walk (docs/scan.md): the compiled scanner (``_scan.c``: v2 headers,
CRC-32C and the RecordBatch objects in C) and the pure-Python reference below, which is also the
fallback where the extension is not built and handles, one entry at a time, everything uncommon
the compiled scanner meets (legacy messages, every error), so both raise the same errors.
"""

from __future__ import annotations

import logging
import mmap
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import NoReturn

from rlm.errors import (
    CompressionError,
    ConfigError,
    CorruptRecordError,
    NativeExtensionError,
    UnsupportedMagicError,
)
from rlm.formats.records.legacy import _legacy_batch
from rlm.formats.records.types import (
    _ATTR_CODEC_MASK,
    _ATTR_CONTROL,
    _ATTR_TIMESTAMP_TYPE,
    _ATTR_TRANSACTIONAL,
    _CODECS,
    _CRC_START_V2,
    _HEADER_UP_TO_MAGIC,
    _OFFSET_SIZE,
    _TS_BY_BIT,
    _V2_HEADER,
    LOG_OVERHEAD,
    MIN_ENTRY_SIZE,
    V2_HEADER_SIZE,
    Buffer,
    RecordBatch,
    _crc32c_fn,
    _make_batch,
)

__all__ = ["SCAN_IMPL", "batches_crc32c", "crc32c", "crc32c_combine", "iter_batches", "valid_bytes"]

# --------------------------------------------------------------------------------------------


def _raise_small(size: int, pos: int, offset: int) -> NoReturn:
    if size < MIN_ENTRY_SIZE:
        raise CorruptRecordError(
            f"entry size {size} is smaller than the minimum {MIN_ENTRY_SIZE}", position=pos, offset=offset
        )
    raise CorruptRecordError(
        f"record batch size {size} is smaller than the v2 header ({V2_HEADER_SIZE - LOG_OVERHEAD})",
        position=pos,
        offset=offset,
    )


def iter_batches(
    buf: Buffer,
    start: int = 0,
    *,
    verify_crc: bool = True,
    end: int | None = None,
    skip_crc: bool = False,
) -> Iterator[RecordBatch]:
    """Yield the entries of ``buf`` from byte ``start`` up to ``end`` (exclusive; default ``len(buf)``).

    Stops cleanly at a torn tail: fewer than 17 bytes left, or an entry whose declared size runs
    past ``end``. Raises :class:`CorruptRecordError` for ``size < 14`` (or below the v1/v2 header
    size), and for a CRC mismatch when ``verify_crc`` (else the batch is yielded with
    ``crc_valid=False``); :class:`UnsupportedMagicError` for a magic other than 0, 1, 2;
    :class:`CompressionError` for an unknown codec id. Records of v2 batches are not decoded; a
    v0/v1 compressed wrapper is decompressed to learn its first offset and record count.

    ``skip_crc``: v2 batch CRCs are not computed at all and ``crc_valid`` is True — only for bytes
    whose CRCs were already verified (remote ranges were verified when uploaded; docs/read-path.md).

    No buffer export outlives a single step, so an ``mmap`` may be closed as soon as iteration
    stops (even if the generator is left suspended).
    """
    if _scanner is not None and _native_fits(buf, start, end):
        return _scanner(buf, start, end, verify_crc, skip_crc)
    return _iter_batches_py(buf, start, verify_crc=verify_crc, end=end, skip_crc=skip_crc)


def _iter_batches_py(
    buf: Buffer,
    start: int = 0,
    *,
    verify_crc: bool = True,
    end: int | None = None,
    skip_crc: bool = False,
) -> Iterator[RecordBatch]:
    """The pure-Python walk, reference and fallback of :func:`iter_batches` (docs/scan.md). A v2 header
    is read inline, no call per batch (this loop is its whole cost); rare entries and errors are helpers."""
    limit = len(buf) if end is None else min(end, len(buf))
    pos = start
    unpack_v2, crc32c, make = _V2_HEADER.unpack_from, _crc32c_fn, _make_batch  # locals: no global lookups
    codecs, ts_types = _CODECS, _TS_BY_BIT
    while limit - pos >= _HEADER_UP_TO_MAGIC:
        if limit - pos < V2_HEADER_SIZE or buf[pos + 16] != 2:
            entry = _other_entry(buf, pos, limit, verify_crc)
            if entry is None:
                return  # torn tail
            yield entry
            pos += entry.size
            continue
        # Hot path: one unpack reads the prefix and the whole v2 header.
        base, size, ple, _, crc, attrs, last, base_ts, max_ts, pid, epoch, seq, count = unpack_v2(buf, pos)
        total = size + LOG_OVERHEAD
        if total < V2_HEADER_SIZE:
            _raise_small(size, pos, base)
        if pos + total > limit:
            return  # torn tail: the last append did not complete
        # memoryview slice: CRC over the mapped bytes without copying; dropped right away.
        crc_ok = skip_crc or crc == crc32c(memoryview(buf)[pos + _CRC_START_V2 : pos + total])
        if not crc_ok and verify_crc:
            _raise_crc_mismatch(buf, pos, total, crc, base)
        codec = codecs[attrs & _ATTR_CODEC_MASK]
        if codec is None:
            _raise_unknown_codec(attrs, pos, base)
        yield make(
            pos,
            total,
            base,
            base + last,
            2,
            crc,
            crc_ok,
            codec,
            ts_types[(attrs & _ATTR_TIMESTAMP_TYPE) >> 3],
            base_ts,
            max_ts,
            pid,
            epoch,
            seq,
            ple,
            bool(attrs & _ATTR_TRANSACTIONAL),
            bool(attrs & _ATTR_CONTROL),
            count,
            attrs,
        )
        pos += total


def _other_entry(buf: Buffer, pos: int, limit: int, verify_crc: bool) -> RecordBatch | None:
    """The entry at ``pos`` that is not a whole v2 batch: a legacy (v0/v1) message, or an error
    (unknown magic, too small); None at a torn tail (the entry runs past ``limit``)."""
    base_offset, size = _OFFSET_SIZE.unpack_from(buf, pos)
    if size < MIN_ENTRY_SIZE:
        _raise_small(size, pos, base_offset)
    total = size + LOG_OVERHEAD
    if pos + total > limit:
        return None
    magic = buf[pos + 16]
    if magic == 2:  # fewer than 61 bytes left and the entry fits in them: too small for v2
        _raise_small(size, pos, base_offset)
    if magic == 0 or magic == 1:
        return _legacy_batch(buf, pos, total, verify_crc)
    raise UnsupportedMagicError(
        f"unsupported record batch magic {magic} (known: 0, 1, 2)", position=pos, offset=base_offset
    )


def _raise_unknown_codec(attrs: int, pos: int, base_offset: int) -> NoReturn:
    raise CompressionError(
        f"unknown compression codec id {attrs & _ATTR_CODEC_MASK}", position=pos, offset=base_offset
    )


def _raise_crc_mismatch(buf: Buffer, pos: int, total: int, stored: int, base_offset: int) -> NoReturn:
    computed = _crc32c_fn(memoryview(buf)[pos + _CRC_START_V2 : pos + total])
    raise CorruptRecordError(
        f"record batch CRC-32C mismatch: stored {stored:#010x}, computed {computed:#010x}",
        position=pos,
        offset=base_offset,
    )


def valid_bytes(buf: Buffer, start: int = 0, *, end: int | None = None) -> int:
    """End position of the last complete entry at or after ``start`` (``start`` if there is none).

    A torn tail is excluded; corruption before it raises like :func:`iter_batches` (with CRC
    verification) rather than being silently cut off.
    """
    last = start
    for batch in iter_batches(buf, start, verify_crc=True, end=end):
        last = batch.position + batch.size
    return last


# --------------------------------------------------------------------------------------------
# Which walk runs (docs/scan.md)

_log = logging.getLogger("rlm.formats.records")
#: Exact types the compiled scanner takes; anything else (subclasses, strided or typed
#: memoryviews, negative starts and their index-from-the-end meaning) keeps the reference's
#: semantics by running the reference.
_NATIVE_BUFFERS = (bytes, bytearray, mmap.mmap)


def _native_fits(buf: object, start: object, end: object) -> bool:
    if type(start) is not int or not 0 <= start <= sys.maxsize or not (end is None or type(end) is int):
        return False
    if type(buf) in _NATIVE_BUFFERS:
        return True
    if type(buf) is memoryview:
        try:
            return buf.ndim == 1 and buf.format == "B" and buf.c_contiguous
        except ValueError:  # released: the reference raises on first use, as it always did
            return False
    return False


def _reference_step(
    buf: Buffer, pos: int, limit: int, verify_crc: bool, skip_crc: bool
) -> RecordBatch | None:
    """The entry at ``pos`` as the reference walk sees it (None: the walk ends there). The compiled
    scanner hands every entry it does not take itself to this, so errors have one source."""
    return next(_iter_batches_py(buf, pos, verify_crc=verify_crc, end=limit, skip_crc=skip_crc), None)


def _load_native(environ: Mapping[str, str]) -> ModuleType | None:
    """The compiled scanner, bound to the types here; None when ``RLM_SCAN=python`` or not built.

    ``RLM_SCAN=native`` or ``RLM_REQUIRE_NATIVE=1`` (the Makefile's test target) turn a missing
    extension into :class:`NativeExtensionError` instead of the fallback's one warning line.
    """
    choice = environ.get("RLM_SCAN", "").strip().lower() or "auto"
    if choice not in ("auto", "native", "python"):
        raise ConfigError(f"environment variable RLM_SCAN: expected python or native, got {choice!r}")
    if choice == "python":
        _log.info("record scan: pure Python (RLM_SCAN=python)")
        return None
    try:
        from rlm.formats.records import _scan
    except ImportError as exc:
        if choice == "native" or environ.get("RLM_REQUIRE_NATIVE", "") not in ("", "0"):
            raise NativeExtensionError(
                f"the compiled record scan rlm.formats.records._scan does not import ({exc}); "
                "`make install` builds it"
            ) from exc
        _log.warning(
            "record scan: compiled extension not built (%s); using the pure-Python walk, "
            "~5x slower (`make install` builds it)",
            exc,
        )
        return None
    _scan.bind(RecordBatch, _CODECS, _TS_BY_BIT, _reference_step)
    return _scan


_native = _load_native(os.environ)
_scanner: Callable[[Buffer, int, int | None, bool, bool], Iterator[RecordBatch]] | None = (
    _native.Scanner if _native is not None else None
)
#: Which walk :func:`iter_batches` runs: ``native (CRC-32C: avx512|sse4.2|table)`` or ``python``.
SCAN_IMPL = f"native (CRC-32C: {_native.CRC_PATHS[0]})" if _native is not None else "python"


def crc32c(data: Buffer, crc: int = 0) -> int:
    """The CRC-32C (Castagnoli) of ``data``'s bytes, continuing ``crc`` (0 to start), as an unsigned
    32-bit int: the compiled scanner's where it is built (AVX-512 folding where the CPU has it:
    0.15 ms per 8 MiB on this project's bench host, the ``crc32c`` package 0.32 ms), else the
    ``crc32c`` package's. Every CRC a copy computes goes through it: the segment's, its sealed
    form's, and the bytes each upload sends (#35)."""
    if _native is not None:
        return int(_native.crc32c(data, crc))
    return _crc32c_fn(data, crc)


# The combine for callers holding two CRCs (the parts of an upload, rlm.storage.filestream), in
# Python where the extension is not built.
_POLY = 0x82F63B78  # CRC-32C (Castagnoli), bit-reflected


def _multmodp(a: int, b: int) -> int:
    """a * b modulo the CRC polynomial (bit-reflected: x^0 is bit 31), as zlib's multmodp."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _x2n_table() -> list[int]:
    table = [1 << 30]  # x^1
    for _ in range(31):
        table.append(_multmodp(table[-1], table[-1]))
    return table


_X2N = _x2n_table()  # x^(2^k) modulo the polynomial
_SHIFTS: dict[int, int] = {}  # len2 -> x^(8 * len2): one per part size, computed once


def _x8nmodp(n: int) -> int:
    """x^(8n) modulo the polynomial (the operator shifting a CRC over ``n`` zero bytes)."""
    shift = _SHIFTS.get(n)
    if shift is None:
        p, k, left = 1 << 31, 3, n
        while left:
            if left & 1:
                p = _multmodp(_X2N[k & 31], p)
            left >>= 1
            k += 1
        shift = _SHIFTS.setdefault(n, p) if len(_SHIFTS) < 64 else p
    return shift


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32C of ``A + B`` from ``crc1`` = CRC-32C(A), ``crc2`` = CRC-32C(B) and ``len2`` =
    len(B) in bytes (zlib's ``crc32_combine``, for the Castagnoli polynomial): the compiled
    scanner's where it is built (the one :func:`batches_crc32c` uses), else this module's."""
    if len2 <= 0:
        return crc1
    if _native is not None:
        return int(_native.crc32c_combine(crc1, crc2, len2))
    return _multmodp(_x8nmodp(len2), crc1) ^ crc2


def batches_crc32c(buf: Buffer, batches: list[RecordBatch]) -> int:
    """The CRC-32C of ``buf`` from ``batches[0].position`` to the end of the last batch, where
    ``batches`` is what :func:`iter_batches` with ``verify_crc=True`` returned over ``buf``.

    Each v2 batch's stored CRC covers its bytes from the attributes on and the walk checked it
    against them, so the compiled scanner reads only each batch's first 21 bytes and combines
    (zlib's ``crc32_combine``): an 8 MiB segment of 1 MiB batches costs 8 headers, not a second
    pass over 8 MiB (#35). Where that does not hold (a v0/v1 message set, whose CRC is CRC-32 over
    other bytes; batches not contiguous; no extension) every byte is read: the same value.
    """
    if _native is not None and batches:
        combined = _native.batches_crc32c(buf, batches)
        if combined is not None:
            return int(combined)
    if not batches:
        return crc32c(b"")
    first, last = batches[0], batches[-1]
    return crc32c(memoryview(buf)[first.position : last.position + last.size])
