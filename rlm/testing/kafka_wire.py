"""Raw Kafka-wire Fetch requests for tests and benches that talk to rlm's Kafka listener frame by
frame (docs/kafka-listener.md) with kafka-python's protocol classes, the independent codec. One builder
instead of a copy of the same eleven-field FetchRequest per test module and bench.
"""

from __future__ import annotations

from collections.abc import Iterable
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
) -> Any:
    """A consumer's FetchRequest (encodable at versions 4..12) asking each ``(topic, partition,
    offset)`` of ``parts`` from that offset, with no fetch session (session id 0, epoch -1), no
    leader epoch and no rack. ``max_wait_ms``/``min_bytes`` as Kafka's long poll; byte limits in
    bytes (``max_bytes`` for the response, ``partition_max_bytes`` per partition);
    ``isolation_level`` 0 = read_uncommitted, 1 = read_committed. Topics keep ``parts``' order."""
    topic = FetchRequest.FetchTopic
    topics: dict[str, list[Any]] = {}
    for name, partition, offset in parts:
        topics.setdefault(name, []).append(
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
        session_id=0,
        session_epoch=-1,
        topics=[topic(topic=name, partitions=ps) for name, ps in topics.items()],
        forgotten_topics_data=[],
        rack_id="",
    )
