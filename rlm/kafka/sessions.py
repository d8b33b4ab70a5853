"""Fetch sessions (KIP-227): the cache of incremental fetch sessions, with Kafka's rules
(``FetchManager.newContext``, ``FetchSessionCacheShard``; docs/kafka-listener.md).

A consumer's first Fetch with ``session_epoch`` 0 is *full*: it names every partition, and the
answer may create a session (an id in [1, 2^31 - 1), epoch 1). Later Fetches with that id and the
session's current epoch are *incremental*: they name only the partitions whose fetch offset or
limits changed (and those to forget), and the answer lists only the partitions that must respond
(records, a changed high watermark, last stable offset or log start, or an error). Epoch -1 closes
a session. Pure: no I/O, the clock is injected (milliseconds), one lock (the listener's handlers
run in a thread pool).

Partitions are keyed by ``(topic, partition)`` where ``topic`` is the name (Fetch < v13) or the
topic id (v13+); a session keeps the form it was created with (``uses_topic_ids``).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from rlm.kafka.protocol import Codes

__all__ = [
    "EVICTION_MS",
    "FINAL_EPOCH",
    "INITIAL_EPOCH",
    "MAX_SESSION_PARTITIONS",
    "CachedPartition",
    "FetchSession",
    "FetchSessionCache",
    "PartitionKey",
    "SessionContext",
    "next_epoch",
    "open_context",
]

#: A fetch request's session epoch that asks for a full fetch and a new session.
INITIAL_EPOCH = 0
#: A fetch request's session epoch that closes its session (a full, sessionless fetch).
FINAL_EPOCH = -1
#: Kafka's MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS: a session idle this long (ms) is stale and
#: evicted first; a session younger than this (since its creation) is not evicted for a bigger one.
EVICTION_MS = 120_000
_MAX_EPOCH = 2**31 - 1
#: Partitions one session holds at most. Kafka sets no such bound, but a client may be hostile: a
#: 100 MiB request names millions of partitions, each cached for minutes. A full Fetch naming more
#: gets no session (its client keeps sending full Fetches); an incremental one growing a session
#: past it ends the session (FETCH_SESSION_ID_NOT_FOUND: the client starts over with a full Fetch).
MAX_SESSION_PARTITIONS = 100_000

#: ``(topic name or topic id, partition)``.
PartitionKey = tuple[str, int]


def next_epoch(epoch: int) -> int:
    """The session epoch after ``epoch``: +1, wrapping from 2^31 - 1 to 1 (never 0 or -1)."""
    return 1 if epoch >= _MAX_EPOCH else epoch + 1


@dataclass(slots=True)
class CachedPartition:
    """One partition of a session: what the consumer asks (``fetch_offset``, ``max_bytes``,
    ``current_leader_epoch``, -1 = unchecked) and what it was last told (``high_watermark``,
    ``last_stable_offset``, ``log_start_offset``; -1 = not yet, or reset by an error so the next
    answer reports them again)."""

    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int = -1
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1

    def must_respond(
        self, high_watermark: int, last_stable_offset: int, log_start_offset: int, error: int, records: bool
    ) -> bool:
        """Whether an incremental answer lists this partition (Kafka's ``maybeUpdateResponseData``),
        remembering what it reports: records, an error, or any offset the consumer was not told."""
        respond = records
        if high_watermark != self.high_watermark:
            self.high_watermark, respond = high_watermark, True
        if last_stable_offset != self.last_stable_offset:
            self.last_stable_offset, respond = last_stable_offset, True
        if log_start_offset != self.log_start_offset:
            self.log_start_offset, respond = log_start_offset, True
        if error != 0:
            self.high_watermark, respond = -1, True  # report the offsets again once it recovers
        return respond


@dataclass(slots=True)
class FetchSession:
    """One consumer's session. ``partitions`` is ordered: a partition that answered with records
    moves to the end (:meth:`answered`), so a byte-limited answer serves the others next time."""

    id: int
    uses_topic_ids: bool
    created_ms: int
    last_used_ms: int
    epoch: int
    partitions: dict[PartitionKey, CachedPartition] = field(default_factory=dict)
    #: Set when touched: whether the session had lived EVICTION_MS then (Kafka's evictableByAll).
    evictable: bool = False

    def update(
        self, upserts: Iterable[tuple[PartitionKey, CachedPartition]], forgotten: Iterable[PartitionKey]
    ) -> None:
        """An incremental request's changes: new or changed partitions (their asked fields replace
        the cached ones; what the consumer was told is kept), then the forgotten ones removed."""
        for key, asked in upserts:
            cached = self.partitions.get(key)
            if cached is None:
                self.partitions[key] = asked
            else:
                cached.fetch_offset, cached.max_bytes = asked.fetch_offset, asked.max_bytes
                cached.current_leader_epoch = asked.current_leader_epoch
        for key in forgotten:
            self.partitions.pop(key, None)

    def answered(self, key: PartitionKey) -> None:
        """``key`` returned records: it goes to the end of the session's order."""
        cached = self.partitions.pop(key, None)
        if cached is not None:
            self.partitions[key] = cached


