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

from rlm.config import validators as v
from rlm.config.protection import CompressionSettings, EncryptionSettings, compression, encryption
from rlm.config.server import check_server
from rlm.config.validators import Validator
from rlm.errors import ConfigError
from rlm.formats.segment_index import DEFAULT_INDEX_INTERVAL_BYTES

Eligibility = Literal["high-watermark", "rolled"]
LeadershipMode = Literal["auto", "kraft", "kafka-admin", "static", "always"]
SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
ENV_PREFIX = "RLM_"


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
    unreachable_after_ms: int = 5_000  # failing (or hanging) this long = store unreachable
    probe_interval_ms: int = 5_000  # while unreachable, one probe call per interval
    # [remote.compression] / [remote.encryption]: off by default (docs/protection.md)
    compression: CompressionSettings = field(default_factory=CompressionSettings)
    encryption: EncryptionSettings = field(default_factory=EncryptionSettings)
    prefix_spread: int = 0  # hex digits of a hash prefix on every key (docs/key-spread.md)


@dataclass(frozen=True, slots=True)
class TieringSettings:
    """``[tiering]``: intervals in milliseconds, sizes in bytes; -1 disables a retention limit."""

    task_interval_ms: int = 30_000
    index_entry_bytes: int = 1_048_576
    index_rotate_bytes: int = 104_857_600
    index_rotate_ms: int = 604_800_000
    retention_ms: int = -1
    retention_bytes: int = -1
    upload_bytes_per_sec: int = -1  # token-bucket cap on the upload stream; -1 = unlimited
    max_concurrent_uploads: int = 4  # global cap across partitions
    gc_grace_ms: int = 3_600_000  # abandoned attempts younger than this are left alone
    state_dir: Path | None = None  # journal, pins, progress; default: <log dir>.rlm-state
    remote_cache_bytes: int = 268_435_456  # byte-bounded LRU of remote ranges read by lookups
    # Read-ahead of sequential remote readers (docs/read-path.md); 0 bytes disables it.
    read_ahead_bytes: int = 16_777_216  # per reader: prefetched + in flight
    read_ahead_total_bytes: int = 134_217_728  # all readers together
    read_ahead_idle_ms: int = 30_000  # a reader idle this long is dropped, its window freed
    read_ahead_threads: int = 8  # ranged GETs in parallel (all readers)
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
    metadata_log_dir: Path | None = None  # default: <log dir>/__cluster_metadata-0 if present
    overrides: tuple[TopicOverride, ...] = ()


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """``[server]``: the HTTP API. Loopback by default; a token enables Bearer auth, tls_cert HTTPS."""

    host: str = "127.0.0.1"
    port: int = 9464
    token: str = ""
    request_timeout_ms: int = 30_000
    max_body_bytes: int = 1_048_576  # larger request bodies are refused with 413
    token_file: Path | None = None  # the token read from a file instead (exclusive with token)
    tls_cert: Path | None = None  # PEM certificate chain; with tls_key: HTTPS only
    tls_key: Path | None = None  # PEM private key (unencrypted)
    tls_ca: Path | None = None  # clients of this server (rlm.http.client): CA bundle to verify it

    def __repr__(self) -> str:  # never print the token
        return f"ServerSettings(host={self.host!r}, port={self.port}, token={'***' if self.token else ''!r})"


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """``[cluster]``: which partitions this broker leads, so only their leader copies (docs/cluster.md)."""

    node_id: int | None = None  # None: node.id / broker.id from meta.properties
    leadership: LeadershipMode = "auto"
    bootstrap_servers: tuple[str, ...] = ()
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism = "PLAIN"
    sasl_username: str = ""
    sasl_password_file: Path | None = None  # the password itself is never in the config file
    ssl_cafile: Path | None = None
    metadata_refresh_ms: int = 30_000  # kafka-admin: at most one Metadata request per period
    leaders: Mapping[str, int] = field(default_factory=dict)  # static: "<topic>-<partition>" -> node id


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    """``[kafka]``: a read-only Kafka-protocol listener in ``rlm run`` (docs/kafka-listener.md)."""

    listen: str = ""  # "host:port" (port 0 = any free port); empty = no listener
    tls_cert: Path | None = None  # PEM certificate chain; with tls_key: the listener speaks TLS
    tls_key: Path | None = None
    sasl_plain_users_file: Path | None = None  # lines "user:password": clients must SASL/PLAIN first
    max_request_bytes: int = 104_857_600  # Kafka's socket.request.max.bytes: larger frames close
    idle_timeout_ms: int = 600_000  # Kafka's connections.max.idle.ms: silent connections close
    max_wait_ms: int = 30_000  # cap on a Fetch's max_wait_ms (a client may ask for longer)


