"""The keys about the Kafka brokers around rlm: ``[cluster]`` (which partitions this broker leads,
so only their leader copies; docs/cluster.md) and ``[kafka]`` (the read-only Kafka-protocol
listener of ``rlm run``; docs/kafka-listener.md), with the checks across each table's keys."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rlm.config import validators as v
from rlm.config.keys import key
from rlm.config.secret_files import check_secret_file
from rlm.errors import ConfigError

__all__ = [
    "ClusterSettings",
    "KafkaSettings",
    "LeadershipMode",
    "SaslMechanism",
    "SecurityProtocol",
    "asks_log_starts",
    "check_cluster",
    "check_kafka",
    "coordinator_servers",
    "sasl_password",
]

LeadershipMode = Literal["auto", "kraft", "kafka-admin", "static", "always"]
SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
GroupsMode = Literal["auto", "refuse"]


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """``[cluster]``: which partitions this broker leads, so only their leader copies (docs/cluster.md)."""

    node_id: int | None = key(
        None,
        v.integer(0, v.INT32_MAX),
        "This broker's `node.id`; unset = `node.id` (or `broker.id`) from `meta.properties` in the "
        "log dirs. Needed by every leadership source but `always`.",
    )
    leadership: LeadershipMode = key(
        "auto",
        v.one_of(LeadershipMode),
        "Who copies a partition: only its leader (docs/cluster.md). `auto`: `kraft` when a "
        "`__cluster_metadata-0` dir is in the log dirs or `[topics] metadata_log_dir` is set, else "
        "`always`; `kraft`: the broker's own KRaft metadata log; `kafka-admin`: Metadata requests "
        "to `bootstrap_servers`; `static`: `[cluster.leaders]`; `always`: every partition is led "
        "here (a single broker).",
    )
    bootstrap_servers: tuple[str, ...] = key(
        (),
        v.servers,
        "`kafka-admin`, the readers' check of the broker's log start (`log_start_max_age_ms`) and a "
        'leader\'s check of its high watermark (docs/operations.md "The high watermark"): '
        'brokers to ask, `"host:port"` (a string or a list).',
    )
    log_start_max_age_ms: int = key(
        0,
        v.integer(0, disabled=-1),
        "With `bootstrap_servers`: how old an answer of the broker's log start (ListOffsets earliest) a "
        "read may use, so records deleted by DeleteRecords are not served before the broker's "
        "`log-start-offset-checkpoint` reaches disk (docs/visibility.md); 0 = asked for each read "
        "that would serve records, -1 = never asked (the log dir's files only).",
    )
    security_protocol: SecurityProtocol = key(
        "PLAINTEXT",
        v.one_of(SecurityProtocol),
        "`kafka-admin`, the log start check and relayed consumer groups (`[kafka] groups`): Kafka's "
        "`security.protocol` for those connections.",
    )
    sasl_mechanism: SaslMechanism = key(
        "PLAIN",
        v.one_of(SaslMechanism),
        "With `SASL_*` (`kafka-admin`, the log start check, relayed groups): the SASL mechanism.",
    )
    sasl_username: str = key(
        "", v.string(), "With `SASL_*` (`kafka-admin`, the log start check, relayed groups): the user name."
    )
    sasl_password_file: Path | None = key(
        None,
        v.optional_file,
        "With `SASL_*` (`kafka-admin`, the log start check, relayed groups): a file holding the "
        "password (read at startup, one line; the password is never in the config file).",
    )
    ssl_cafile: Path | None = key(
        None,
        v.optional_file,
        "With `SSL`/`SASL_SSL` (`kafka-admin`, the log start check, relayed groups): CA bundle "
        "(PEM) to verify the brokers; unset = the system's CAs.",
    )
    metadata_refresh_ms: int = key(
        30_000,
        v.integer(100),
        "`kafka-admin`: at most one Metadata request per period (a failed one too); `kraft` reads "
        "the local log on every refresh instead.",
    )
    leaders: Mapping[str, int] = key(
        {},
        v.leaders,
        '`static`: a table `[cluster.leaders]` of `"<topic>-<partition>" = node_id`; partitions not '
        "listed are not led here.",
        env="inline",
    )


def asks_log_starts(c: ClusterSettings) -> bool:
    """Whether readers ask the broker for its log start before serving (docs/visibility.md)."""
    return bool(c.bootstrap_servers) and c.log_start_max_age_ms >= 0


def check_cluster(c: ClusterSettings) -> None:
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
        and (c.leadership == "kafka-admin" or asks_log_starts(c))
        and not (c.sasl_username and c.sasl_password_file)
    ):
        missing = "cluster.sasl_username" if not c.sasl_username else "cluster.sasl_password_file"
        raise ConfigError(
            f"config key {missing} is empty: security_protocol = "
            f"{c.security_protocol!r} needs a user name and a password file"
        )


def sasl_password(c: ClusterSettings) -> str:
    """The password in ``cluster.sasl_password_file`` (one line; a trailing newline is not part of
    it), for every connection rlm makes to the cluster with ``SASL_*``. ConfigError naming the key
    when it is unset, unreadable, too open (docs/security.md §6) or empty."""
    path = c.sasl_password_file
    if path is None:
        raise ConfigError(
            "config key cluster.sasl_password_file is empty: "
            f"security_protocol = {c.security_protocol!r} needs a password file"
        )
    check_secret_file("cluster.sasl_password_file", path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"config key cluster.sasl_password_file = '{path}': cannot be read: {err}") from err
    password = text.rstrip("\r\n")
    if not password:
        raise ConfigError(f"config key cluster.sasl_password_file = '{path}': the file is empty")
    return password


def check_kafka(k: KafkaSettings) -> None:
    """TLS needs both files; a certificate without its key (or the reverse) is a mistake."""
    if (k.tls_cert is None) != (k.tls_key is None):
        missing = "kafka.tls_key" if k.tls_key is None else "kafka.tls_cert"
        raise ConfigError(f"config key {missing} is empty: TLS needs kafka.tls_cert and kafka.tls_key")


def coordinator_servers(c: ClusterSettings, k: KafkaSettings) -> tuple[str, ...]:
    """The brokers whose group coordinator the listener relays to (docs/kafka-listener.md §6),
    reached with ``[cluster]``'s security settings; empty = groups refused."""
    servers = k.coordinator_bootstrap or c.bootstrap_servers
    if k.groups == "refuse" or not k.listen or not servers:
        return ()
    return servers


