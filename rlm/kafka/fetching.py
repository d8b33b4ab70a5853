"""A Fetch request through the listener in Kafka's three steps (``KafkaApis.handleFetchRequest``;
docs/kafka-listener.md §5): **plan** (the fetch session's context, topic ids resolved to names),
**read** (the partitions in the plan's order within the response's byte budget; again while a
Fetch waits for ``min_bytes``), **render** (once, for the answer that goes out: the session is
created or its cached offsets updated, and an incremental answer keeps only the partitions that
must respond).

Topics are named below Fetch v13 and given by id from v13 (``topic_id``); a session keeps the form
it was created with. Sessions exist from Fetch v7; a v4–v6 request has none.
"""

from __future__ import annotations

import uuid
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Any

from kafka.protocol.consumer import FetchResponse

from rlm.cluster.log_starts import LogStartQuery
from rlm.kafka.protocol import Codes
from rlm.kafka.reads import FetchedPartition, fetch_partition, offsets_only, partition_marks
from rlm.kafka.sessions import CachedPartition, FetchSessionCache, PartitionKey, SessionContext, open_context
from rlm.kafka.topic_ids import NO_TOPIC_ID, TopicIds
from rlm.tiering.read import TieredReaders

__all__ = ["FetchPlan", "FetchRead", "Wanted", "plan_fetch", "read_plan", "render"]

#: The first Fetch version with a session (KIP-227) and the first naming topics by id (KIP-516).
SESSION_VERSION, TOPIC_ID_VERSION = 7, 13


@dataclass(frozen=True, slots=True)
class Wanted:
    """One partition to read: ``key`` as the session keys it (topic name, or the id's text from
    v13), ``name`` the topic rlm reads (None: an id no served topic has), and the asked fields
    (for an incremental fetch, the session's own cached entry)."""

    key: PartitionKey
    name: str | None
    topic_id: uuid.UUID
    partition: int
    ask: CachedPartition


@dataclass(frozen=True, slots=True)
class FetchPlan:
    """What one Fetch request reads, in which order, and how its answer is rendered."""

    version: int
    committed: bool
    context: SessionContext
    wanted: list[Wanted]

    def marks(
        self, readers: TieredReaders, query: LogStartQuery | None = None
    ) -> tuple[tuple[int, int], ...]:
        """Per wanted partition, ``(log start, visible end)`` now, no record read (a waiting
        Fetch's re-check, compared with :attr:`FetchRead.marks`). ``query``: the last read's
        (:attr:`FetchRead.query`), so a re-check takes the broker's answers that read had."""
        return tuple(
            partition_marks(readers, w.name, w.partition, w.ask.fetch_offset, query) if w.name else (-2, -2)
            for w in self.wanted
        )


@dataclass(frozen=True, slots=True)
class FetchRead:
    """One read of a plan: a result per wanted partition (same order), the record bytes, and
    whether a partition failed (the answer then goes out at once)."""

    results: list[FetchedPartition]
    record_bytes: int
    errors: bool
    query: LogStartQuery | None = None  # its question to the broker about log starts

    @property
    def marks(self) -> tuple[tuple[int, int], ...]:
        """``(log start, high watermark)`` of each result: what this read saw."""
        return tuple((r.log_start_offset, r.high_watermark) for r in self.results)


def plan_fetch(req: Any, version: int, sessions: FetchSessionCache, ids: TopicIds) -> FetchPlan:
    """The request's session context (Kafka's ``FetchManager.newContext``) and the partitions it
    reads: the request's, in request order, for a full or sessionless fetch; the session's, in the
    session's order, for an incremental one; none for a whole-request error."""
    by_id = version >= TOPIC_ID_VERSION
    names: dict[uuid.UUID, str | None] = {}

    def topic_of(t: Any) -> tuple[str, str | None, uuid.UUID]:
        if not by_id:
            return t.topic, t.topic, NO_TOPIC_ID
        if t.topic_id not in names:
            names[t.topic_id] = ids.name_of(t.topic_id)
        return str(t.topic_id), names[t.topic_id], t.topic_id

    asked: list[Wanted] = []
    for t in req.topics:
        key_topic, name, topic_id = topic_of(t)
        for p in t.partitions:
            ask = CachedPartition(p.fetch_offset, p.partition_max_bytes, p.current_leader_epoch)
            asked.append(Wanted((key_topic, p.partition), name, topic_id, p.partition, ask))
    committed = bool(req.isolation_level)
    if version < SESSION_VERSION:
        return FetchPlan(version, committed, SessionContext("sessionless"), asked)
    forgotten = [
        (topic_of(f)[0], partition) for f in req.forgotten_topics_data or () for partition in f.partitions
    ]
    context = open_context(
        sessions, req.session_id, req.session_epoch, by_id, ((w.key, w.ask) for w in asked), forgotten
    )
    if context.kind == "error":
        return FetchPlan(version, committed, context, [])
    if context.kind != "incremental":
        return FetchPlan(version, committed, context, asked)
    assert context.session is not None
    wanted = []
    for key, cached in context.session.partitions.items():
        topic_id = uuid.UUID(key[0]) if by_id else NO_TOPIC_ID
        if by_id and topic_id not in names:
            names[topic_id] = ids.name_of(topic_id)
        name = names[topic_id] if by_id else key[0]
        wanted.append(Wanted(key, name, topic_id, key[1], cached))
    return FetchPlan(version, committed, context, wanted)


