"""The broker's live log start offsets and high watermarks, asked through ``[cluster] bootstrap_servers``
(docs/visibility.md, docs/operations.md "The high watermark").

Kafka promises that once DeleteRecords returns no consumer reads below the new log start, but it
writes the new start to ``log-start-offset-checkpoint`` only every
``log.flush.start.offset.checkpoint.interval.ms`` (60 s by default) or when a log is deleted. From
the files alone a sidecar serves the deleted records until then. So readers ask the partition's
leader (ListOffsets earliest through kafka-python's admin client, which routes each partition to
its leader) before they serve: :meth:`BrokerLogStarts.log_start` returns an answer asked no earlier
than ``since - max age`` (``[cluster] log_start_max_age_ms``; 0 = asked after the read began).

* Answers are kept per partition. A read that finds none fresh enough asks for its partition and
  for the other partitions of its request (:class:`LogStartQuery`'s ``batch``: a Kafka Fetch for 100
  partitions costs one ListOffsets per leader, not 100). One request at a time: concurrent readers
  wait for it and take its answers when they are fresh enough for them.
* A request that fails (the cluster unreachable, a timeout, authentication) is logged once, and for
  :data:`RETRY_S` no read asks: the files decide, as without this check. A partition the broker
  does not know (a deleted topic) or refuses answers None (the files decide) for :data:`RETRY_S`.

What an answer means is the reader's business (rlm/tiering/read/visibility.py ``broker_delete_point``):
the broker's log start also moves when its local retention deletes segments, and that is not a
deletion for rlm.

:class:`BrokerHighWatermarks` asks the same way for the high watermark (ListOffsets latest,
read_uncommitted). The broker writes it to ``replication-offset-checkpoint`` only every
``replica.high.watermark.checkpoint.interval.ms`` (5 s by default), so a segment rolled just now
waits that long for the file to say it is committed; a leader's copy asks instead
(rlm/tiering/copy/copy_pass.py). What the copy was told, readers use too until the broker
rewrites the file (:meth:`BrokerHighWatermarks.recent`, no request of their own): a consumer then
sees what was just tiered, not only what the checkpoint said up to 5 s before. :class:`BrokerOffsets` is the
machinery both share.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rlm.cluster.kafka_admin import admin_client_config, close_quietly
from rlm.config.brokers import ClusterSettings
from rlm.errors import ConfigError
from rlm.nowait import may_wait

__all__ = [
    "RETRY_S",
    "BrokerHighWatermarks",
    "BrokerLogStarts",
    "BrokerOffsets",
    "LogStartQuery",
    "high_watermarks_of",
]

log = logging.getLogger(__name__)

#: Bound on one ListOffsets request (and on connecting): a read waits at most this long (ms).
ASK_TIMEOUT_MS = 3_000
#: After a failed request, reads use the files alone for this long before asking again (s).
RETRY_S = 5.0

Key = tuple[str, int]
#: Asks the cluster for an offset of each partition: ``{(topic, partition): offset}``.
Lister = Callable[[list[Key]], Mapping[Key, int]]
Spec = Literal["earliest", "latest"]


@dataclass(frozen=True, slots=True)
class _Answer:
    offset: int | None  # None: the broker would not tell (the files decide)
    asked_at: float  # clock() when the request was sent
    retry_at: float  # a None answer stands until then
    asked_ns: int = 0  # time.time_ns() when the request was sent: compared with a file's mtime


class BrokerOffsets:
    """One kind of offset (``spec``: ListOffsets earliest or latest) from the cluster, answers at
    most :meth:`max_age` old (module doc). ``lister``: how to ask (tests); by default kafka-python's
    ``KafkaAdminClient.list_partition_offsets`` with the ``[cluster]`` connection settings,
    created on first use and re-created after a failure. ``what`` names the offset in the log, and
    ``unanswered`` says there what the files deciding means."""

    what = "offset"
    unanswered = ""
    spec: Spec = "earliest"

    def __init__(
        self,
        cluster: ClusterSettings,
        *,
        lister: Lister | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_age_s = self.max_age(cluster)
        self._cluster = cluster
        self._lister = lister
        self._kafka: Any = _kafka() if lister is None else None  # fails at startup, not at a read
        self._client: Any = None
        self._clock = clock
        self._answers: dict[Key, _Answer] = {}
        self._lock = threading.Lock()
        self._down_until = float("-inf")
        self.error: str | None = None
        self.requests = self.failures = 0

    @staticmethod
    def max_age(cluster: ClusterSettings) -> float:
        """How old an answer may be (s): 0, asked anew each time, unless a kind says otherwise."""
        return 0.0

    def now(self) -> float:
        """The clock answers are stamped with: a read's ``since``."""
        return self._clock()

    def offset(self, key: Key, since: float, batch: Iterable[Key] = ()) -> int | None:
        """The broker's offset of ``key`` = (topic, partition), asked no earlier than ``since``
        minus the max age; None when the broker cannot tell now (the files decide). Asks, with
        ``batch``'s partitions that have no fresh answer either, when there is none."""
        found = self._fresh(key, since)
        if found is not None or self._clock() < self._down_until:
            return found.offset if found is not None else None
        may_wait(f"the broker's {self.what}")  # asking it (or another thread asking) takes a while
        with self._lock:
            found = self._fresh(key, since)
            if found is None and self._clock() >= self._down_until:
                wanted = [key, *(k for k in dict.fromkeys(batch) if k != key and not self._fresh(k, since))]
                self._ask(wanted)
                found = self._fresh(key, since)
        return found.offset if found is not None else None

    def _fresh(self, key: Key, since: float) -> _Answer | None:
        got = self._answers.get(key)
        if got is None:
            return None
        if got.asked_at >= since - self.max_age_s:
            return got
        return got if got.offset is None and self._clock() < got.retry_at else None

    def _ask(self, keys: list[Key]) -> None:
        sent, sent_ns = self._clock(), time.time_ns()
        self.requests += 1
        try:
            offsets = self._list(keys)
        except Exception as err:  # the third-party client's errors: see _refused
            if self._refused(err) and len(keys) > 1:
                for key in keys:  # which partition the broker refused: ask each alone
                    if self._clock() < self._down_until:
                        break  # the cluster stopped answering meanwhile
                    self._ask([key])
                return
            self._failed(keys, sent, err)
            return
        if self.error is not None:
            log.info(
                "broker %s: the cluster answers again (%s)",
                self.what,
                ",".join(self._cluster.bootstrap_servers),
            )
            self.error = None
        for key in keys:
            self._answers[key] = _Answer(offsets.get(key), sent, sent + RETRY_S, sent_ns)

    def _failed(self, keys: list[Key], sent: float, err: Exception) -> None:
        self.failures += 1
        text = f"{type(err).__name__}: {err}".rstrip(": ")
        if self._refused(err):  # about these partitions only (a deleted topic, no leader)
            log.info("broker %s of %s: %s; the log dir's files decide", self.what, _names(keys), text)
            for key in keys:
                self._answers[key] = _Answer(None, sent, sent + RETRY_S)
            return
        if self.error != text:
            log.error(
                "broker %s: cannot ask %s: %s; the log dir's files decide (%s)",
                self.what,
                ",".join(self._cluster.bootstrap_servers),
                text,
                self.unanswered,
            )
        self.error = text
        self._down_until = sent + RETRY_S
        self._close_client()

    @staticmethod
    def _refused(err: Exception) -> bool:
        """An error the broker answered for some partitions (unknown topic, not the leader), as
        opposed to one of the connection (kafka-python's BrokerResponseError tree)."""
        try:
            errors = importlib.import_module("kafka.errors")
        except ImportError:
            return False
        return isinstance(err, errors.BrokerResponseError)

    def _list(self, keys: list[Key]) -> Mapping[Key, int]:
        if self._lister is not None:
            return self._lister(keys)
        kafka = self._kafka
        if self._client is None:
            client_id = "rlm-" + self.what.replace(" ", "-")
            self._client = kafka.KafkaAdminClient(**_client_config(self._cluster, kafka, client_id))
        spec = kafka.admin.OffsetSpec.EARLIEST if self.spec == "earliest" else kafka.admin.OffsetSpec.LATEST
        asked = {kafka.TopicPartition(t, p): spec for t, p in keys}
        got = self._client.list_partition_offsets(asked, timeout_ms=ASK_TIMEOUT_MS)
        return {(tp.topic, tp.partition): int(answer.offset) for tp, answer in got.items()}

    def describe(self) -> dict[str, Any]:
        return {
            "bootstrap_servers": list(self._cluster.bootstrap_servers),
            "max_age_ms": int(self.max_age_s * 1000),
            "error": self.error,
            "requests": self.requests,
            "failures": self.failures,
        }

    def _close_client(self) -> None:
        client, self._client = self._client, None
        close_quietly(client)

    def close(self) -> None:
        """Stop the admin client's I/O thread."""
        with self._lock:
            self._close_client()


