"""Raw Kafka-wire Fetch requests for tests and benches that talk to rlm's Kafka listener frame by
frame (docs/kafka-listener.md) with kafka-python's protocol classes, the independent codec. One builder
instead of a copy of the same eleven-field FetchRequest per test module and bench.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from kafka.protocol.consumer import FetchRequest

__all__ = ["fetch_request"]


def fetch_request(
    parts: Iterable[tuple[str, int, int]],
    *,
    max_wait_ms: int = 0,
    min_bytes: int = 0,
    max_bytes: int = 1 << 20,
    partition_max_bytes: int = 1 << 20,
    isolation_level: int = 0,
    session_id: int = 0,
    session_epoch: int = -1,
    forgotten: Iterable[tuple[str, int]] = (),
    topic_ids: Mapping[str, uuid.UUID] | None = None,
) -> Any:
    """A consumer's FetchRequest (encodable at versions 4..17) asking each ``(topic, partition,
    offset)`` of ``parts`` from that offset, with no leader epoch and no rack; by default without
    a fetch session (session id 0, epoch -1). ``max_wait_ms``/``min_bytes`` as Kafka's long poll;
    byte limits in bytes (``max_bytes`` for the response, ``partition_max_bytes`` per partition);
    ``isolation_level`` 0 = read_uncommitted, 1 = read_committed. Partitions keep ``parts``' order
    (consecutive ones of a topic are one request topic).
    ``session_id``/``session_epoch``: KIP-227's (epoch 0 opens a session, > 0 is incremental);
    ``forgotten``: ``(topic, partition)`` the session drops; ``topic_ids``: each topic's id, for
    versions 13+ (which name topics by id only)."""
    ids = dict(topic_ids or {})
    topic = FetchRequest.FetchTopic
    topics: list[
        tuple[str, list[Any]]
    ] = []  # consecutive partitions of a topic: one entry, as Java's builder
    for name, partition, offset in parts:
        if not topics or topics[-1][0] != name:
            topics.append((name, []))
        topics[-1][1].append(
            topic.FetchPartition(
                partition=partition,
                current_leader_epoch=-1,
                fetch_offset=offset,
                last_fetched_epoch=-1,
                log_start_offset=-1,
                partition_max_bytes=partition_max_bytes,
            )
        )
    return FetchRequest(
        replica_id=-1,
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=isolation_level,
        session_id=session_id,
        session_epoch=session_epoch,
        topics=[topic(topic=name, topic_id=ids.get(name), partitions=ps) for name, ps in topics],
        forgotten_topics_data=_forgotten(forgotten, ids),
        rack_id="",
    )


def _forgotten(forgotten: Iterable[tuple[str, int]], ids: Mapping[str, uuid.UUID]) -> list[Any]:
    by_topic: dict[str, list[int]] = {}
    for name, partition in forgotten:
        by_topic.setdefault(name, []).append(partition)
    cls = FetchRequest.ForgottenTopic
    return [cls(topic=name, topic_id=ids.get(name), partitions=ps) for name, ps in by_topic.items()]