def read_plan(
    readers: TieredReaders,
    plan: FetchPlan,
    budget: int,
    reader_key: Hashable,
    query: LogStartQuery | None,
    results: list[FetchedPartition] | None = None,
) -> FetchRead:
    """One pass over the plan's partitions, as Kafka's ``ReplicaManager.readFromLog``: ``budget``
    record bytes in all; each partition gets at most its ``max_bytes`` and what is left, in whole
    batches — except that the first partition with records gets one whole batch however large
    ("minOneMessage", KIP-74). A later partition whose next batch does not fit answers offsets only.
    ``results``: the partitions read so far, appended to as each is read — a pass that stopped
    (:func:`rlm.nowait.may_wait`) goes on from the first partition it did not answer."""
    results = [] if results is None else results
    total = sum(len(got.records) for got in results)
    for w in plan.wanted[len(results) :]:
        limit = min(w.ask.max_bytes, budget - total)
        got = _read_one(readers, w, plan.committed, limit, total > 0, reader_key, query)
        total += len(got.records)
        results.append(got)
    return FetchRead(results, total, any(got.error != Codes.NONE for got in results), query)


def _read_one(
    readers: TieredReaders,
    w: Wanted,
    committed: bool,
    limit: int,
    started: bool,
    reader_key: Hashable,
    query: LogStartQuery | None,
) -> FetchedPartition:
    """``limit``: the partition's share of the budget; ``started``: a partition before this one
    answered records, so the one-batch exception is used up."""
    if w.name is None:
        return FetchedPartition(Codes.UNKNOWN_TOPIC_ID)
    current = w.ask.current_leader_epoch  # checked where the partition's reader is made
    if started and limit <= 0:
        return offsets_only(readers, w.name, w.partition, query, current)
    got = fetch_partition(
        readers, w.name, w.partition, w.ask.fetch_offset, limit, committed, reader_key, query, current
    )
    if started and len(got.records) > limit:  # its first batch does not fit: offsets only
        return FetchedPartition(
            got.error,
            got.high_watermark,
            got.last_stable_offset,
            got.log_start_offset,
            b"",
            [] if committed else None,
        )
    return got


def render(plan: FetchPlan, read: FetchRead, sessions: FetchSessionCache) -> Any:
    """The response body for the answer that goes out — called once per request: a full fetch
    (v7+, epoch 0) creates its session here, an incremental one updates what each cached partition
    was told and keeps only those that must respond (Kafka's ``updateAndGenerateResponseData``)."""
    context = plan.context
    if context.kind == "error":
        return FetchResponse(throttle_time_ms=0, error_code=context.error, session_id=0, responses=[])
    pairs = list(zip(plan.wanted, read.results, strict=True))
    session_id = 0
    if context.kind == "full" and plan.version >= SESSION_VERSION:
        told = [(w.key, _told(w.ask, got)) for w, got in pairs]
        session_id = sessions.create(told, plan.version >= TOPIC_ID_VERSION)
    elif context.kind == "incremental":
        assert context.session is not None
        session_id = context.session.id
        kept = []
        for w, got in pairs:
            if w.ask.must_respond(
                got.high_watermark, got.last_stable_offset, got.log_start_offset, got.error, bool(got.records)
            ):
                kept.append((w, got))
                if got.records:
                    context.session.answered(w.key)
        pairs = kept
    return FetchResponse(
        throttle_time_ms=0, error_code=Codes.NONE, session_id=session_id, responses=list(_topics(pairs))
    )


def _told(ask: CachedPartition, got: FetchedPartition) -> CachedPartition:
    """A new session's entry: what was asked and what this answer told (an error: told nothing)."""
    hw = -1 if got.error else got.high_watermark
    return CachedPartition(
        ask.fetch_offset,
        ask.max_bytes,
        ask.current_leader_epoch,
        hw,
        got.last_stable_offset,
        got.log_start_offset,
    )


def _topics(pairs: list[tuple[Wanted, FetchedPartition]]) -> Iterator[Any]:
    """Consecutive partitions of one topic as one response topic, in the plan's order."""
    cls = FetchResponse.FetchableTopicResponse
    topic: Any = None
    for w, got in pairs:
        if topic is None or (topic.topic, topic.topic_id) != (w.key[0], w.topic_id):
            if topic is not None:
                yield topic
            topic = cls(topic=w.key[0], topic_id=w.topic_id, partitions=[])
        topic.partitions.append(_partition_data(w.partition, got))
    if topic is not None:
        yield topic


def _partition_data(partition: int, got: FetchedPartition) -> Any:
    data = FetchResponse.FetchableTopicResponse.PartitionData
    aborted = (
        None
        if got.aborted is None
        else [data.AbortedTransaction(producer_id=pid, first_offset=first) for pid, first in got.aborted]
    )
    return data(
        partition_index=partition,
        error_code=got.error,
        high_watermark=got.high_watermark,
        last_stable_offset=got.last_stable_offset,
        log_start_offset=got.log_start_offset,
        aborted_transactions=aborted,
        preferred_read_replica=-1,
        records=got.records,
    )
