"""Configuration: a TOML file (docs/configuration.md) plus ``RLM_<SECTION>__<KEY>`` environment overrides.

Every key is validated here, once, at startup. An invalid file produces one :class:`ConfigError`
that names the key, the value and what is allowed; the CLI exits with code 2. Unknown keys are
errors too: a misspelt ``retention_ms`` silently keeping data forever is worse than a refusal.

Environment overrides use ``__`` between levels and are parsed as TOML values when they parse
(``RLM_TIERING__RETENTION_MS=86400000``, ``RLM_LOG__DIRS='["/data"]'``) and as plain strings
otherwise (``RLM_SERVER__TOKEN=s3cret``). ``[remote.options]`` is handed to the backend verbatim;
the backend validates it (``RLM_REMOTE__OPTIONS__BUCKET=x`` overrides one option).
``[remote.compression]`` and ``[remote.encryption]`` sit beside it (:mod:`rlm.config.protection`).

Relative paths in ``[log] dirs`` are resolved against the current working directory.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from rlm.config.protection import CompressionSettings, EncryptionSettings, compression, encryption
from rlm.config.server import check_server
from rlm.errors import ConfigError, LogDirError
from rlm.formats.naming import parse_partition_dir
from rlm.formats.segment_index import DEFAULT_INDEX_INTERVAL_BYTES

Eligibility = Literal["high-watermark", "rolled"]
LeadershipMode = Literal["auto", "kraft", "kafka-admin", "static", "always"]
SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
ENV_PREFIX = "RLM_"
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class LogSettings:
    """``[log]``: where the log store's data lives and when a rolled segment is committed."""

    dirs: tuple[Path, ...] = (Path("/var/lib/kafka/data"),)
    eligibility: Eligibility = "high-watermark"
    index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES  # rebuilding a broken broker index


@dataclass(frozen=True, slots=True)
class RemoteSettings:
    """``[remote]``: the backend's entry-point name and its options (validated by the backend)."""

    backend: str = "local"
    options: Mapping[str, Any] = field(default_factory=dict)
    unreachable_after_ms: int = 5_000    # failing (or hanging) this long = store unreachable
    probe_interval_ms: int = 5_000       # while unreachable, one probe call per interval
    # [remote.compression] / [remote.encryption]: off by default (docs/protection.md)
    compression: CompressionSettings = field(default_factory=CompressionSettings)
    encryption: EncryptionSettings = field(default_factory=EncryptionSettings)
    prefix_spread: int = 0               # hex digits of a hash prefix on every key (docs/key-spread.md)


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
    # Read-ahead of sequential remote readers (docs/read-path.md); 0 bytes disables it.
    read_ahead_bytes: int = 16_777_216        # per reader: prefetched + in flight
    read_ahead_total_bytes: int = 134_217_728  # all readers together
    read_ahead_idle_ms: int = 30_000          # a reader idle this long is dropped, its window freed
    read_ahead_threads: int = 8               # ranged GETs in parallel (all readers)
    # A re-created topic's predecessor (docs/topic-identity.md): deleted this long after it is first
    # seen retired, unless kept.
    old_incarnation_grace_ms: int = 86_400_000
    keep_old_incarnations: bool = False
    # A restart takes a partition's state from its local files when they are whole and agree
    # (docs/remote-state.md); false = recover every partition from the store at start.
    trust_local_state: bool = True


@dataclass(frozen=True, slots=True)
class TopicOverride:
    """One ``[topics.overrides."<glob>"]`` table, in file order; ``None`` = not set here."""

    pattern: str
    retention_ms: int | None = None
    retention_bytes: int | None = None
    enabled: bool | None = None
    archive_compacted: bool | None = None


