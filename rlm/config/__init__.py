"""Configuration: a TOML file (docs/configuration.md) plus ``RLM_<SECTION>__<KEY>`` environment overrides.

Every key is validated here, once, at startup. An invalid file produces one :class:`ConfigError`
that names the key, the value and what is allowed; the CLI exits with code 2. Unknown keys are
errors too: a misspelt ``retention_ms`` silently keeping data forever is worse than a refusal.

Environment overrides use ``__`` between levels and are parsed as TOML values when they parse
(``RLM_TIERING__RETENTION_MS=86400000``, ``RLM_LOG__DIRS='["/data"]'``) and as plain strings
otherwise (``RLM_SERVER__TOKEN=s3cret``). ``[remote.options]`` is handed to the backend verbatim;
the backend validates it (``RLM_REMOTE__OPTIONS__BUCKET=x`` overrides one option).
``[remote.compression]`` and ``[remote.encryption]`` sit beside it (:mod:`rlm.config.protection_settings`).

Relative paths in ``[log] dirs`` are resolved against the current working directory.

Each key is declared once, as a field of the settings dataclasses below (:mod:`rlm.config.keys`:
name, type, default, validator with its allowed values, meaning, environment form); validation,
the environment variable names and the README reference are derived from those fields.
[cluster] and [kafka] are declared in :mod:`rlm.config.brokers`, [server] with its checks in
:mod:`rlm.config.server`.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlm.config import validators as v
from rlm.config.brokers import ClusterSettings, KafkaSettings, check_cluster, check_kafka
from rlm.config.keys import ENV_PREFIX, key, keys_of, table, values_of
from rlm.config.protection_settings import CompressionSettings, EncryptionSettings, check_encryption
from rlm.config.server import ServerSettings, check_server
from rlm.errors import ConfigError
from rlm.formats.indexes.segment_index import DEFAULT_INDEX_INTERVAL_BYTES
from rlm.logdir.discovery import EligibilityPolicy

__all__ = [
    "IcebergSettings",
    "LogSettings",
    "RemoteSettings",
    "ServerSettings",
    "Settings",
    "TieringSettings",
    "TopicOverride",
    "TopicsSettings",
    "load_settings",
    "settings_from_mapping",
]


@dataclass(frozen=True, slots=True)
class LogSettings:
    """``[log]``: where the log store's data lives and when a rolled segment is committed."""

    dirs: tuple[Path, ...] = key(
        (Path("/var/lib/kafka/data"),),
        v.dirs,
        "Kafka `log.dirs`: the log directories to tier (a string or a list).",
    )
    eligibility: EligibilityPolicy = key(
        "high-watermark",
        v.one_of(EligibilityPolicy),
        "`high-watermark`: a rolled segment is eligible once the next segment's base offset ≤ the "
        "high watermark in `replication-offset-checkpoint`; `rolled`: every rolled segment (stores "
        "without checkpoints).",
    )
    index_interval_bytes: int = key(
        DEFAULT_INDEX_INTERVAL_BYTES,
        v.integer(0, v.INT32_MAX),
        "The brokers' `index.interval.bytes`: a broker `.index`/`.timeindex` that fails its check is "
        "rebuilt from the `.log` with it (docs/broker-files.md).",
    )


