"""A lost local remote index beside a live Kafka broker (issue #29 3(a), 3(b); docs/read-path.md
"When the local remote index is missing"). A transactional producer writes committed and aborted
transactions, rlm tiers them, the broker's retention deletes its old segments, then the partition's
``*.remote*`` files are lost: ``rlm lookup`` without a daemon, and a read_committed consumer on a
freshly started ``rlm run``'s listener before or while its first pass rebuilds the family, must
answer exactly as the broker answered before it deleted anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlm.testing.daemon import rlm_cli
from rlm.testing.kafka_cluster import KafkaCluster, wait_until
from rlm.testing.sidecar import consume, run_sidecar, segment_bases
from tests.live.helpers import broker_end, broker_log_start, wait_tiered

pytestmark = [pytest.mark.kafka_live, pytest.mark.integration]

SEGMENT = 1024 * 1024  # Kafka 4 refuses a smaller segment.bytes


def _produce_transactions(bootstrap: str, topic: str, transactions: int, per_txn: int) -> None:
    """``transactions`` transactions of ``per_txn`` 1 kB records; every third one aborted."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"{topic}-txn", acks="all")
    try:
        producer.init_transactions()
        for t in range(transactions):
            producer.begin_transaction()
            for i in range(per_txn):
                producer.send(topic, key=f"t{t}-{i}".encode(), value=f"{t:06d}".encode() * 170, partition=0)
            if t % 3 == 2:
                producer.abort_transaction()
            else:
                producer.commit_transaction()
    finally:
        producer.close(timeout=30)


def test_a_lost_family_is_answered_from_the_store(kafka_single: KafkaCluster, tmp_path: Path) -> None:
    topic = "family-lost"
    node = kafka_single.nodes[0]
    kafka_single.create_topic(topic, configs={"segment.bytes": SEGMENT})
    _produce_transactions(kafka_single.bootstrap, topic, 120, 40)  # ~5 segments
    end = broker_end(kafka_single.bootstrap, topic, 0)
    committed = consume(kafka_single.bootstrap, topic, 0, 0, end, isolation="read_committed")
    assert committed and len(committed) < end  # aborted records and markers never arrive
    part = node.log_dir / f"{topic}-0"
    store, work = tmp_path / "store", tmp_path / "rlm"
    with run_sidecar(node, store, work, topics={"include": [topic]}) as rlm:
        wait_tiered(rlm.url, topic, 0, segment_bases(part)[-1] - 1)
        config = rlm.config
        at_100 = _lookup(config, topic, 100)
    assert at_100["found"], at_100
    kafka_single.alter_topic(topic, {"retention.bytes": SEGMENT})
    wait_until(
        lambda: broker_log_start(kafka_single.bootstrap, topic, 0) > 100,
        timeout=120,
        what="the broker's retention deleting old segments",
    )
    for path in part.glob("*.remote*"):
        path.unlink()  # lost with the disk / removed by hand
    after = _lookup(config, topic, 100)  # no daemon: nothing rebuilds the family meanwhile
    assert after["found"] and after["tier"] == "remote", after  # not "out of range"
    assert [after[k] for k in ("offset", "timestamp", "batch")] == [
        at_100[k] for k in ("offset", "timestamp", "batch")
    ]
    with run_sidecar(
        node, store, work, topics={"include": [topic]}
    ) as rlm:  # read at once: the first pass may be rebuilding
        last = committed[-1].offset + 1
        assert consume(rlm.kafka_bootstrap, topic, 0, 0, last, isolation="read_committed") == committed


def _lookup(config: Path, topic: str, offset: int) -> dict[str, object]:
    done = rlm_cli("lookup", "--config", config, "--topic", topic, "--partition", 0, "--offset", offset)
    assert done.returncode == 0, done.stderr
    doc: dict[str, object] = json.loads(done.stdout)
    return doc
