"""The configuration reference: what each key means and allows, rendered as the README's table
(``python -m rlm.config --reference``; a test keeps the README equal to it). The keys themselves,
their defaults and validators are declared in :mod:`rlm.config`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlm.config import _OVERRIDE_KEYS, _SCHEMA, ENV_PREFIX, Settings
from rlm.config.protection import CODECS, SUB_KEYS, ZSTD_LEVELS
from rlm.config.validators import Validator
from rlm.errors import ConfigError

KEY_DOCS: dict[str, str] = {
    "log.dirs": "Kafka `log.dirs`: the log directories to tier (a string or a list).",
    "log.eligibility": "`high-watermark`: a rolled segment is eligible once the next segment's base "
    "offset ≤ the high watermark in `replication-offset-checkpoint`; `rolled`: every "
    "rolled segment (stores without checkpoints).",
    "log.index_interval_bytes": "The brokers' `index.interval.bytes`: a broker `.index`/`.timeindex` that "
    "fails its check is rebuilt from the `.log` with it (docs/broker-files.md).",
    "remote.backend": "Storage backend entry-point name (`local`, `memory`, `s3`, `hdfs`, `fsspec`, "
    "third-party); unknown names fail at startup with an install hint.",
    "remote.options": "Table handed verbatim to the backend, which validates it (`local`: `root`; "
    "`s3`: `bucket`, `prefix`, `endpoint_url`, `region`, …; `hdfs`: `url`). Per-call "
    "network timeouts are backend options (`connect_timeout`, `read_timeout`, seconds; "
    "docs/operations.md).",
    "remote.unreachable_after_ms": "The store is *unreachable* once every call has failed for this long, "
    "or one call has not answered for this long (a frozen store): then "
    "remote reads fail at once with 503 and status/metrics say so.",
    "remote.compression.codec": "`[remote.compression]`: compress each remote index entry (the unit of "
    "one ranged read) with zstd before it is stored; entries whose batches "
    "the producer already compressed are stored as they are "
    "(docs/protection.md).",
    "remote.compression.level": "zstd level of `[remote.compression]`.",
    "remote.encryption.key_files": "`[remote.encryption]`: key id → path of a file holding the base64 "
    "of 32 random bytes (`openssl rand -base64 32`); every "
    "key that wrapped a stored segment's data key must stay listed to "
    "read it (docs/protection.md).",
    "remote.encryption.active_key": "The key id new segments' data keys are wrapped with; empty (with "
    "no `key_files`) = no encryption.",
    "remote.probe_interval_ms": "While unreachable, one probe call per interval checks whether the "
    "store is back (other calls fail fast meanwhile).",
    "remote.prefix_spread": "Store every key under a hash prefix of this many hex digits (0 = off, "
    "1-4 = 16-65 536 prefixes) derived from `<topic>-<partition>`, for stores "
    "that throttle per key prefix (S3). A property of the store: recorded in "
    "`rlm-layout.json` there, a different value is refused (docs/key-spread.md).",
    "tiering.task_interval_ms": "How often each partition is scanned for eligible segments "
    "(Kafka: `remote.log.manager.task.interval.ms`).",
    "tiering.index_entry_bytes": "Max bytes of a segment covered by one `.remotelogindex` entry "
    "(one ranged read per lookup).",
    "tiering.index_rotate_bytes": "Rotate the active remote index set past this size …",
    "tiering.index_rotate_ms": "… or this age.",
    "tiering.retention_ms": "Remote retention by time; -1 keeps remote data forever.",
    "tiering.retention_bytes": "Remote retention by size per partition; -1 = unlimited.",
    "tiering.upload_bytes_per_sec": "One token bucket shared by all upload streams; -1 = unthrottled.",
    "tiering.max_concurrent_uploads": "Segments uploaded at once across all partitions.",
    "tiering.gc_grace_ms": "Objects of abandoned copy attempts younger than this are left alone by GC.",
    "tiering.state_dir": "Journal, pins and progress; default `<log dir>.rlm-state` beside each log dir "
    "(must be on the log dir's file system: pins are hard links).",
    "tiering.remote_cache_bytes": "Byte-bounded LRU of remote ranges read by lookups and fetches; "
    "ranges of sequential readers are admitted with low priority "
    "(evicted first, never evicting lookups' ranges; docs/read-path.md).",
    "tiering.read_ahead_bytes": "Per sequential remote reader (a client on one partition): index "
    "entries read ahead in parallel, landed plus in flight; 0 disables "
    "read-ahead (docs/read-path.md).",
    "tiering.read_ahead_total_bytes": "Read-ahead bytes of all readers together (landed plus in flight).",
    "tiering.read_ahead_idle_ms": "A reader that has not fetched for this long is dropped: its "
    "queued reads are cancelled, its read-ahead bytes freed.",
    "tiering.read_ahead_threads": "Ranged GETs the read-ahead issues in parallel, all readers together.",
    "tiering.old_incarnation_grace_ms": "Remote data and local state of a deleted topic's old "
    "incarnation (the same name re-created with a new topic id) "
    "are deleted this long after rlm first sees them retired "
    "(Kafka deletes remote data with the topic).",
    "tiering.keep_old_incarnations": "Keep old incarnations' remote data and state instead (still "
    "shown in `rlm status` and `rlm gc --dry-run`).",
    "tiering.trust_local_state": "At start, take a partition's state from its local files (progress, "
    "journal, remote index, manifest snapshot) when they are whole and "
    "agree, without a store request; `false` recovers every partition "
    "from the store (lists and reads every manifest). Ignored in "
    "cluster mode, which always syncs from the store.",
    "topics.include": "Glob patterns on topic names to tier. Internal logs (`__`-prefixed, the KRaft "
    "log) are tiered only when a pattern starting with `__` names them.",
    "topics.exclude": "Glob patterns never tiered; they win over `include`, Kafka configs and overrides.",
    "topics.follow_kafka_configs": "Honour `remote.storage.enable`, `retention.ms`, `retention.bytes` "
    "and `cleanup.policy` from the KRaft metadata log; unset = true when "
    "a metadata log is found.",
    "topics.metadata_log_dir": "The `__cluster_metadata-0` directory when it is not in a log dir "
    "(Kafka's `metadata.log.dir`).",
    "topics.overrides": 'Per-pattern tables `[topics.overrides."<glob>"]`, first match in file order '
    "wins; keys below.",
    "server.host": "HTTP API / status page / metrics address (loopback unless told otherwise).",
    "server.port": "HTTP port (0 = any free port).",
    "server.token": "When set, every route but `/healthz`, `/` and `/static` needs "
    "`Authorization: Bearer <token>`.",
    "server.request_timeout_ms": "A request whose response has not started by then answers 504; a "
    "stream is cut when one chunk read or write takes longer.",
    "server.max_body_bytes": "Request bodies above this size (declared or streamed) answer 413, "
    "on every route.",
    "server.token_file": "A file holding the bearer token (one line; one trailing newline is "
    "dropped), read when the API starts; exclusive with `token` "
    "(docs/security.md).",
    "server.tls_cert": "PEM certificate chain (leaf first): with `tls_key` the API serves HTTPS "
    "only, TLS 1.2 or newer (docs/security.md).",
    "server.tls_key": "The certificate's PEM private key, unencrypted (protect it with file "
    "permissions); set with `tls_cert`.",
    "server.tls_ca": "For clients built from this config (`RlmClient.for_server`): the PEM CA "
    "bundle that verifies `tls_cert`; unset = the system's CAs.",
    "cluster.node_id": "This broker's `node.id`; unset = `node.id` (or `broker.id`) from `meta.properties` "
    "in the log dirs. Needed by every leadership source but `always`.",
    "cluster.leadership": "Who copies a partition: only its leader (docs/cluster.md). `auto`: `kraft` when "
    "a `__cluster_metadata-0` dir is in the log dirs or `[topics] metadata_log_dir` is "
    "set, else `always`; `kraft`: the broker's own KRaft metadata log; `kafka-admin`: "
    "Metadata requests to `bootstrap_servers`; `static`: `[cluster.leaders]`; "
    "`always`: every partition is led here (a single broker).",
    "cluster.bootstrap_servers": '`kafka-admin`: brokers to ask, `"host:port"` (a string or a list).',
    "cluster.security_protocol": "`kafka-admin`: Kafka's `security.protocol` for those connections.",
    "cluster.sasl_mechanism": "`kafka-admin` with `SASL_*`: the SASL mechanism.",
    "cluster.sasl_username": "`kafka-admin` with `SASL_*`: the user name.",
    "cluster.sasl_password_file": "`kafka-admin` with `SASL_*`: a file holding the password (read at "
    "startup, one line; the password is never in the config file).",
    "cluster.ssl_cafile": "`kafka-admin` with `SSL`/`SASL_SSL`: CA bundle (PEM) to verify the brokers; "
    "unset = the system's CAs.",
    "cluster.metadata_refresh_ms": "`kafka-admin`: at most one Metadata request per period (a failed one "
    "too); `kraft` reads the local log on every refresh instead.",
    "cluster.leaders": '`static`: a table `[cluster.leaders]` of `"<topic>-<partition>" = node_id`; '
    "partitions not listed are not led here.",
    "iceberg.catalog": "pyiceberg catalog properties (`type`, `uri`, `warehouse`, `s3.endpoint`, …) as "
    "a table `[iceberg.catalog]`; empty = an embedded SQLite catalog with its "
    "warehouse under `rlm export --out` (docs/iceberg.md).",
    "iceberg.catalog_name": "The name the catalog is opened under (a SQL catalog keys its rows by it).",
    "iceberg.namespace": "Namespace of the table (created when missing).",
    "iceberg.table": "The one table every exported topic goes to, partitioned by `topic` and "
    "`day(timestamp)`.",
    "kafka.listen": "`host:port` of the read-only Kafka-protocol listener in `rlm run` (port 0 = any "
    "free port, logged); empty = off (docs/kafka-listener.md).",
    "kafka.tls_cert": "PEM certificate (chain) of the listener; with `tls_key` clients must use TLS "
    "(`security_protocol` SSL / SASL_SSL).",
    "kafka.tls_key": "PEM private key of `tls_cert`.",
    "kafka.sasl_plain_users_file": "A file of `user:password` lines; when set, clients must "
    "authenticate with SASL/PLAIN before any other request.",
    "kafka.max_request_bytes": "Kafka's `socket.request.max.bytes`: a request frame declaring more "
    "closes the connection.",
    "kafka.idle_timeout_ms": "Kafka's `connections.max.idle.ms`: a connection silent this long (or "
    "stalled inside a frame) is closed.",
    "kafka.max_wait_ms": "Upper bound on a Fetch's `max_wait_ms` (the wait for `min_bytes` of new "
    "data); 0 = never wait.",
}

#: The keys of ``[topics.overrides."<glob>"]`` (rendered under ``[topics]`` in the reference).
OVERRIDE_KEY_DOCS: dict[str, str] = {
    "retention_ms": "Remote retention by time for matching topics (a Kafka topic config wins).",
    "retention_bytes": "Remote retention by size per partition for matching topics.",
    "enabled": "Tier matching topics or not (a topic's own `remote.storage.enable` wins).",
    "archive_compacted": "Tier compacted matching topics as an archive of their pre-compaction history.",
}

_ALLOWED: dict[str, str] = {
    "topics.include": "list of glob patterns",
    "topics.exclude": "list of glob patterns",
    "topics.follow_kafka_configs": "true, false; unset = auto",
    "topics.metadata_log_dir": "path or empty",
    "topics.overrides": "tables",
    "log.dirs": "non-empty list of paths",
    "log.eligibility": "`high-watermark`, `rolled`",
    "remote.backend": "non-empty string",
    "remote.options": "table",
    "remote.compression.codec": ", ".join(f"`{c}`" for c in CODECS),
    "remote.compression.level": f"[{ZSTD_LEVELS[0]}, {ZSTD_LEVELS[1]}]",
    "remote.encryption.key_files": 'table of `<key id> = "<path>"`',
    "remote.encryption.active_key": "a key id of `key_files`, or empty",
    "tiering.state_dir": "path or empty",
    "tiering.keep_old_incarnations": "`true`, `false`",
    "tiering.trust_local_state": "`true`, `false`",
    "server.host": "non-empty string",
    "server.token": "string",
    "server.token_file": "path or empty",
    "server.tls_cert": "path or empty",
    "server.tls_key": "path or empty",
    "server.tls_ca": "path or empty",
    "cluster.leadership": "`auto`, `kraft`, `kafka-admin`, `static`, `always`",
    "cluster.bootstrap_servers": '`"host:port"` list',
    "cluster.security_protocol": "`PLAINTEXT`, `SSL`, `SASL_PLAINTEXT`, `SASL_SSL`",
    "cluster.sasl_mechanism": "`PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`",
    "cluster.sasl_username": "string",
    "cluster.sasl_password_file": "path or empty",
    "cluster.ssl_cafile": "path or empty",
    "cluster.leaders": "table",
    "iceberg.catalog": "table of strings",
    "iceberg.catalog_name": "name without `.` or `/`",
    "iceberg.namespace": "name without `.` or `/`",
    "iceberg.table": "name without `.` or `/`",
    "kafka.listen": '`"host:port"` or empty',
    "kafka.tls_cert": "path or empty",
    "kafka.tls_key": "path or empty",
    "kafka.sasl_plain_users_file": "path or empty",
}


def _allowed(key: str) -> str:
    """The validator's constraint as text: probe it with values just out of range."""
    if key in _ALLOWED:
        return _ALLOWED[key]
    section, name = key.split(".")
    return _constraint(_SCHEMA[section][1][name], key)


