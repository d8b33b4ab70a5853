"""Declarative validation of backend options (the ``[remote.options]`` table of the config).

Every backend describes its options with a tuple of :class:`Option` and calls :func:`parse_options`
from its ``from_options``. The result is a plain ``dict`` with every known key (defaults filled in),
so the backend can be rebuilt from it anywhere (pickling, Spark executors). Unknown keys, wrong types and
values outside ``choices`` raise :class:`rlm.errors.ConfigError` naming the key, the value and what is
allowed — except that the value of a ``secret`` option is never echoed.

:func:`redact` replaces secret values for ``describe()``/``repr()`` output.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rlm.errors import ConfigError

__all__ = ["REDACTED", "Option", "at_least", "between", "parse_options", "redact"]

REDACTED = "***"

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "m": 1000**2,
    "g": 1000**3,
    "t": 1000**4,
    "ki": 1024,
    "mi": 1024**2,
    "gi": 1024**3,
    "ti": 1024**4,
}


@dataclass(frozen=True)
class Option:
    """One accepted option.

    ``kind`` is one of ``str``, ``int``, ``float``, ``bool``, ``size`` (an int or a string like
    ``"8MiB"``), ``dict`` or ``list``. ``choices`` restricts the value; ``check`` is an extra
    validator returning an error text or ``None``; ``secret`` values are redacted everywhere.
    """

    name: str
    kind: str = "str"
    default: Any = None
    required: bool = False
    secret: bool = False
    choices: tuple[Any, ...] | None = None
    nullable: bool = True
    check: Callable[[Any], str | None] | None = None
    help: str = ""


def _shown(opt: Option, value: Any) -> str:
    return REDACTED if opt.secret else repr(value)


def _coerce(backend: str, opt: Option, value: Any) -> Any:
    def bad(allowed: str) -> ConfigError:
        return ConfigError(
            f"remote.options.{opt.name} = {_shown(opt, value)} is invalid for backend {backend!r}: "
            f"expected {allowed}"
        )

    kind = opt.kind
    if kind == "str":
        if not isinstance(value, str):
            raise bad("a string")
        return value
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.strip().lower() in ("true", "1", "yes")
        raise bad("true or false")
    if kind == "int":
        if isinstance(value, bool):
            raise bad("an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
            return int(value)
        raise bad("an integer")
    if kind == "float":
        if isinstance(value, bool):
            raise bad("a number")
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise bad("a number")
    if kind == "size":
        if isinstance(value, bool):
            raise bad('a byte size (e.g. 8388608 or "8MiB")')
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            m = _SIZE_RE.match(value)
            if m:
                unit = (m.group(2) or "").lower().rstrip("b")
                return int(m.group(1)) * _SIZE_UNITS[unit]
        raise bad('a byte size (e.g. 8388608 or "8MiB")')
    if kind == "dict":
        if not isinstance(value, Mapping):
            raise bad("a table")
        return dict(value)
    if kind == "list":
        if isinstance(value, str) or not isinstance(value, Iterable):
            raise bad("a list")
        return list(value)
    raise AssertionError(f"unknown option kind {kind!r}")  # pragma: no cover - programming error


def parse_options(backend: str, options: Mapping[str, Any] | None, spec: Iterable[Option]) -> dict[str, Any]:
    """Validate ``options`` against ``spec`` and return every known key with defaults filled in.

    Raises :class:`ConfigError` for an unknown key (listing the allowed ones), a missing required
    key, a wrong type, a value outside ``choices`` or a failed ``check``.
    """
    spec = tuple(spec)
    by_name = {o.name: o for o in spec}
    options = dict(options or {})
    unknown = sorted(set(options) - set(by_name))
    if unknown:
        raise ConfigError(
            f"unknown option(s) {', '.join(repr(k) for k in unknown)} for backend {backend!r} "
            f"in [remote.options]; allowed: {', '.join(sorted(by_name)) or '(none)'}"
        )
    out: dict[str, Any] = {}
    for opt in spec:
        if opt.name not in options or options[opt.name] is None:
            if opt.required:
                raise ConfigError(
                    f"remote.options.{opt.name} is required for backend {backend!r}"
                    + (f" ({opt.help})" if opt.help else "")
                )
            out[opt.name] = opt.default
            continue
        value = _coerce(backend, opt, options[opt.name])
        if opt.choices is not None and value not in opt.choices:
            raise ConfigError(
                f"remote.options.{opt.name} = {_shown(opt, value)} is invalid for backend {backend!r}: "
                f"allowed: {', '.join(repr(c) for c in opt.choices)}"
            )
        if opt.check is not None:
            problem = opt.check(value)
            if problem:
                raise ConfigError(
                    f"remote.options.{opt.name} = {_shown(opt, value)} is invalid for backend "
                    f"{backend!r}: {problem}"
                )
        out[opt.name] = value
    return out


def redact(options: Mapping[str, Any], spec: Iterable[Option]) -> dict[str, Any]:
    """Return a copy of ``options`` with every set secret value replaced by ``"***"``."""
    secret = {o.name for o in spec if o.secret}
    return {k: (REDACTED if k in secret and v not in (None, "") else v) for k, v in options.items()}


def at_least(minimum: int) -> Callable[[Any], str | None]:
    """A ``check`` accepting numbers ``>= minimum``."""
    return lambda v: None if v >= minimum else f"must be >= {minimum}"


def between(low: float, high: float) -> Callable[[Any], str | None]:
    """A ``check`` accepting numbers in the closed interval ``[low, high]``."""
    return lambda v: None if low <= v <= high else f"must be between {low} and {high}"