@dataclass(frozen=True, slots=True)
class RemoteSettings:
    """``[remote]``: the backend's entry-point name and its options (validated by the backend)."""

    backend: str = key(
        "local",
        v.string(non_empty=True),
        "Storage backend entry-point name (`local`, `memory`, `s3`, `hdfs`, `fsspec`, third-party); "
        "unknown names fail at startup with an install hint.",
    )
    options: Mapping[str, Any] = key(
        {},
        v.options,
        "Table handed verbatim to the backend, which validates it (`local`: `root`; `s3`: `bucket`, "
        "`prefix`, `endpoint_url`, `region`, …; `hdfs`: `url`). Per-call network timeouts are "
        "backend options (`connect_timeout`, `read_timeout`, seconds; docs/operations.md).",
        env="names",
    )
    unreachable_after_ms: int = key(
        5_000,
        v.integer(0),
        "The store is *unreachable* once every call has failed for this long, or one call has not "
        "answered for this long (a frozen store): then remote reads fail at once with 503 and "
        "status/metrics say so.",
    )
    probe_interval_ms: int = key(
        5_000,
        v.integer(0),
        "While unreachable, one probe call per interval checks whether the store is back (other "
        "calls fail fast meanwhile).",
    )
    # [remote.compression] / [remote.encryption]: off by default (docs/protection.md)
    compression: CompressionSettings = table(CompressionSettings)
    encryption: EncryptionSettings = table(EncryptionSettings, then=check_encryption)
    prefix_spread: int = key(
        0,
        v.integer(0, 4),
        "Store every key under a hash prefix of this many hex digits (0 = off, 1-4 = 16-65 536 "
        "prefixes) derived from `<topic>-<partition>`, for stores that throttle per key prefix "
        "(S3). A property of the store: recorded in `rlm-layout.json` there, a different value is "
        "refused (docs/key-spread.md).",
    )