def _constraint(check: Validator, key: str) -> str:
    try:
        check(key, "?")
    except ConfigError as err:
        text = str(err).split(": ", 1)[1]
        return (
            text.removeprefix("must be an integer in ")
            .replace("9223372036854775807", "2⁶³−1")
            .replace("2147483647", "2³¹−1")
            .replace("must be true or false", "true, false")
        )
    return ""


def _default_text(value: Any) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(f'"{v}"' for v in value) + "]"
    if isinstance(value, Path):
        return f'"{value}"'
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return "{}"
    return str(value)


def _override_rows() -> list[str]:
    return [
        f'| `overrides."<glob>".{name}` | (unset) | {_constraint(check, name)} | '
        f"{OVERRIDE_KEY_DOCS[name]} | — |"
        for name, check in _OVERRIDE_KEYS.items()
    ]


def _sub_rows(section: str, table: str, value: Any) -> list[str]:
    rows = []
    for name in SUB_KEYS[table]:
        key = f"{section}.{table}.{name}"
        env = f"`{ENV_PREFIX}{section.upper()}__{table.upper()}__{name.upper()}`"
        default = _default_text(getattr(value, name))
        if name == "key_files":
            env += " (TOML inline table)"
        rows.append(f"| `{table}.{name}` | `{default}` | {_ALLOWED[key]} | {KEY_DOCS[key]} | {env} |")
    return rows


