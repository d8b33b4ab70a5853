"""Which record decoder runs: the compiled one (``rlm.formats.records._columns``) or the Python reference.

``RLM_DECODER=native`` forces the C extension (a :class:`NativeExtensionError` if it does not
import), ``RLM_DECODER=python`` the pure-Python reference; unset or ``auto`` picks the extension when
it imports. ``RLM_REQUIRE_NATIVE=1`` (``make test``) turns a missing extension into
:class:`NativeExtensionError` at import, as for the compiled scan (docs/scan.md). Decided once per
process on first use and logged once (logger ``rlm.decoder``). Both give the same records and the
same errors (docs/decoder.md).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Final, Literal

from rlm.errors import ConfigError, NativeExtensionError
from rlm.formats.records.types import Header, Record

try:
    from rlm.formats.records import _columns

    _IMPORT_ERROR: str | None = None
except ImportError as exc:  # no compiler when rlm was installed: the Python decoder serves
    _columns = None  # type: ignore[assignment]
    _IMPORT_ERROR = str(exc)
    if os.environ.get("RLM_REQUIRE_NATIVE", "") not in ("", "0"):
        raise NativeExtensionError(
            f"the compiled record decoder rlm.formats.records._columns does not "
            f"import ({exc}); `make install` builds it (docs/decoder.md)"
        ) from exc

__all__ = [
    "DECODER_ENV",
    "Decoder",
    "active_decoder",
    "extension",
    "extension_error",
    "native_records",
    "set_decoder",
]

log = logging.getLogger("rlm.decoder")

DECODER_ENV: Final = "RLM_DECODER"
Decoder = Literal["native", "python"]
_chosen: Decoder | None = None
_configured = False


def native_records(
    buf: object,
    start: int,
    end: int,
    base_offset: int,
    base_ts: int,
    max_ts: int,
    log_append: bool,
    count: int,
) -> list[Record] | int:
    """The C decoder's records of one v2 records block ``buf[start:end]`` (decompressed), or an
    error code (< 0) when the reference decoder rejects the block. Only when :func:`active_decoder`
    is ``native``."""
    if not _configured:
        _configure()
    out: list[Record] | int = _columns.records_v2(
        buf, start, end, base_offset, base_ts, max_ts, log_append, count
    )
    return out


def _configure() -> None:
    global _configured
    _columns.configure(Record, Header)
    _configured = True


def extension() -> Any:
    """The extension module ``rlm.formats.records._columns``, or None when it does not import."""
    return _columns


def extension_error() -> str | None:
    """Why the extension does not import (None when it does)."""
    return _IMPORT_ERROR


def set_decoder(name: Decoder | None) -> None:
    """Force a decoder for this process (tests, benches); None re-reads ``RLM_DECODER`` on next use."""
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
        raise NativeExtensionError(
            f"{DECODER_ENV}=native but the compiled decoder does not import "
            f"({_IMPORT_ERROR}): `make install` builds it (needs a C compiler)"
        )
    return "native"
