"""Reading back the small JSON files rlm writes for itself (journal lines, ``progress.json``, the
remote index family's ``meta.json``).

A crash mid-write, a full disk or a hand edit can leave anything in them: every reader treats
what does not parse, or parses to the wrong type, as absent (each caller documents what absent
means), never as an exception. docs/fuzzing.md lists the inputs this was fuzzed with.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["int_field", "loads_or_none", "str_field"]


def loads_or_none(data: str | bytes) -> Any:
    """``json.loads``, or None for bad UTF-8, bad syntax or nesting deeper than the parser's stack."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def int_field(doc: Any, name: str) -> int | None:
    """``doc[name]`` when ``doc`` is an object and the value a JSON integer (not a bool, float or
    string), else None."""
    value = doc.get(name) if isinstance(doc, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def str_field(doc: Any, name: str) -> str | None:
    """``doc[name]`` when ``doc`` is an object and the value a JSON string, else None."""
    value = doc.get(name) if isinstance(doc, dict) else None
    return value if isinstance(value, str) else None
