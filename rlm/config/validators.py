"""The validators of rlm's configuration keys (each key names its validator where it is declared,
rlm/config/keys.py): a :class:`Validator` takes ``(key, value)`` and returns the converted value,
or raises one :class:`~rlm.errors.ConfigError` naming the key, the value and what is allowed. What
it allows is also kept as data (:attr:`Validator.allowed`), which the configuration reference
prints (docs/configuration.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from rlm.errors import ConfigError, LogDirError
from rlm.formats.naming import parse_partition_dir

__all__ = [
    "INT32_MAX",
    "INT64_MAX",
    "Validator",
    "boolean",
    "dirs",
    "fail",
    "globs",
    "identifier",
    "integer",
    "leaders",
    "listen",
    "one_of",
    "optional_file",
    "optional_path",
    "options",
    "path_of",
    "properties",
    "servers",
    "string",
    "validator",
]

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
#: How the reference writes the usual upper bounds (the error message keeps the digits).
_BOUND_TEXT = {INT64_MAX: "2⁶³−1", INT32_MAX: "2³¹−1"}


@dataclass(frozen=True, slots=True)
class Validator:
    """A key's check: ``convert(key, value)`` returns the typed value or raises one ConfigError;
    ``allowed`` is the same rule as reference text (Markdown), stated beside it, never parsed
    back out of an error message."""

    convert: Callable[[str, Any], Any]
    allowed: str

    def __call__(self, key: str, value: Any) -> Any:
        return self.convert(key, value)


def validator(allowed: str) -> Callable[[Callable[[str, Any], Any]], Validator]:
    """Decorate a ``(key, value)`` function into a :class:`Validator` allowing ``allowed``."""
    return lambda convert: Validator(convert, allowed)


def fail(key: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"config key {key} = {value!r}: {allowed}")


def integer(minimum: int, maximum: int = INT64_MAX, *, disabled: int | None = None) -> Validator:
    """An integer in ``[minimum, maximum]`` (never a bool), or exactly ``disabled`` when given."""
    extra = f" or {disabled} to disable" if disabled is not None else ""

    def check(key: str, value: Any) -> int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        if ok and (value == disabled or minimum <= value <= maximum):
            return int(value)
        raise fail(key, value, f"must be an integer in [{minimum}, {maximum}]{extra}")

    shown = f"[{minimum}, {_BOUND_TEXT.get(maximum, maximum)}]{extra}"
    return Validator(check, shown)


def string(choices: tuple[str, ...] | None = None, *, non_empty: bool = False) -> Validator:
    def check(key: str, value: Any) -> str:
        if not isinstance(value, str):
            raise fail(key, value, "must be a string")
        if choices is not None and value not in choices:
            raise fail(key, value, "must be one of " + ", ".join(repr(c) for c in choices))
        if non_empty and not value:
            raise fail(key, value, "must not be empty")
        return value

    if choices is not None:
        return Validator(check, ", ".join(f"`{c}`" for c in choices))
    return Validator(check, "non-empty string" if non_empty else "string")


def one_of(literal: Any) -> Validator:
    """One of the strings of a ``Literal[...]`` type: the type declares the choices once."""
    return string(get_args(literal))


def path_of(key: str, value: Any, text: str) -> Path:
    # No OS path holds a NUL byte; refused here, os calls would raise ValueError later.
    if "\x00" in text:
        raise fail(key, value, "a path cannot contain a NUL byte")
    return Path(text).expanduser().absolute()


@validator("non-empty list of paths")
def dirs(key: str, value: Any) -> tuple[Path, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise fail(key, value, "must be a non-empty list of directory paths")
    return tuple(path_of(key, value, v) for v in value)


def _optional(what: str) -> Validator:
    """A path (``what`` names its kind in errors), or unset when empty."""

    def check(key: str, value: Any) -> Path | None:
        if value in ("", None):
            return None
        if not isinstance(value, str):
            raise fail(key, value, f"must be a {what} path")
        return path_of(key, value, value)

    return Validator(check, "path or empty")


optional_path = _optional("directory")
optional_file = _optional("file")


@validator("`true`, `false`")
def boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise fail(key, value, "must be true or false")
    return value


@validator("list of glob patterns")
def globs(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise fail(key, value, "must be a list of glob patterns on topic names")
    return tuple(value)


@validator('`"host:port"` list')
def servers(key: str, value: Any) -> tuple[str, ...]:
    """``"host:port"`` strings (IPv6 hosts in brackets, ``[::1]:9092``)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise fail(key, value, 'must be a list of "host:port" strings')
    for server in value:
        host, sep, port = server.rpartition(":") if isinstance(server, str) else ("", "", "")
        if not (host and sep and port.isdigit() and 0 < int(port) <= 65535):
            raise fail(key, value, f'{server!r} is not "host:port"')
    return tuple(value)


_NODE_ID = integer(0, INT32_MAX)


@validator("table")
def leaders(key: str, value: Any) -> dict[str, int]:
    """``{"<topic>-<partition>": node_id}``; the names follow Kafka's partition directory rule."""
    if not isinstance(value, dict):
        raise fail(key, value, 'must be a table of "<topic>-<partition>" = node_id')
    out = {}
    for name, node_id in value.items():
        try:
            parse_partition_dir(name)
        except LogDirError:
            raise fail(f'{key}."{name}"', node_id, 'the key must be "<topic>-<partition>"') from None
        out[name] = _NODE_ID(f'{key}."{name}"', node_id)
    return out


@validator('`"host:port"` or empty')
def listen(key: str, value: Any) -> str:
    """``"host:port"`` (IPv6 hosts in brackets, ``[::1]:9093``; port 0 = any free port) or empty."""
    if value == "":
        return ""
    text = value if isinstance(value, str) else ""
    host, sep, port = text.rpartition(":")
    if not (host and sep and port.isdigit() and 0 <= int(port) <= 65535):
        raise fail(key, value, 'must be "host:port" (port 0 = any free port) or empty')
    return text


@validator("table")
def options(key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise fail(key, value, "must be a table of backend options")
    return dict(value)


@validator("table of strings")
def properties(key: str, value: Any) -> dict[str, str]:
    """A table of catalog properties: pyiceberg takes strings (numbers and booleans are converted)."""
    if not isinstance(value, dict):
        raise fail(key, value, "must be a table of catalog properties")
    out = {}
    for name, v in value.items():
        if isinstance(v, bool):
            v = "true" if v else "false"
        if not isinstance(v, str | int | float):
            raise fail(f'{key}."{name}"', v, "must be a string, number or boolean")
        out[str(name)] = str(v)
    return out


_NAME = string(non_empty=True)


@validator("name without `.` or `/`")
def identifier(key: str, value: Any) -> str:
    """An Iceberg namespace/table name: no dots (a dot separates namespace levels)."""
    text: str = _NAME(key, value)
    if "." in text or "/" in text:
        raise fail(key, value, "must not contain '.' or '/'")
    return text