@dataclass(frozen=True, slots=True)
class IcebergSettings:
    """``[iceberg]``: the table `rlm export --format iceberg` writes (docs/iceberg.md)."""

    catalog: Mapping[str, str] = field(default_factory=dict)  # empty: SQLite catalog under --out
    catalog_name: str = "rlm"
    namespace: str = "kafka"
    table: str = "records"  # one table for every exported topic (partitioned by topic)


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


#: The keys of one ``[topics.overrides."<glob>"]`` table; ``-1`` disables a retention limit.
_OVERRIDE_KEYS: dict[str, Validator] = {
    "retention_ms": v.integer(0, disabled=-1),
    "retention_bytes": v.integer(0, disabled=-1),
    "enabled": v.boolean,
    "archive_compacted": v.boolean,
}


def _overrides(key: str, value: Any) -> tuple[TopicOverride, ...]:
    """``{glob: {key: value}}`` in file order (TOML tables keep it): the first match wins."""
    if not isinstance(value, dict):
        raise v.fail(key, value, 'must be a table of [topics.overrides."<glob>"] tables')
    out = []
    for pattern, table in value.items():
        where = f'{key}."{pattern}"'
        if not isinstance(table, dict):
            raise v.fail(where, table, "must be a table")
        extra = sorted(set(table) - set(_OVERRIDE_KEYS))
        if extra:
            raise ConfigError(f"unknown key {where}.{extra[0]}; known keys: {', '.join(_OVERRIDE_KEYS)}")
        values = {k: _OVERRIDE_KEYS[k](f"{where}.{k}", v) for k, v in table.items()}
        out.append(TopicOverride(pattern, **values))
    return tuple(out)


def _check_cluster(c: ClusterSettings) -> None:
    """The keys each leadership source needs (checked once the whole section is read)."""
    if c.leadership == "static" and not c.leaders:
        raise ConfigError(
            'config key cluster.leaders is empty: leadership = "static" needs a '
            '[cluster.leaders] table of "<topic>-<partition>" = node_id'
        )
    if c.leadership == "kafka-admin" and not c.bootstrap_servers:
        raise ConfigError(
            'config key cluster.bootstrap_servers is empty: leadership = "kafka-admin" '
            'needs the brokers to ask ("host:port", ...)'
        )
    if (
        c.security_protocol.startswith("SASL_")
        and c.leadership == "kafka-admin"
        and not (c.sasl_username and c.sasl_password_file)
    ):
        missing = "cluster.sasl_username" if not c.sasl_username else "cluster.sasl_password_file"
        raise ConfigError(
            f"config key {missing} is empty: security_protocol = "
            f"{c.security_protocol!r} needs a user name and a password file"
        )


def _check_kafka(k: KafkaSettings) -> None:
    """TLS needs both files; a certificate without its key (or the reverse) is a mistake."""
    if (k.tls_cert is None) != (k.tls_key is None):
        missing = "kafka.tls_key" if k.tls_key is None else "kafka.tls_cert"
        raise ConfigError(f"config key {missing} is empty: TLS needs kafka.tls_cert and kafka.tls_key")


