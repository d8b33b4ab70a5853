"""Kafka's own Java consumer reads rlm's listener as it reads a broker (issue #33): the history the
broker's retention deleted, through Fetch v17 with topic ids and incremental fetch sessions (the
Java client uses both whenever the listener advertises them, docs/kafka-listener.md §5.2, §5.3).

The broker is the oracle: every record the console consumer prints from rlm is the one a consumer
read from the broker before its retention removed it."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rlm.testing.kafka_cluster import KafkaCluster, run_kafka_tool, wait_until
from rlm.testing.sidecar import Record, consume, run_sidecar, segment_bases
from tests.live.helpers import broker_end, broker_log_start, produce, wait_tiered

pytestmark = [pytest.mark.kafka_live, pytest.mark.integration]

SEGMENT = 1024 * 1024  # Kafka 4 refuses a smaller segment.bytes


def _console_consumer(bootstrap: str, topic: str, count: int) -> list[tuple[int, str, str]]:
    """``(offset, key, value)`` of the first ``count`` records of partition 0 that Kafka's
    ConsoleConsumer (kafka-tools 4.1.1, no group) prints from ``bootstrap``."""
    done = run_kafka_tool(
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--partition",
        "0",
        "--offset",
        "earliest",
        "--max-messages",
        str(count),
        "--timeout-ms",
        "60000",
        "--property",
        "print.offset=true",
        "--property",
        "print.key=true",
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = []
    for line in done.stdout.splitlines():
        offset, key, value = line.split("\t")
        rows.append((int(offset.removeprefix("Offset:")), key, value))
    return rows


def _as_printed(records: list[Record]) -> list[tuple[int, str, str]]:
    return [(r.offset, (r.key or b"").decode(), (r.value or b"").decode()) for r in records]


def test_the_java_console_consumer_reads_history_only_rlm_holds(
    kafka_single: KafkaCluster, tmp_path: Path
) -> None:
    topic = "java-reads-rlm"
    node = kafka_single.nodes[0]
    kafka_single.create_topic(topic, configs={"segment.bytes": SEGMENT})
    produce(kafka_single.bootstrap, topic, 4000, value_bytes=1000)  # ~4 segments
    end = broker_end(kafka_single.bootstrap, topic, 0)
    from_broker = consume(kafka_single.bootstrap, topic, 0, 0, end)
    part = node.log_dir / f"{topic}-0"
    with run_sidecar(node, tmp_path / "store", tmp_path / "rlm", topics={"include": [topic]}) as rlm:
        wait_tiered(rlm.url, topic, 0, segment_bases(part)[-1] - 1)
        kafka_single.alter_topic(topic, {"retention.bytes": SEGMENT})
        start = wait_until(
            lambda: broker_log_start(kafka_single.bootstrap, topic, 0),
            timeout=120,
            what="the broker's retention deleting old segments",
        )
        printed = _console_consumer(rlm.kafka_bootstrap, topic, end)
        opened = _metric(rlm.url, "rlm_kafka_fetch_sessions_opened_total")
    assert start > 0  # the first records exist only in rlm now
    assert printed == _as_printed(from_broker)
    assert opened >= 1  # the Java client fetched in a session


def _metric(url: str, name: str) -> float:
    """One unlabelled sample of the daemon's /metrics (prometheus_client's own parser)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return next(
        s.value for family in text_string_to_metric_families(text) for s in family.samples if s.name == name
    )