@dataclass(frozen=True, slots=True)
class TieringSettings:
    """``[tiering]``: intervals in milliseconds, sizes in bytes; -1 disables a retention limit."""

    task_interval_ms: int = key(
        30_000,
        v.integer(100),
        "How often each partition is scanned for eligible segments (Kafka: "
        "`remote.log.manager.task.interval.ms`).",
    )
    index_entry_bytes: int = key(
        1_048_576,
        v.integer(1, v.INT32_MAX),
        "Max bytes of a segment covered by one `.remotelogindex` entry (one ranged read per lookup).",
    )
    index_rotate_bytes: int = key(
        104_857_600, v.integer(1, v.INT32_MAX), "Rotate the active remote index set past this size …"
    )
    index_rotate_ms: int = key(604_800_000, v.integer(1), "… or this age.")
    retention_ms: int = key(
        -1,
        v.integer(0, disabled=-1),
        "Remote retention by time where no override sets one; -1 keeps remote data forever. "
        "Kafka's `retention.ms` is the broker's local retention, never this (docs/topic-policy.md).",
    )
    retention_bytes: int = key(
        -1,
        v.integer(0, disabled=-1),
        "Remote retention by size per partition where no override sets one; -1 = unlimited.",
    )
    upload_bytes_per_sec: int = key(  # a token bucket on the upload stream
        -1,
        v.integer(1, disabled=-1),
        "One token bucket shared by all upload streams; -1 = unthrottled.",
    )
    max_concurrent_uploads: int = key(
        4, v.integer(1, 1024), "Segments uploaded at once across all partitions."
    )
    gc_grace_ms: int = key(
        3_600_000,
        v.integer(0),
        "Objects of abandoned copy attempts younger than this are left alone by GC.",
    )
    state_dir: Path | None = key(
        None,
        v.optional_path,
        "Journal, pins and progress; default `<log dir>.rlm-state` beside each log dir (must be on "
        "the log dir's file system: pins are hard links).",
    )
    max_pinned_bytes: int = key(  # docs/operations.md "Pins and the broker's retention"
        4_294_967_296,
        v.integer(0, disabled=-1),
        "Bytes of broker segment files rlm may hold per log dir with its hard-link pins: rolled, "
        "committed segments pinned as soon as rlm sees them (so the broker's retention cannot "
        "delete them before they are tiered) plus the copies in flight. Past it new segments are "
        "not pinned (reported once, metric `rlm_pin_bound_reached`). 0 turns pinning on sight "
        "off; -1 = unlimited (docs/operations.md).",
    )
    deadline_warn_ms: int = key(  # docs/topic-policy.md §8
        600_000,
        v.integer(0, disabled=-1),
        "A partition's retention margin — the time until the broker's local retention may delete "
        "its oldest segment not yet tiered — below this logs one warning (again only after it rose "
        "back above); metric `rlm_retention_margin_seconds`. -1 never warns (docs/topic-policy.md).",
    )
    remote_cache_bytes: int = key(
        268_435_456,
        v.integer(0),
        "Byte-bounded LRU of remote ranges read by lookups and fetches; ranges of sequential readers "
        "are admitted with low priority (evicted first, at most a quarter of it, never evicting lookups' "
        "ranges; "
        "docs/read-path.md).",
    )
    read_ahead_bytes: int = key(
        16_777_216,
        v.integer(0),
        "Per sequential remote reader (a client on one partition): index entries read ahead in "
        "parallel, landed plus in flight; 0 disables read-ahead (docs/read-path.md).",
    )
    read_ahead_total_bytes: int = key(
        134_217_728,
        v.integer(0),
        "Read-ahead bytes of all readers together (landed plus in flight).",
    )
    read_ahead_idle_ms: int = key(
        30_000,
        v.integer(1),
        "A reader that has not fetched for this long is dropped: its queued reads are cancelled, its "
        "read-ahead bytes freed.",
    )
    read_ahead_threads: int = key(
        8,
        v.integer(1, 256),
        "Ranged GETs the read-ahead issues in parallel, all readers together.",
    )
    old_incarnation_grace_ms: int = key(  # a re-created topic's predecessor (docs/topic-identity.md)
        86_400_000,
        v.integer(0),
        "Remote data and local state of a deleted topic's old incarnation (the same name re-created "
        "with a new topic id) are deleted this long after rlm first sees them retired (Kafka "
        "deletes remote data with the topic).",
    )
    keep_old_incarnations: bool = key(
        False,
        v.boolean,
        "Keep old incarnations' and deleted topics' remote data and state instead (still shown in "
        "`rlm status` and `rlm gc --dry-run`).",
    )
    deleted_topic_grace_ms: int = key(  # a topic deleted and not re-created (docs/topic-identity.md)
        86_400_000,
        v.integer(0),
        "Remote data and local state of a deleted topic (its topic id gone from the KRaft metadata "
        "log and its partition directory gone or renamed `-delete`) are deleted this long after "
        "rlm first marks it deleted.",
    )
    trust_local_state: bool = key(  # docs/remote-state.md
        True,
        v.boolean,
        "At start, take a partition's state from its local files (progress, journal, remote index, "
        "manifest snapshot) when they are whole and agree, without a store request; `false` "
        "recovers every partition from the store (lists its manifests and reads each one whose "
        "stamp — size and ETag, or size and mtime where the store gives no ETag — the manifest "
        "snapshot does not hold). Ignored in cluster mode, which always syncs from the store.",
    )


@dataclass(frozen=True, slots=True)
class TopicOverride:
    """One ``[topics.overrides."<glob>"]`` table, in file order; ``None`` = not set here."""

    pattern: str
    retention_ms: int | None = key(
        None,
        v.integer(0, disabled=-1),
        "Remote retention by time for matching topics; wins over `[tiering]` and over the topic's "
        "own `retention.ms` (docs/topic-policy.md).",
    )
    retention_bytes: int | None = key(
        None,
        v.integer(0, disabled=-1),
        "Remote retention by size per partition for matching topics; wins over `[tiering]` and "
        "over the topic's own `retention.bytes`.",
    )
    enabled: bool | None = key(
        None,
        v.boolean,
        "Tier matching topics or not (a topic's own `remote.storage.enable` wins: `true` leaves "
        "the topic to Kafka's own tiered storage, `false` keeps it off).",
    )
    archive_compacted: bool | None = key(
        None,
        v.boolean,
        "Tier compacted matching topics as an archive of their pre-compaction history.",
    )