@dataclass(frozen=True, slots=True)
class TopicsSettings:
    """``[topics]``: which topics are tiered and their policy (docs/topic-policy.md)."""

    include: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ()
    follow_kafka_configs: bool | None = None  # None: true when a KRaft metadata log is found
    metadata_log_dir: Path | None = None       # default: <log dir>/__cluster_metadata-0 if present
    overrides: tuple[TopicOverride, ...] = ()


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """``[server]``: the HTTP API. Loopback by default; a token enables Bearer auth, tls_cert HTTPS."""

    host: str = "127.0.0.1"
    port: int = 9464
    token: str = ""
    request_timeout_ms: int = 30_000
    max_body_bytes: int = 1_048_576      # larger request bodies are refused with 413
    token_file: Path | None = None       # the token read from a file instead (exclusive with token)
    tls_cert: Path | None = None         # PEM certificate chain; with tls_key: HTTPS only
    tls_key: Path | None = None          # PEM private key (unencrypted)
    tls_ca: Path | None = None           # clients of this server (rlm.http.client): CA bundle to verify it

    def __repr__(self) -> str:  # never print the token
        return f"ServerSettings(host={self.host!r}, port={self.port}, token={'***' if self.token else ''!r})"


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """``[cluster]``: which partitions this broker leads, so only their leader copies (docs/cluster.md)."""

    node_id: int | None = None           # None: node.id / broker.id from meta.properties
    leadership: LeadershipMode = "auto"
    bootstrap_servers: tuple[str, ...] = ()
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism = "PLAIN"
    sasl_username: str = ""
    sasl_password_file: Path | None = None  # the password itself is never in the config file
    ssl_cafile: Path | None = None
    metadata_refresh_ms: int = 30_000    # kafka-admin: at most one Metadata request per period
    leaders: Mapping[str, int] = field(default_factory=dict)  # static: "<topic>-<partition>" -> node id


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    """``[kafka]``: a read-only Kafka-protocol listener in ``rlm run`` (docs/kafka-listener.md)."""

    listen: str = ""                     # "host:port" (port 0 = any free port); empty = no listener
    tls_cert: Path | None = None         # PEM certificate chain; with tls_key: the listener speaks TLS
    tls_key: Path | None = None
    sasl_plain_users_file: Path | None = None  # lines "user:password": clients must SASL/PLAIN first
    max_request_bytes: int = 104_857_600  # Kafka's socket.request.max.bytes: larger frames close
    idle_timeout_ms: int = 600_000       # Kafka's connections.max.idle.ms: silent connections close
    max_wait_ms: int = 30_000            # cap on a Fetch's max_wait_ms (a client may ask for longer)


@dataclass(frozen=True, slots=True)
class IcebergSettings:
    """``[iceberg]``: the table `rlm export --format iceberg` writes (docs/iceberg.md)."""

    catalog: Mapping[str, str] = field(default_factory=dict)  # empty: SQLite catalog under --out
    catalog_name: str = "rlm"
    namespace: str = "kafka"
    table: str = "records"               # one table for every exported topic (partitioned by topic)


