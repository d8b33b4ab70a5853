"""``kafka-admin`` leadership: the leaders the cluster reports in Metadata responses (docs/cluster.md).

For brokers whose KRaft metadata log is not on this host (ZooKeeper mode, or a sidecar that cannot
read the broker's disks). kafka-python's :class:`KafkaAdminClient` (the ``kafka`` extra, imported
lazily) sends one Metadata request for all topics at most every ``metadata_refresh_ms``; each
partition's ``leader_id`` and ``leader_epoch`` (Metadata v7+; older brokers: no epoch) are kept
until the next answer. A failed request (unreachable, authentication, timeout) forgets them: every
partition is ``unknown`` (never copied) with the error in the detail and in :meth:`describe`, until
a request succeeds. The next attempt waits for the period too, so an unreachable cluster costs one
bounded connection attempt per period, not one per segment.

Metadata is at most one period old: a broker that lost leadership may copy until its next refresh.
The store's conditional manifest create decides such a race (docs/cluster.md).
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from rlm.cluster.leadership import Leadership, from_leader
from rlm.config.brokers import ClusterSettings, sasl_password
from rlm.errors import ConfigError

__all__ = ["KafkaAdminSource", "admin_client_config", "close_quietly", "parse_metadata"]

log = logging.getLogger(__name__)

#: Bound on one connection attempt / request, so a refresh never stalls a pass for long (ms).
_TIMEOUT_CAP_MS = 10_000
_TIMEOUT_FLOOR_MS = 1_000


@dataclass(frozen=True, slots=True)
class PartitionLeader:
    leader: int
    leader_epoch: int | None  # None: the broker's Metadata version has none (< v7) or sent -1
    replicas: tuple[int, ...] | None = None


def _kafka() -> ModuleType:
    try:
        return importlib.import_module("kafka")
    except ImportError:
        raise ConfigError(
            "config key cluster.leadership = \"kafka-admin\" needs kafka-python: pip install 'rlm[kafka]'"
        ) from None


def admin_client_config(cluster: ClusterSettings, node_id: int, known: set[str]) -> dict[str, Any]:
    """Keyword arguments for ``KafkaAdminClient``; ``known`` = its ``DEFAULT_CONFIG`` keys (the
    bootstrap timeout is ``bootstrap_timeout_ms`` in kafka-python 3, ``api_version_auto_timeout_ms``
    in 2). Reads the SASL password file (ConfigError naming the key when it cannot)."""
    timeout = max(_TIMEOUT_FLOOR_MS, min(cluster.metadata_refresh_ms, _TIMEOUT_CAP_MS))
    config: dict[str, Any] = {
        "bootstrap_servers": list(cluster.bootstrap_servers),
        "client_id": f"rlm-{node_id}",
        "security_protocol": cluster.security_protocol,
        "request_timeout_ms": timeout,
    }
    for key in ("bootstrap_timeout_ms", "api_version_auto_timeout_ms"):
        if key in known:
            config[key] = timeout
    if cluster.security_protocol.startswith("SASL_"):
        config.update(
            sasl_mechanism=cluster.sasl_mechanism,
            sasl_plain_username=cluster.sasl_username,
            sasl_plain_password=sasl_password(cluster),
        )
    if cluster.security_protocol.endswith("SSL") and cluster.ssl_cafile is not None:
        config["ssl_cafile"] = str(cluster.ssl_cafile)
    return config


def parse_metadata(
    topics: list[dict[str, Any]],
) -> tuple[dict[tuple[str, int], PartitionLeader], dict[str, str]]:
    """``describe_topics()`` output → leaders per ``(topic, partition)`` and topic-level errors.

    Reads kafka-python 3's field names (``name``, ``partition_index``, ``leader_id``) and falls
    back to 2's (``topic``, ``partition``, ``leader``).
    """
    leaders: dict[tuple[str, int], PartitionLeader] = {}
    errors: dict[str, str] = {}
    for topic in topics:
        name = topic.get("name", topic.get("topic"))
        if not isinstance(name, str):
            continue
        if topic.get("error_code", 0):
            errors[name] = f"error code {topic['error_code']}"
            continue
        for part in topic.get("partitions", ()):
            index = part.get("partition_index", part.get("partition"))
            leader = part.get("leader_id", part.get("leader"))
            epoch = part.get("leader_epoch")
            replicas = part.get("replica_nodes", part.get("replicas"))
            if isinstance(index, int) and isinstance(leader, int):
                leaders[(name, index)] = PartitionLeader(
                    leader,
                    epoch if isinstance(epoch, int) and epoch >= 0 else None,
                    tuple(replicas) if isinstance(replicas, list) else None,
                )
    return leaders, errors


class KafkaAdminSource:
    """Leaders from Metadata responses; see the module docstring for the refresh rules."""

    name = "kafka-admin"

    def __init__(
        self, cluster: ClusterSettings, node_id: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.node_id: int | None = node_id
        self._kafka = _kafka()
        self._config = admin_client_config(cluster, node_id, set(self._kafka.KafkaAdminClient.DEFAULT_CONFIG))
        self._period_s = cluster.metadata_refresh_ms / 1000
        self._clock = clock
        self._client: Any = None
        self._leaders: dict[tuple[str, int], PartitionLeader] | None = None
        self._topic_errors: dict[str, str] = {}
        self.error: str | None = "no Metadata response yet"
        self.attempted_at: float | None = None  # clock() of the last request, None = never
        self.refreshed_ms: int | None = None  # wall clock of the last successful answer
        self.requests = self.failures = 0
        self._lock = threading.Lock()

    def refresh(self) -> None:
        """Ask the cluster when the last attempt is a period old. Another thread already asking
        is not waited for: until its answer arrives the previous one stands."""
        if not self._due() or not self._lock.acquire(blocking=False):
            return
        try:
            if self._due():
                self.attempted_at = self._clock()
                self._fetch()
        finally:
            self._lock.release()

    def _due(self) -> bool:
        return self.attempted_at is None or self._clock() - self.attempted_at >= self._period_s

    def _fetch(self) -> None:
        self.requests += 1
        try:
            if self._client is None:
                self._client = self._kafka.KafkaAdminClient(**self._config)
            leaders, errors = parse_metadata(self._client.describe_topics())
        # Any failure of the third-party client (its own KafkaError tree, OSError, timeouts, a
        # malformed answer) means the same here: leadership cannot be told until the next answer.
        except Exception as err:
            self.failures += 1
            text = f"{type(err).__name__}: {err}".rstrip(": ")
            if self.error != text:
                log.error(
                    "kafka-admin leadership: cannot read the cluster metadata from %s: %s",
                    ",".join(self._config["bootstrap_servers"]),
                    text,
                )
            self._leaders, self._topic_errors, self.error = None, {}, text
            self._close_client()
            return
        if self.error is not None and self._leaders is None and self.requests > 1:
            log.info("kafka-admin leadership: cluster metadata readable again (%d partitions)", len(leaders))
        self._leaders, self._topic_errors, self.error = leaders, errors, None
        self.refreshed_ms = int(time.time() * 1000)

    def leadership(self, topic: str, partition: int) -> Leadership:
        leaders, error = self._leaders, self.error
        if leaders is None:
            return Leadership("unknown", None, None, self.name, f"cluster metadata unavailable: {error}")
        found = leaders.get((topic, partition))
        if found is None:
            why = self._topic_errors.get(topic)
            detail = (
                f"topic error in the Metadata response: {why}"
                if why
                else ("partition not in the cluster metadata")
            )
            return Leadership("unknown", None, None, self.name, detail)
        return from_leader(self.name, self.node_id, found.leader, found.leader_epoch, found.replicas)

    def describe(self) -> dict[str, Any]:
        leaders = self._leaders
        return {
            "source": self.name,
            "node_id": self.node_id,
            "error": self.error,
            "bootstrap_servers": list(self._config["bootstrap_servers"]),
            "security_protocol": self._config["security_protocol"],
            "refreshed_ms": self.refreshed_ms,
            "requests": self.requests,
            "failures": self.failures,
            "partitions": len(leaders) if leaders is not None else None,
        }

    def _close_client(self) -> None:
        client, self._client = self._client, None
        close_quietly(client)

    def close(self) -> None:
        """Stop the admin client's I/O thread (the daemon calls this on shutdown)."""
        with self._lock:
            self._close_client()


def close_quietly(client: Any) -> None:
    """Close a kafka-python admin client (None: nothing); closing a broken client must not hide
    the error that made the caller drop it, so a failure is only logged."""
    if client is None:
        return
    try:
        client.close()
    except Exception as err:
        log.debug("closing the Kafka admin client: %s", err)
