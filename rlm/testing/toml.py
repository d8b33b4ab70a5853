"""TOML values for the configs tests and benches write (tomllib reads, nothing in the stdlib writes)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["toml_value"]


def toml_value(v: Any) -> str:
    """``v`` as a TOML value: strings JSON-quoted (a TOML basic string), booleans, lists, and dicts
    as inline tables; anything else by ``str`` (ints, floats)."""
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(x)}" for k, x in v.items()) + "}"
    return str(v)
