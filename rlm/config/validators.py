"""The validators of rlm's configuration keys (rlm/config/__init__.py declares which key uses
which): each takes ``(key, value)`` and returns the converted value, or raises one
:class:`~rlm.errors.ConfigError` naming the key, the value and what is allowed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlm.errors import ConfigError, LogDirError
from rlm.formats.naming import parse_partition_dir

Validator = Callable[[str, Any], Any]
INT32_MAX = 2**31 - 1


def fail(key: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"config key {key} = {value!r}: {allowed}")


def integer(minimum: int, maximum: int = 2**63 - 1, *, disabled: int | None = None) -> Validator:
    def check(key: str, value: Any) -> int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        if ok and (value == disabled or minimum <= value <= maximum):
            return int(value)
        extra = f" or {disabled} to disable" if disabled is not None else ""
        raise fail(key, value, f"must be an integer in [{minimum}, {maximum}]{extra}")

    return check


def string(choices: tuple[str, ...] | None = None, *, non_empty: bool = False) -> Validator:
    def check(key: str, value: Any) -> str:
        if not isinstance(value, str):
            raise fail(key, value, "must be a string")
        if choices is not None and value not in choices:
            raise fail(key, value, "must be one of " + ", ".join(repr(c) for c in choices))
        if non_empty and not value:
            raise fail(key, value, "must not be empty")
        return value

    return check


def path_of(key: str, value: Any, text: str) -> Path:
    # No OS path holds a NUL byte; refused here, os calls would raise ValueError later.
    if "\x00" in text:
        raise fail(key, value, "a path cannot contain a NUL byte")
    return Path(text).expanduser().absolute()


def dirs(key: str, value: Any) -> tuple[Path, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise fail(key, value, "must be a non-empty list of directory paths")
    return tuple(path_of(key, value, v) for v in value)


def optional_path(key: str, value: Any) -> Path | None:
    if value in ("", None):
        return None
    if not isinstance(value, str):
        raise fail(key, value, "must be a directory path")
    return path_of(key, value, value)


def optional_file(key: str, value: Any) -> Path | None:
    if value in ("", None):
        return None
    if not isinstance(value, str):
        raise fail(key, value, "must be a file path")
    return path_of(key, value, value)


def boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise fail(key, value, "must be true or false")
    return value


def globs(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise fail(key, value, "must be a list of glob patterns on topic names")
    return tuple(value)


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


def leaders(key: str, value: Any) -> dict[str, int]:
    """``{"<topic>-<partition>": node_id}``; the names follow Kafka's partition directory rule."""
    if not isinstance(value, dict):
        raise fail(key, value, 'must be a table of "<topic>-<partition>" = node_id')
    node = integer(0, INT32_MAX)
    out = {}
    for name, node_id in value.items():
        try:
            parse_partition_dir(name)
        except LogDirError:
            raise fail(f'{key}."{name}"', node_id, 'the key must be "<topic>-<partition>"') from None
        out[name] = node(f'{key}."{name}"', node_id)
    return out


def listen(key: str, value: Any) -> str:
    """``"host:port"`` (IPv6 hosts in brackets, ``[::1]:9093``; port 0 = any free port) or empty."""
    if value == "":
        return ""
    text = value if isinstance(value, str) else ""
    host, sep, port = text.rpartition(":")
    if not (host and sep and port.isdigit() and 0 <= int(port) <= 65535):
        raise fail(key, value, 'must be "host:port" (port 0 = any free port) or empty')
    return text


def options(key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise fail(key, value, "must be a table of backend options")
    return dict(value)


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


def identifier(key: str, value: Any) -> str:
    """An Iceberg namespace/table name: no dots (a dot separates namespace levels)."""
    text: str = string(non_empty=True)(key, value)
    if "." in text or "/" in text:
        raise fail(key, value, "must not contain '.' or '/'")
    return text
