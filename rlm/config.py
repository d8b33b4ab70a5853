"""Configuration: a TOML file (DESIGN §3) plus ``RLM_<SECTION>__<KEY>`` environment overrides.

Every key is validated here, once, at startup. An invalid file produces one :class:`ConfigError`
that names the key, the value and what is allowed; the CLI exits with code 2. Unknown keys are
errors too: a misspelt ``retention_ms`` silently keeping data forever is worse than a refusal.

Environment overrides use ``__`` between levels and are parsed as TOML values when they parse
(``RLM_TIERING__RETENTION_MS=86400000``, ``RLM_LOG__DIRS='["/data"]'``) and as plain strings
otherwise (``RLM_SERVER__TOKEN=s3cret``). ``[remote.options]`` is handed to the backend verbatim;
the backend validates it (``RLM_REMOTE__OPTIONS__BUCKET=x`` overrides one option).

Relative paths in ``[log] dirs`` are resolved against the current working directory.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from rlm.errors import ConfigError

Eligibility = Literal["high-watermark", "rolled"]
ENV_PREFIX = "RLM_"
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class LogSettings:
    """``[log]``: where the log store's data lives and when a rolled segment is committed."""

    dirs: tuple[Path, ...] = (Path("/var/lib/kafka/data"),)
    eligibility: Eligibility = "high-watermark"


@dataclass(frozen=True, slots=True)
class RemoteSettings:
    """``[remote]``: the backend's entry-point name and its options (validated by the backend)."""

    backend: str = "local"
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TieringSettings:
    """``[tiering]``: intervals in milliseconds, sizes in bytes; -1 disables a retention limit."""

    task_interval_ms: int = 30_000
    index_entry_bytes: int = 1_048_576
    index_rotate_bytes: int = 104_857_600
    index_rotate_ms: int = 604_800_000
    retention_ms: int = -1
    retention_bytes: int = -1
    upload_bytes_per_sec: int = -1       # token-bucket cap on the upload stream; -1 = unlimited
    max_concurrent_uploads: int = 4      # global cap across partitions
    gc_grace_ms: int = 3_600_000         # abandoned attempts younger than this are left alone
    state_dir: Path | None = None        # journal, pins, progress; default: <log dir>.rlm-state
    remote_cache_bytes: int = 268_435_456  # byte-bounded LRU of remote ranges read by lookups


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """``[server]``: the HTTP API. Loopback by default; a token enables Bearer auth."""

    host: str = "127.0.0.1"
    port: int = 9464
    token: str = ""
    request_timeout_ms: int = 30_000

    def __repr__(self) -> str:  # never print the token
        return f"ServerSettings(host={self.host!r}, port={self.port}, token={'***' if self.token else ''!r})"


@dataclass(frozen=True, slots=True)
class Settings:
    """The whole validated configuration."""

    log: LogSettings = field(default_factory=LogSettings)
    remote: RemoteSettings = field(default_factory=RemoteSettings)
    tiering: TieringSettings = field(default_factory=TieringSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    source: str = "<defaults>"


# --- validators: each returns the converted value or raises ConfigError naming key and value ---

Validator = Callable[[str, Any], Any]


def _fail(key: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"config key {key} = {value!r}: {allowed}")


def _int(minimum: int, maximum: int = 2**63 - 1, *, disabled: int | None = None) -> Validator:
    def check(key: str, value: Any) -> int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        if ok and (value == disabled or minimum <= value <= maximum):
            return int(value)
        extra = f" or {disabled} to disable" if disabled is not None else ""
        raise _fail(key, value, f"must be an integer in [{minimum}, {maximum}]{extra}")

    return check


def _str(choices: tuple[str, ...] | None = None, *, non_empty: bool = False) -> Validator:
    def check(key: str, value: Any) -> str:
        if not isinstance(value, str):
            raise _fail(key, value, "must be a string")
        if choices is not None and value not in choices:
            raise _fail(key, value, "must be one of " + ", ".join(repr(c) for c in choices))
        if non_empty and not value:
            raise _fail(key, value, "must not be empty")
        return value

    return check


def _dirs(key: str, value: Any) -> tuple[Path, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise _fail(key, value, "must be a non-empty list of directory paths")
    return tuple(Path(v).expanduser().absolute() for v in value)


def _optional_path(key: str, value: Any) -> Path | None:
    if value in ("", None):
        return None
    if not isinstance(value, str):
        raise _fail(key, value, "must be a directory path")
    return Path(value).expanduser().absolute()


def _options(key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(key, value, "must be a table of backend options")
    return dict(value)


_SCHEMA: dict[str, tuple[type[Any], dict[str, Validator]]] = {
    "log": (LogSettings, {
        "dirs": _dirs,
        "eligibility": _str(("high-watermark", "rolled")),
    }),
    "remote": (RemoteSettings, {
        "backend": _str(non_empty=True),
        "options": _options,
    }),
    "tiering": (TieringSettings, {
        "task_interval_ms": _int(100),
        "index_entry_bytes": _int(1, _INT32_MAX),
        "index_rotate_bytes": _int(1, _INT32_MAX),
        "index_rotate_ms": _int(1),
        "retention_ms": _int(0, disabled=-1),
        "retention_bytes": _int(0, disabled=-1),
        "upload_bytes_per_sec": _int(1, disabled=-1),
        "max_concurrent_uploads": _int(1, 1024),
        "gc_grace_ms": _int(0),
        "state_dir": _optional_path,
        "remote_cache_bytes": _int(0),
    }),
    "server": (ServerSettings, {
        "host": _str(non_empty=True),
        "port": _int(0, 65535),
        "token": _str(),
        "request_timeout_ms": _int(1),
    }),
}


def _env_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _apply_env(raw: dict[str, Any], environ: Mapping[str, str]) -> None:
    for name, text in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        path = [part.lower() for part in name[len(ENV_PREFIX):].split("__")]
        if len(path) < 2 or not all(path):
            raise ConfigError(f"environment variable {name}: expected RLM_<SECTION>__<KEY>")
        node = raw
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"environment variable {name}: {part} is not a table")
            node = child
        node[path[-1]] = _env_value(text)


def settings_from_mapping(raw: Mapping[str, Any], *, source: str = "<mapping>") -> Settings:
    """Validate a parsed TOML document (after env overrides) into :class:`Settings`."""
    unknown = sorted(set(raw) - set(_SCHEMA))
    if unknown:
        raise ConfigError(
            f"{source}: unknown section [{unknown[0]}]; known sections: {', '.join(_SCHEMA)}")
    sections: dict[str, Any] = {}
    for section, (cls, validators) in _SCHEMA.items():
        table = raw.get(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: [{section}] must be a table")
        extra = sorted(set(table) - set(validators))
        if extra:
            raise ConfigError(
                f"{source}: unknown key {section}.{extra[0]}; known keys: {', '.join(validators)}")
        values = {k: validators[k](f"{section}.{k}", v) for k, v in table.items()}
        assert {f.name for f in fields(cls)} >= set(values)
        sections[section] = cls(**values)
    return Settings(**sections, source=source)


def load_settings(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> Settings:
    """Read ``path`` (TOML), apply ``RLM_*`` overrides from ``environ`` (default: the process's)."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as err:
        raise ConfigError(f"config file {path} cannot be read: {err.strerror}") from err
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"config file {path} is not valid TOML: {err}") from err
    _apply_env(raw, os.environ if environ is None else environ)
    return settings_from_mapping(raw, source=str(path))