class BrokerLogStarts(BrokerOffsets):
    """The broker's log start (ListOffsets earliest) for readers, at most ``[cluster]
    log_start_max_age_ms`` old."""

    what = "log start"
    unanswered = "records deleted by DeleteRecords may be served until the broker's checkpoint reaches disk"

    @staticmethod
    def max_age(cluster: ClusterSettings) -> float:
        return max(cluster.log_start_max_age_ms, 0) / 1000

    def log_start(self, key: Key, since: float, batch: Iterable[Key] = ()) -> int | None:
        return self.offset(key, since, batch)


class BrokerHighWatermarks(BrokerOffsets):
    """The broker's high watermark (ListOffsets latest, read_uncommitted) for a leader's copy,
    asked anew each time (module doc)."""

    what = "high watermark"
    unanswered = "a rolled segment waits for the broker's replication-offset-checkpoint"
    spec: Spec = "latest"

    def high_watermark(self, topic: str, partition: int) -> int | None:
        """Asked now; None when the broker cannot tell (the checkpoint decides)."""
        return self.offset((topic, partition), self.now())

    def recent(self, topic: str, partition: int) -> tuple[int, int] | None:
        """(high watermark, ``time.time_ns()`` when asked) of the broker's last answer for the
        partition, None without one. Never asks: readers compare it with the checkpoint file's
        mtime, and use it only while it is the newer (docs/visibility.md)."""
        got = self._answers.get((topic, partition))
        if got is None or got.offset is None:
            return None
        return got.offset, got.asked_ns