@dataclass(frozen=True, slots=True)
class Settings:
    """The whole validated configuration."""

    log: LogSettings = field(default_factory=LogSettings)
    remote: RemoteSettings = field(default_factory=RemoteSettings)
    tiering: TieringSettings = field(default_factory=TieringSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    topics: TopicsSettings = field(default_factory=TopicsSettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    iceberg: IcebergSettings = field(default_factory=IcebergSettings)
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
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


def _path(key: str, value: Any, text: str) -> Path:
    # No OS path holds a NUL byte; refused here, os calls would raise ValueError later.
    if "\x00" in text:
        raise _fail(key, value, "a path cannot contain a NUL byte")
    return Path(text).expanduser().absolute()


def _dirs(key: str, value: Any) -> tuple[Path, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise _fail(key, value, "must be a non-empty list of directory paths")
    return tuple(_path(key, value, v) for v in value)


def _optional_path(key: str, value: Any) -> Path | None:
    if value in ("", None):
        return None
    if not isinstance(value, str):
        raise _fail(key, value, "must be a directory path")
    return _path(key, value, value)


def _optional_file(key: str, value: Any) -> Path | None:
    if value in ("", None):
        return None
    if not isinstance(value, str):
        raise _fail(key, value, "must be a file path")
    return _path(key, value, value)


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(key, value, "must be true or false")
    return value


def _globs(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(key, value, "must be a list of glob patterns on topic names")
    return tuple(value)


#: The keys of one ``[topics.overrides."<glob>"]`` table; ``-1`` disables a retention limit.
_OVERRIDE_KEYS: dict[str, Validator] = {
    "retention_ms": _int(0, disabled=-1),
    "retention_bytes": _int(0, disabled=-1),
    "enabled": _bool,
    "archive_compacted": _bool,
}


def _overrides(key: str, value: Any) -> tuple[TopicOverride, ...]:
    """``{glob: {key: value}}`` in file order (TOML tables keep it): the first match wins."""
    if not isinstance(value, dict):
        raise _fail(key, value, 'must be a table of [topics.overrides."<glob>"] tables')
    out = []
    for pattern, table in value.items():
        where = f'{key}."{pattern}"'
        if not isinstance(table, dict):
            raise _fail(where, table, "must be a table")
        extra = sorted(set(table) - set(_OVERRIDE_KEYS))
        if extra:
            raise ConfigError(f"unknown key {where}.{extra[0]}; known keys: {', '.join(_OVERRIDE_KEYS)}")
        values = {k: _OVERRIDE_KEYS[k](f"{where}.{k}", v) for k, v in table.items()}
        out.append(TopicOverride(pattern, **values))
    return tuple(out)


def _servers(key: str, value: Any) -> tuple[str, ...]:
    """``"host:port"`` strings (IPv6 hosts in brackets, ``[::1]:9092``)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise _fail(key, value, 'must be a list of "host:port" strings')
    for server in value:
        host, sep, port = server.rpartition(":") if isinstance(server, str) else ("", "", "")
        if not (host and sep and port.isdigit() and 0 < int(port) <= 65535):
            raise _fail(key, value, f'{server!r} is not "host:port"')
    return tuple(value)


def _leaders(key: str, value: Any) -> dict[str, int]:
    """``{"<topic>-<partition>": node_id}``; the names follow Kafka's partition directory rule."""
    if not isinstance(value, dict):
        raise _fail(key, value, 'must be a table of "<topic>-<partition>" = node_id')
    node = _int(0, _INT32_MAX)
    out = {}
    for name, node_id in value.items():
        try:
            parse_partition_dir(name)
        except LogDirError:
            raise _fail(f'{key}."{name}"', node_id, 'the key must be "<topic>-<partition>"') from None
        out[name] = node(f'{key}."{name}"', node_id)
    return out


def _check_cluster(c: ClusterSettings) -> None:
    """The keys each leadership source needs (checked once the whole section is read)."""
    if c.leadership == "static" and not c.leaders:
        raise ConfigError('config key cluster.leaders is empty: leadership = "static" needs a '
                          '[cluster.leaders] table of "<topic>-<partition>" = node_id')
    if c.leadership == "kafka-admin" and not c.bootstrap_servers:
        raise ConfigError('config key cluster.bootstrap_servers is empty: leadership = "kafka-admin" '
                          'needs the brokers to ask ("host:port", ...)')
    if c.security_protocol.startswith("SASL_") and c.leadership == "kafka-admin" and not (
            c.sasl_username and c.sasl_password_file):
        missing = "cluster.sasl_username" if not c.sasl_username else "cluster.sasl_password_file"
        raise ConfigError(f"config key {missing} is empty: security_protocol = "
                          f"{c.security_protocol!r} needs a user name and a password file")


def _listen(key: str, value: Any) -> str:
    """``"host:port"`` (IPv6 hosts in brackets, ``[::1]:9093``; port 0 = any free port) or empty."""
    if value == "":
        return ""
    text = value if isinstance(value, str) else ""
    host, sep, port = text.rpartition(":")
    if not (host and sep and port.isdigit() and 0 <= int(port) <= 65535):
        raise _fail(key, value, 'must be "host:port" (port 0 = any free port) or empty')
    return text


def _check_kafka(k: KafkaSettings) -> None:
    """TLS needs both files; a certificate without its key (or the reverse) is a mistake."""
    if (k.tls_cert is None) != (k.tls_key is None):
        missing = "kafka.tls_key" if k.tls_key is None else "kafka.tls_cert"
        raise ConfigError(f"config key {missing} is empty: TLS needs kafka.tls_cert and kafka.tls_key")


def _options(key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(key, value, "must be a table of backend options")
    return dict(value)


def _properties(key: str, value: Any) -> dict[str, str]:
    """A table of catalog properties: pyiceberg takes strings (numbers and booleans are converted)."""
    if not isinstance(value, dict):
        raise _fail(key, value, "must be a table of catalog properties")
    out = {}
    for name, v in value.items():
        if isinstance(v, bool):
            v = "true" if v else "false"
        if not isinstance(v, str | int | float):
            raise _fail(f'{key}."{name}"', v, "must be a string, number or boolean")
        out[str(name)] = str(v)
    return out


def _identifier(key: str, value: Any) -> str:
    """An Iceberg namespace/table name: no dots (a dot separates namespace levels)."""
    text: str = _str(non_empty=True)(key, value)
    if "." in text or "/" in text:
        raise _fail(key, value, "must not contain '.' or '/'")
    return text


_SCHEMA: dict[str, tuple[type[Any], dict[str, Validator]]] = {
    "log": (LogSettings, {
        "dirs": _dirs,
        "eligibility": _str(("high-watermark", "rolled")),
        "index_interval_bytes": _int(0, _INT32_MAX),
    }),
    "remote": (RemoteSettings, {
        "backend": _str(non_empty=True),
        "options": _options,
        "unreachable_after_ms": _int(0),
        "probe_interval_ms": _int(0),
        "compression": compression,
        "encryption": encryption,
        "prefix_spread": _int(0, 4),
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
        "read_ahead_bytes": _int(0),
        "read_ahead_total_bytes": _int(0),
        "read_ahead_idle_ms": _int(1),
        "read_ahead_threads": _int(1, 256),
        "old_incarnation_grace_ms": _int(0),
        "keep_old_incarnations": _bool,
        "trust_local_state": _bool,
    }),
    "topics": (TopicsSettings, {
        "include": _globs,
        "exclude": _globs,
        "follow_kafka_configs": _bool,
        "metadata_log_dir": _optional_path,
        "overrides": _overrides,
    }),
    "server": (ServerSettings, {
        "host": _str(non_empty=True),
        "port": _int(0, 65535),
        "token": _str(),
        "request_timeout_ms": _int(1),
        "max_body_bytes": _int(0),
        "token_file": _optional_file,
        "tls_cert": _optional_file,
        "tls_key": _optional_file,
        "tls_ca": _optional_file,
    }),
    "cluster": (ClusterSettings, {
        "node_id": _int(0, _INT32_MAX),
        "leadership": _str(("auto", "kraft", "kafka-admin", "static", "always")),
        "bootstrap_servers": _servers,
        "security_protocol": _str(("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")),
        "sasl_mechanism": _str(("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")),
        "sasl_username": _str(),
        "sasl_password_file": _optional_file,
        "ssl_cafile": _optional_file,
        "metadata_refresh_ms": _int(100),
        "leaders": _leaders,
    }),
    "iceberg": (IcebergSettings, {
        "catalog": _properties,
        "catalog_name": _identifier,
        "namespace": _identifier,
        "table": _identifier,
    }),
    "kafka": (KafkaSettings, {
        "listen": _listen,
        "tls_cert": _optional_file,
        "tls_key": _optional_file,
        "sasl_plain_users_file": _optional_file,
        "max_request_bytes": _int(1024, _INT32_MAX),
        "idle_timeout_ms": _int(1000),
        "max_wait_ms": _int(0, _INT32_MAX),
    }),
}

#: Checks across the keys of one section, run once it is complete.
_SECTION_CHECKS: dict[str, Callable[[Any], None]] = {"cluster": _check_cluster, "server": check_server,
                                                      "kafka": _check_kafka}


def _env_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (ValueError, RecursionError):  # not TOML, a 4300+ digit integer, arrays nested too deeply
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
        if section in _SECTION_CHECKS:
            _SECTION_CHECKS[section](sections[section])
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
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {path} is not UTF-8: byte {err.start}: {err.reason}") from err
    except ValueError as err:  # TOMLDecodeError, or an integer past Python's 4300-digit limit
        raise ConfigError(f"config file {path} is not valid TOML: {err}") from err
    except RecursionError:  # tomllib parses nested arrays/tables recursively
        raise ConfigError(f"config file {path} is not valid TOML: nested too deeply") from None
    _apply_env(raw, os.environ if environ is None else environ)
    return settings_from_mapping(raw, source=str(path))


# --- the configuration reference (README), generated from the schema above --------------------

#: What each key means; :func:`reference_markdown` renders it with the defaults and the allowed
#: values the validators enforce. tests/ops checks that every key has one and the README is current.