class FetchSessionCache:
    """At most ``max_sessions`` sessions (Kafka's ``max.incremental.fetch.session.cache.slots``;
    0 = no sessions: every fetch is full). ``clock``: milliseconds, monotonic."""

    def __init__(
        self, max_sessions: int, clock: Callable[[], int] | None = None, seed: int | None = None
    ) -> None:
        self.max_sessions = max_sessions
        self._clock = clock or (lambda: time.monotonic_ns() // 1_000_000)
        self._sessions: dict[int, FetchSession] = {}
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def partitions(self) -> int:
        """Partitions cached over all sessions."""
        with self._lock:
            return sum(len(s.partitions) for s in self._sessions.values())

    def get(self, session_id: int) -> FetchSession | None:
        with self._lock:
            return self._sessions.get(session_id)

    def remove(self, session_id: int) -> FetchSession | None:
        with self._lock:
            return self._sessions.pop(session_id, None)

    def touch(self, session: FetchSession) -> None:
        """The session was used now: it is no longer idle; old enough, it becomes evictable."""
        now = self._clock()
        with self._lock:
            session.last_used_ms = now
            session.evictable = now - session.created_ms > EVICTION_MS

    def create(self, partitions: Sequence[tuple[PartitionKey, CachedPartition]], uses_topic_ids: bool) -> int:
        """A new session holding ``partitions`` (in order) after a full fetch: its id, or 0 when
        the cache is full and nothing may be evicted for it (Kafka's ``maybeCreateSession``)."""
        now = self._clock()
        with self._lock:
            if self.max_sessions <= 0 or len(partitions) > MAX_SESSION_PARTITIONS:
                return 0
            if len(self._sessions) >= self.max_sessions and not self._evict_for(len(partitions), now):
                return 0
            session_id = self._new_id()
            self._sessions[session_id] = FetchSession(
                session_id, uses_topic_ids, now, now, next_epoch(INITIAL_EPOCH), dict(partitions)
            )
            return session_id

    def _new_id(self) -> int:
        while True:
            candidate = self._random.randint(1, _MAX_EPOCH - 1)
            if candidate not in self._sessions:
                return candidate

    def _evict_for(self, size: int, now: int) -> bool:
        """Make room for a session of ``size`` partitions: the least recently used session if it
        is stale, else the smallest evictable one when the new one is bigger (Kafka compares
        ``(privileged, size, id)`` with the new session's id 0: equal sizes keep the old one)."""
        stalest = min(self._sessions.values(), key=lambda s: (s.last_used_ms, s.id))
        if now - stalest.last_used_ms > EVICTION_MS:
            del self._sessions[stalest.id]
            self.evictions += 1
            return True
        evictable = [s for s in self._sessions.values() if s.evictable]
        if not evictable:
            return False
        smallest = min(evictable, key=lambda s: (len(s.partitions), s.id))
        if (size, 0) < (len(smallest.partitions), smallest.id):
            return False
        del self._sessions[smallest.id]
        self.evictions += 1
        return True


@dataclass(frozen=True, slots=True)
class SessionContext:
    """How one Fetch request is answered (Kafka's ``FetchContext`` kinds):

    * ``full`` — read every partition the request names; afterwards :meth:`FetchSessionCache.create`
      may make a session of them (the response carries its id, or 0);
    * ``sessionless`` — read the request's partitions, answer with session id 0 (epoch -1, or an
      incremental request that forgot its last partition);
    * ``incremental`` — read ``session``'s partitions in its order, answer only those that must
      respond, with the session's id;
    * ``error`` — answer ``error`` for the whole request, session id 0, no partitions.
    """

    kind: Literal["full", "sessionless", "incremental", "error"]
    session: FetchSession | None = None
    error: int = 0


def open_context(
    cache: FetchSessionCache,
    session_id: int,
    epoch: int,
    uses_topic_ids: bool,
    upserts: Iterable[tuple[PartitionKey, CachedPartition]] = (),
    forgotten: Iterable[PartitionKey] = (),
) -> SessionContext:
    """Kafka's ``FetchManager.newContext`` for a request with ``session_id`` and ``epoch``: a full
    request (epoch 0 or -1) drops the session it names; an incremental one (epoch > 0) must name a
    cached session of the same topic form (``uses_topic_ids``: Fetch v13+) at its current epoch,
    whose partitions it then updates, and the session's epoch advances."""
    if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
        if session_id:
            cache.remove(session_id)
        return SessionContext("sessionless" if epoch == FINAL_EPOCH else "full")
    session = cache.get(session_id)
    if session is None:
        return SessionContext("error", error=Codes.FETCH_SESSION_ID_NOT_FOUND)
    if session.uses_topic_ids != uses_topic_ids:
        return SessionContext("error", error=Codes.FETCH_SESSION_TOPIC_ID_ERROR)
    if session.epoch != epoch:
        return SessionContext("error", error=Codes.INVALID_FETCH_SESSION_EPOCH)
    session.update(upserts, forgotten)
    if not session.partitions:
        cache.remove(session.id)
        return SessionContext("sessionless")
    if len(session.partitions) > MAX_SESSION_PARTITIONS:
        cache.remove(session.id)
        return SessionContext("error", error=Codes.FETCH_SESSION_ID_NOT_FOUND)
    cache.touch(session)
    session.epoch = next_epoch(session.epoch)
    return SessionContext("incremental", session)