def high_watermarks_of(cluster: ClusterSettings) -> BrokerHighWatermarks | None:
    """What a leader's copy asks (module doc): None without ``bootstrap_servers``, or without
    kafka-python (then the checkpoint alone decides, as before; nothing else needs it then)."""
    if not cluster.bootstrap_servers:
        return None
    try:
        return BrokerHighWatermarks(cluster)
    except ConfigError:
        return None


@dataclass(frozen=True, slots=True)
class LogStartQuery:
    """One request's view of :class:`BrokerLogStarts`: answers asked no earlier than ``since``
    (minus the max age); ``batch``: the request's other partitions, asked together."""

    source: BrokerLogStarts
    since: float
    batch: tuple[Key, ...] = ()

    def log_start(self, topic: str, partition: int) -> int | None:
        return self.source.log_start((topic, partition), self.since, self.batch)


def _names(keys: list[Key]) -> str:
    return ", ".join(f"{t}-{p}" for t, p in keys)


def _kafka() -> Any:
    try:
        kafka = importlib.import_module("kafka")
        importlib.import_module("kafka.admin")
    except ImportError:
        raise ConfigError(
            "config key cluster.bootstrap_servers: asking the broker's log start needs kafka-python: "
            "pip install 'rlm[kafka]' (or set cluster.log_start_max_age_ms = -1)"
        ) from None
    return kafka


def _client_config(cluster: ClusterSettings, kafka: Any, client_id: str) -> dict[str, Any]:
    """The ``[cluster]`` connection (as the kafka-admin leadership source's), with the read-sized
    timeout :data:`ASK_TIMEOUT_MS`."""
    known = set(kafka.KafkaAdminClient.DEFAULT_CONFIG)
    config = admin_client_config(cluster, cluster.node_id or 0, known)
    config["client_id"] = client_id
    config["request_timeout_ms"] = ASK_TIMEOUT_MS
    for key in ("bootstrap_timeout_ms", "api_version_auto_timeout_ms"):
        if key in known:
            config[key] = ASK_TIMEOUT_MS
    return config
