"""A partition holding everything live producers put into a log, for the restore and dump suites.

:func:`produce_mixed` writes, through real clients, batches of every codec (kafka-python,
idempotent), a committed and an aborted transaction (confluent-kafka / librdkafka: its own batch
layout, COMMIT and ABORT control batches, a ``.txnindex`` entry and producer snapshots), and
records with a null key, a null value, an empty value, multi-byte UTF-8 and several headers (one
with a null value). :func:`roll` closes the active segment so everything produced can be tiered.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rlm.testing.kafka_cluster import wait_until
from rlm.testing.sidecar import segment_bases
from tests.live.helpers import produce

#: The codecs of Kafka's record batches; ``none`` is the producer's ``compression.type`` unset.
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")

_ODD_RECORDS: Sequence[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]] = (
    (None, b"a value without a key", [("h1", b"v1"), ("h2", b"")]),
    (b"tombstone", None, []),
    (b"empty-value", b"", [("null-header", None)]),
    ("clé-ü".encode(), "valeur é ✓ 日本".encode(), [("ünï", "ç".encode())]),
)


def transaction(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    commit: bool,
    compression: str,
    partition: int = 0,
    odd: bool = True,
) -> None:
    """One transaction of ``count`` records (plus the odd ones unless ``odd`` is false: a
    compacted topic refuses a null key) through confluent-kafka, committed or aborted; the same
    ``transactional.id`` each time, so the epoch goes up per call."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"{topic}-txn",
            "compression.type": compression,
            "linger.ms": 5,
        }
    )
    producer.init_transactions(60)
    producer.begin_transaction()
    word = "commit" if commit else "abort"
    for i in range(count):
        producer.produce(
            topic, key=f"{word}-{i}".encode(), value=f"{word} {i} ".encode() * 20, partition=partition
        )
    for key, value, headers in _ODD_RECORDS if odd else ():
        producer.produce(topic, key=key, value=value, headers=headers, partition=partition)
    producer.flush(60)
    if commit:
        producer.commit_transaction(60)
    else:
        producer.abort_transaction(60)


def tombstones(bootstrap: str, topic: str, keys: Sequence[bytes], *, partition: int = 0) -> None:
    """A null value for each key (kafka-python, idempotent, one flush)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    try:
        for key in keys:
            producer.send(topic, key=key, value=None, partition=partition)
        producer.flush(timeout=120)
    finally:
        producer.close(timeout=30)


def produce_mixed(bootstrap: str, topic: str, per_codec: int, *, value_bytes: int = 1000) -> None:
    """Every codec's batches, a committed transaction, more records, an aborted transaction, more
    records: ``5 * per_codec + 2 * per_codec // 4`` idempotent records, two transactions."""
    at = 0
    for codec in CODECS:
        compression = None if codec == "none" else codec
        produce(bootstrap, topic, per_codec, compression=compression, value_bytes=value_bytes, start=at)
        at += per_codec
        if codec == "snappy":
            transaction(bootstrap, topic, per_codec // 10, commit=True, compression="snappy")
        if codec == "lz4":
            transaction(bootstrap, topic, per_codec // 10, commit=False, compression="gzip")
    for compression in ("zstd", None):
        produce(bootstrap, topic, per_codec // 4, compression=compression, value_bytes=value_bytes, start=at)
        at += per_codec // 4


def roll(bootstrap: str, topic: str, partition_dir: Path) -> int:
    """Close the active segment: with ``segment.ms`` set low on the topic, one small record at a
    time until the broker rolls; returns the new active segment's base (everything below it is in
    rolled segments)."""
    before = segment_bases(partition_dir)[-1]

    def rolled() -> int | None:
        produce(bootstrap, topic, 1, value_bytes=16)
        last = segment_bases(partition_dir)[-1]
        return last if last > before else None

    base: int = wait_until(rolled, timeout=120, what=f"{partition_dir.name} rolling past {before}")
    return base
