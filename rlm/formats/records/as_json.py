"""One record as JSON, the one form shared by the API's ``format=json`` (docs/http-api.md §3) and
``rlm dump`` (docs/cli.md): offset, timestamp (ms since the epoch, as the batch says), key, value
and header values in standard base64 (None stays null)."""

from __future__ import annotations

import base64
from typing import Any

from rlm.formats.records.types import Record

__all__ = ["b64", "record_json"]


def b64(value: bytes | None) -> str | None:
    """Standard base64 of ``value``; None for None (a null key, value or header value)."""
    return None if value is None else base64.b64encode(value).decode("ascii")


def record_json(record: Record) -> dict[str, Any]:
    """``{"offset", "timestamp", "key", "value", "headers": [{"key", "value"}]}``."""
    return {
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": b64(record.key),
        "value": b64(record.value),
        "headers": [{"key": h.key, "value": b64(h.value)} for h in record.headers],
    }