_SCHEMA: dict[str, tuple[type[Any], dict[str, Validator]]] = {
    "log": (
        LogSettings,
        {
            "dirs": v.dirs,
            "eligibility": v.string(("high-watermark", "rolled")),
            "index_interval_bytes": v.integer(0, v.INT32_MAX),
        },
    ),
    "remote": (
        RemoteSettings,
        {
            "backend": v.string(non_empty=True),
            "options": v.options,
            "unreachable_after_ms": v.integer(0),
            "probe_interval_ms": v.integer(0),
            "compression": compression,
            "encryption": encryption,
            "prefix_spread": v.integer(0, 4),
        },
    ),
    "tiering": (
        TieringSettings,
        {
            "task_interval_ms": v.integer(100),
            "index_entry_bytes": v.integer(1, v.INT32_MAX),
            "index_rotate_bytes": v.integer(1, v.INT32_MAX),
            "index_rotate_ms": v.integer(1),
            "retention_ms": v.integer(0, disabled=-1),
            "retention_bytes": v.integer(0, disabled=-1),
            "upload_bytes_per_sec": v.integer(1, disabled=-1),
            "max_concurrent_uploads": v.integer(1, 1024),
            "gc_grace_ms": v.integer(0),
            "state_dir": v.optional_path,
            "remote_cache_bytes": v.integer(0),
            "read_ahead_bytes": v.integer(0),
            "read_ahead_total_bytes": v.integer(0),
            "read_ahead_idle_ms": v.integer(1),
            "read_ahead_threads": v.integer(1, 256),
            "old_incarnation_grace_ms": v.integer(0),
            "keep_old_incarnations": v.boolean,
            "trust_local_state": v.boolean,
        },
    ),
    "topics": (
        TopicsSettings,
        {
            "include": v.globs,
            "exclude": v.globs,
            "follow_kafka_configs": v.boolean,
            "metadata_log_dir": v.optional_path,
            "overrides": _overrides,
        },
    ),
    "server": (
        ServerSettings,
        {
            "host": v.string(non_empty=True),
            "port": v.integer(0, 65535),
            "token": v.string(),
            "request_timeout_ms": v.integer(1),
            "max_body_bytes": v.integer(0),
            "token_file": v.optional_file,
            "tls_cert": v.optional_file,
            "tls_key": v.optional_file,
            "tls_ca": v.optional_file,
        },
    ),
    "cluster": (
        ClusterSettings,
        {
            "node_id": v.integer(0, v.INT32_MAX),
            "leadership": v.string(("auto", "kraft", "kafka-admin", "static", "always")),
            "bootstrap_servers": v.servers,
            "security_protocol": v.string(("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")),
            "sasl_mechanism": v.string(("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")),
            "sasl_username": v.string(),
            "sasl_password_file": v.optional_file,
            "ssl_cafile": v.optional_file,
            "metadata_refresh_ms": v.integer(100),
            "leaders": v.leaders,
        },
    ),
    "iceberg": (
        IcebergSettings,
        {
            "catalog": v.properties,
            "catalog_name": v.identifier,
            "namespace": v.identifier,
            "table": v.identifier,
        },
    ),
    "kafka": (
        KafkaSettings,
        {
            "listen": v.listen,
            "tls_cert": v.optional_file,
            "tls_key": v.optional_file,
            "sasl_plain_users_file": v.optional_file,
            "max_request_bytes": v.integer(1024, v.INT32_MAX),
            "idle_timeout_ms": v.integer(1000),
            "max_wait_ms": v.integer(0, v.INT32_MAX),
        },
    ),
}

#: Checks across the keys of one section, run once it is complete.
_SECTION_CHECKS: dict[str, Callable[[Any], None]] = {
    "cluster": _check_cluster,
    "server": check_server,
    "kafka": _check_kafka,
}


def _env_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (ValueError, RecursionError):  # not TOML, a 4300+ digit integer, arrays nested too deeply
        return text


def _apply_env(raw: dict[str, Any], environ: Mapping[str, str]) -> None:
    for name, text in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        path = [part.lower() for part in name[len(ENV_PREFIX) :].split("__")]
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
        raise ConfigError(f"{source}: unknown section [{unknown[0]}]; known sections: {', '.join(_SCHEMA)}")
    sections: dict[str, Any] = {}
    for section, (cls, validators) in _SCHEMA.items():
        table = raw.get(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: [{section}] must be a table")
        extra = sorted(set(table) - set(validators))
        if extra:
            raise ConfigError(
                f"{source}: unknown key {section}.{extra[0]}; known keys: {', '.join(validators)}"
            )
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
