"""Steps the live-broker suites share: produce through a real producer, read rlm's status."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

from rlm.formats.checkpoint import parse_offset_checkpoint
from rlm.testing.kafka_cluster import wait_until


def produce(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    partition: int = 0,
    value_bytes: int = 1000,
    compression: str | None = None,
    start: int = 0,
    **config: Any,
) -> None:
    """``count`` records with distinct keys, values and headers (kafka-python, acks=all,
    idempotent), flushed. Values are random bytes so a compression codec cannot shrink them away."""
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        compression_type=compression,
        linger_ms=5,
        **config,
    )
    try:
        for i in range(start, start + count):
            value = f"{i:08d}".encode() + os.urandom(value_bytes // 2).hex().encode()[: value_bytes - 8]
            headers = [("n", str(i).encode())]
            producer.send(topic, key=f"k{i}".encode(), value=value, headers=headers, partition=partition)
        producer.flush(timeout=120)
    finally:
        producer.close(timeout=30)


def partition_row(url: str, topic: str, partition: int) -> dict[str, Any]:
    """rlm's status row of ``topic-partition`` (``GET /v1/partitions``)."""
    with urllib.request.urlopen(url + "/v1/partitions", timeout=10) as resp:
        rows = json.load(resp)
    rows = rows["partitions"] if isinstance(rows, dict) else rows
    return next(r for r in rows if r["topic"] == topic and r["partition"] == partition)


def wait_tiered(url: str, topic: str, partition: int, offset: int, timeout: float = 120) -> dict[str, Any]:
    """Until rlm's highest tiered offset of the partition is at least ``offset``."""

    def reached() -> dict[str, Any] | None:
        row = partition_row(url, topic, partition)
        tiered = row.get("highest_tiered_offset")
        return row if tiered is not None and tiered >= offset else None

    got: dict[str, Any] = wait_until(reached, timeout=timeout, what=f"{topic}-{partition} tiered to {offset}")
    return got


def broker_log_start(bootstrap: str, topic: str, partition: int) -> int:
    """The broker's log start offset (ListOffsets earliest)."""
    from kafka import KafkaConsumer, TopicPartition

    tp = TopicPartition(topic, partition)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=20000)
    try:
        return int(consumer.beginning_offsets([tp])[tp])
    finally:
        consumer.close()


def broker_end(bootstrap: str, topic: str, partition: int) -> int:
    """The broker's high watermark (ListOffsets latest, read_uncommitted)."""
    from kafka import KafkaConsumer, TopicPartition

    tp = TopicPartition(topic, partition)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=20000)
    try:
        return int(consumer.end_offsets([tp])[tp])
    finally:
        consumer.close()


def checkpointed_high_watermark(log_dir: Path, topic: str, partition: int) -> int:
    """The high watermark the broker last wrote to ``replication-offset-checkpoint`` (-1 when the
    partition is not in it yet). rlm copies by this file, which the broker rewrites only every
    ``replica.high.watermark.checkpoint.interval.ms``: a segment that just rolled is eligible only
    once the checkpoint has caught up with it."""
    path = log_dir / "replication-offset-checkpoint"
    entries = parse_offset_checkpoint(path.read_bytes()).entries if path.exists() else {}
    return entries.get((topic, partition), -1)


def librdkafka_consumer(bootstrap: str, group: str, topic: str) -> Any:
    """A confluent-kafka (librdkafka) consumer of ``topic`` in ``group``, from the earliest offset
    when the group has no commit, committing only when told."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 200,
        }
    )
    consumer.subscribe([topic])
    return consumer


def committed_at_broker(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets of ``topic`` per partition, as the live broker's coordinator
    has them (its admin API)."""
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        got = admin.list_group_offsets(group)[group]
    finally:
        admin.close()
    return {tp.partition: meta.offset for tp, meta in got.items() if tp.topic == topic}