@v.validator("tables")
def _overrides(key: str, value: Any) -> tuple[TopicOverride, ...]:
    """``{glob: {key: value}}`` in file order (TOML tables keep it): the first match wins."""
    if not isinstance(value, dict):
        raise v.fail(key, value, 'must be a table of [topics.overrides."<glob>"] tables')
    out = []
    for pattern, entry in value.items():
        where = f'{key}."{pattern}"'
        if not isinstance(entry, dict):
            raise v.fail(where, entry, "must be a table")
        out.append(TopicOverride(pattern, **values_of(TopicOverride, where, entry)))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class TopicsSettings:
    """``[topics]``: which topics are tiered and their policy (docs/topic-policy.md)."""

    include: tuple[str, ...] = key(
        ("*",),
        v.globs,
        "Glob patterns on topic names to tier. Internal logs (`__`-prefixed, the KRaft log) are "
        "tiered only when a pattern starting with `__` names them.",
    )
    exclude: tuple[str, ...] = key(
        (),
        v.globs,
        "Glob patterns never tiered; they win over `include`, Kafka configs and overrides.",
    )
    follow_kafka_configs: bool | None = key(
        None,
        v.boolean,
        "Read Kafka's configs from the KRaft metadata log: `remote.storage.enable`, `cleanup.policy`, "
        "the broker's local retention (`retention.*`: shown, never applied to remote data) and "
        "`local.retention.*`; unset = true when a metadata log is found.",
    )
    metadata_log_dir: Path | None = key(
        None,
        v.optional_path,
        "The `__cluster_metadata-0` directory when it is not in a log dir (Kafka's `metadata.log.dir`).",
    )
    overrides: tuple[TopicOverride, ...] = key(
        (),
        _overrides,
        'Per-pattern tables `[topics.overrides."<glob>"]`, first match in file order wins; keys below.',
        env="inline",
        each=('"<glob>"', TopicOverride),
    )


@dataclass(frozen=True, slots=True)
class IcebergSettings:
    """``[iceberg]``: the table `rlm export --format iceberg` writes (docs/iceberg.md)."""

    catalog: Mapping[str, str] = key(
        {},
        v.properties,
        "pyiceberg catalog properties (`type`, `uri`, `warehouse`, `s3.endpoint`, …) as a table "
        "`[iceberg.catalog]`; empty = an embedded SQLite catalog with its warehouse under "
        "`rlm export --out` (docs/iceberg.md).",
        env="names",
    )
    catalog_name: str = key(
        "rlm",
        v.identifier,
        "The name the catalog is opened under (a SQL catalog keys its rows by it).",
    )
    namespace: str = key("kafka", v.identifier, "Namespace of the table (created when missing).")
    table: str = key(
        "records",
        v.identifier,
        "The one table every exported topic goes to, partitioned by `topic` and `day(timestamp)`.",
    )


@dataclass(frozen=True, slots=True)
class Settings:
    """The whole validated configuration: one table per section, in the reference's order."""

    log: LogSettings = table(LogSettings)
    remote: RemoteSettings = table(RemoteSettings)
    tiering: TieringSettings = table(TieringSettings)
    topics: TopicsSettings = table(TopicsSettings)
    server: ServerSettings = table(ServerSettings, then=check_server)
    cluster: ClusterSettings = table(ClusterSettings, then=check_cluster)
    iceberg: IcebergSettings = table(IcebergSettings)
    kafka: KafkaSettings = table(KafkaSettings, then=check_kafka)
    source: str = "<defaults>"


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
    known = keys_of(Settings)
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(f"{source}: unknown section [{unknown[0]}]; known sections: {', '.join(known)}")
    sections: dict[str, Any] = {}
    for section, spec in known.items():
        assert spec.table is not None  # every field of Settings but source is a table
        given = raw.get(section, {})
        if not isinstance(given, dict):
            raise ConfigError(f"{source}: [{section}] must be a table")
        sections[section] = spec.table(**values_of(spec.table, section, given, source=source))
        if spec.then is not None:
            spec.then(sections[section])
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
