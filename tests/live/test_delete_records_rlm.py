"""rlm's own DeleteRecords beside a live broker (docs/visibility.md "DeleteRecords through rlm"): the
broker's local retention deleted old segments, rlm still serves them; kafka-python's
``delete_records`` against rlm's listener (SASL) raises rlm's log start below the broker's; then
every surface of rlm answers the new start and nothing below it, and what it serves from there is
what a consumer read from the broker before."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from rlm.testing.kafka_cluster import KafkaCluster, wait_until
from rlm.testing.secrets import write_secret
from rlm.testing.sidecar import consume, run_sidecar, segment_bases
from tests.live.helpers import broker_end, broker_log_start, partition_row, produce, wait_tiered
from tests.live.surfaces import cli_lookup, http_lookup, http_records

pytestmark = [pytest.mark.kafka_live, pytest.mark.integration]

SEGMENT = 1024 * 1024  # Kafka 4 refuses a smaller segment.bytes
SASL = {
    "security_protocol": "SASL_PLAINTEXT",
    "sasl_mechanism": "PLAIN",
    "sasl_plain_username": "ops",
    "sasl_plain_password": "pw",
}


def _earliest(bootstrap: str, tp: TopicPartition) -> int:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=20000, **SASL)
    try:
        return int(consumer.beginning_offsets([tp])[tp])
    finally:
        consumer.close()


def test_delete_records_on_rlm_below_the_brokers_log_start(
    kafka_single: KafkaCluster, tmp_path: Path
) -> None:
    topic = "rlm-delete-records"
    tp = TopicPartition(topic, 0)
    node = kafka_single.nodes[0]
    kafka_single.create_topic(topic, configs={"segment.bytes": SEGMENT})
    produce(kafka_single.bootstrap, topic, 4000, value_bytes=1000)  # ~4 segments
    end = broker_end(kafka_single.bootstrap, topic, 0)
    from_broker = consume(kafka_single.bootstrap, topic, 0, 0, end)
    part = node.log_dir / f"{topic}-0"
    users = tmp_path / "users"
    write_secret(users, "ops:pw\n")
    # SASL/PLAIN over loopback without TLS: allowed explicitly (docs/security.md §6)
    sections = {"kafka": {"sasl_plain_users_file": str(users)}, "server": {"allow_insecure_exposure": True}}
    with run_sidecar(
        node, tmp_path / "store", tmp_path / "rlm", topics={"include": [topic]}, sections=sections
    ) as rlm:
        bases = segment_bases(part)
        wait_tiered(rlm.url, topic, 0, bases[-1] - 1)
        kafka_single.alter_topic(topic, {"retention.bytes": SEGMENT})  # the broker's local retention
        broker_start = wait_until(
            lambda: (s := broker_log_start(kafka_single.bootstrap, topic, 0)) > bases[1] and s,
            timeout=60,
            what="the broker's retention deleting two segments",
        )
        point = bases[1] + 7  # below the broker's log start: only rlm holds these offsets
        assert point < broker_start and http_lookup(rlm, topic, point - 1)["found"]

        admin = KafkaAdminClient(bootstrap_servers=rlm.kafka_bootstrap, request_timeout_ms=20000, **SASL)
        try:
            assert admin.delete_records({tp: point})[tp]["low_watermark"] == point
        finally:
            admin.close()

        for offset in (0, bases[1], point - 1):
            looked = http_lookup(rlm, topic, offset)
            assert not looked["found"] and looked["valid_ranges"]["log_start_offset"] == point, looked
            assert http_records(rlm, topic, offset)[0] == 416
        assert not cli_lookup(rlm, topic, point - 1)["found"]  # a process of its own: once
        assert _earliest(rlm.kafka_bootstrap, tp) == point
        assert consume(rlm.kafka_bootstrap, topic, 0, point, end, **SASL) == from_broker[point:]
        row = partition_row(rlm.url, topic, 0)
        assert (row["log_start_offset"], row["delete_records_offset"]) == (point, point)
        assert f"retention (log-start) deleted remote segment 0-{bases[1] - 1} " in rlm.daemon.log_text()
        assert broker_log_start(kafka_single.bootstrap, topic, 0) >= broker_start  # the broker untouched