@dataclass(frozen=True, slots=True)
class KafkaSettings:
    """``[kafka]``: a read-only Kafka-protocol listener in ``rlm run`` (docs/kafka-listener.md)."""

    listen: str = key(
        "",
        v.listen,
        "`host:port` of the read-only Kafka-protocol listener in `rlm run` (port 0 = any free port, "
        "logged); empty = off (docs/kafka-listener.md).",
    )
    tls_cert: Path | None = key(
        None,
        v.optional_file,
        "PEM certificate (chain) of the listener; with `tls_key` clients must use TLS "
        "(`security_protocol` SSL / SASL_SSL).",
    )
    tls_key: Path | None = key(None, v.optional_file, "PEM private key of `tls_cert`.")
    sasl_plain_users_file: Path | None = key(
        None,
        v.optional_file,
        "A file of `user:password` lines; when set, clients must authenticate with SASL/PLAIN before "
        "any other request.",
    )
    groups: GroupsMode = key(
        "auto",
        v.one_of(GroupsMode),
        "Consumer groups (docs/kafka-listener.md §6). `auto`: with a bootstrap (`coordinator_bootstrap` "
        "or `[cluster] bootstrap_servers`), FindCoordinator names this listener and it relays the group "
        "APIs (JoinGroup … OffsetFetch) to the cluster's coordinator, connecting as `[cluster]` "
        "`security_protocol`, `sasl_*` and `ssl_cafile` say; without a bootstrap, as `refuse`. "
        "`refuse`: FindCoordinator and the group APIs answer GROUP_AUTHORIZATION_FAILED.",
    )
    coordinator_bootstrap: tuple[str, ...] = key(
        (),
        v.servers,
        '`groups = "auto"`: the brokers to ask for a group\'s coordinator, `"host:port"` (a string or a '
        "list); empty = `[cluster] bootstrap_servers`. The `[cluster]` principal's ACLs apply.",
    )
    max_request_bytes: int = key(
        104_857_600,
        v.integer(1024, v.INT32_MAX),
        "Kafka's `socket.request.max.bytes`: a request frame declaring more closes the connection.",
    )
    idle_timeout_ms: int = key(
        600_000,
        v.integer(1000),
        "Kafka's `connections.max.idle.ms`: a connection silent this long (or stalled inside a "
        "frame) is closed.",
    )
    max_wait_ms: int = key(
        30_000,
        v.integer(0, v.INT32_MAX),
        "Upper bound on a Fetch's `max_wait_ms` (the wait for `min_bytes` of new data); 0 = never wait.",
    )
    fetch_max_bytes: int = key(
        57_671_680,
        v.integer(1024, v.INT32_MAX),
        "Kafka's `fetch.max.bytes` (55 MiB): the most record bytes in one Fetch response, whatever "
        "the request's `max_bytes` asks; only the first partition with data may exceed it, by one "
        "whole batch (docs/kafka-listener.md §5).",
    )
    max_connections: int = key(
        1000,
        v.integer(1, 1_000_000),
        "Open connections at most; more are closed at accept. Kafka's `max.connections` is "
        "unbounded; 1000 stays under the common 1024 file-descriptor limit, so a flood of "
        "connections cannot starve the daemon's own files (docs/kafka-listener.md §8).",
    )
    max_fetch_sessions: int = key(
        1000,
        v.integer(0, 1_000_000),
        "Kafka's `max.incremental.fetch.session.cache.slots`: incremental fetch sessions (KIP-227) "
        "kept at most, over all clients; 0 = none, every Fetch is full (docs/kafka-listener.md §5.2).",
    )