def reference_markdown() -> str:
    """Every section, key, default, allowed values and meaning as Markdown tables (README)."""
    out = ["<!-- generated by `python -m rlm.config --reference`; do not edit by hand -->", ""]
    defaults = Settings()
    for section, (cls, validators) in _SCHEMA.items():
        out += [
            f"**`[{section}]`** — {(cls.__doc__ or '').split(':', 1)[-1].strip()}",
            "",
            "| key | default | allowed | meaning | env override |",
            "|---|---|---|---|---|",
        ]
        instance = getattr(defaults, section)
        for name in validators:
            key = f"{section}.{name}"
            if name in SUB_KEYS:  # [remote.compression] / [remote.encryption]: one row per sub-key
                out += _sub_rows(section, name, getattr(instance, name))
                continue
            default = _default_text(getattr(instance, name))
            env = f"`{ENV_PREFIX}{section.upper()}__{name.upper()}`"
            if name == "options":
                env = f"`{ENV_PREFIX}REMOTE__OPTIONS__<NAME>`"
            if key == "iceberg.catalog":
                env = f"`{ENV_PREFIX}ICEBERG__CATALOG__<NAME>`"
            if name in ("overrides", "leaders"):  # keys are case-sensitive names: one inline table
                default, env = "{}", f"`{ENV_PREFIX}{section.upper()}__{name.upper()}` (TOML inline table)"
            out.append(f"| `{name}` | `{default}` | {_allowed(key)} | {KEY_DOCS.get(key, '')} | {env} |")
        if section == "topics":
            out += _override_rows()
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str]) -> int:
    if argv != ["--reference"]:
        print("usage: python -m rlm.config --reference   (Markdown configuration reference)")
        return 2
    print(reference_markdown(), end="")
    return 0
