"""The broker's retention is local retention (docs/topic-policy.md §1), beside a live Kafka broker:
the issue's scenario. Records tiered by rlm, then the operator sets ``retention.bytes`` to keep the
broker's disk small; the broker deletes its old segments, rlm deletes nothing remote, and every
offset is still served by rlm's Kafka listener exactly as the broker served it before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlm.testing.kafka_cluster import KafkaCluster, wait_until
from rlm.testing.sidecar import consume, run_sidecar, segment_bases
from tests.live.helpers import broker_end, broker_log_start, partition_row, produce, wait_tiered

pytestmark = [pytest.mark.kafka_live, pytest.mark.integration]

SEGMENT = 1024 * 1024  # Kafka 4 refuses a smaller segment.bytes


def test_broker_retention_deletes_local_segments_only(kafka_single: KafkaCluster, tmp_path: Path) -> None:
    topic = "retention-is-local"
    node = kafka_single.nodes[0]
    kafka_single.create_topic(topic, configs={"segment.bytes": SEGMENT})
    produce(kafka_single.bootstrap, topic, 5000, value_bytes=1000)  # ~5 segments
    end = broker_end(kafka_single.bootstrap, topic, 0)
    from_broker = consume(kafka_single.bootstrap, topic, 0, 0, end)
    part = node.log_dir / f"{topic}-0"
    with run_sidecar(node, tmp_path / "store", tmp_path / "rlm", topics={"include": [topic]}) as rlm:
        rolled_end = segment_bases(part)[-1]  # the active segment's base: what rolled ends here
        wait_tiered(rlm.url, topic, 0, rolled_end - 1)
        kafka_single.alter_topic(topic, {"retention.bytes": SEGMENT})
        wait_until(
            lambda: broker_log_start(kafka_single.bootstrap, topic, 0) > 0,
            timeout=120,
            what="the broker's retention deleting old segments",
        )
        seen = wait_until(
            lambda: _policy_seen(rlm.url, topic), timeout=60, what="rlm reading retention.bytes"
        )
        assert seen["policy"]["retention_bytes"]["value"] == -1
        # Two more rolled segments tiered one after the other: the pass that tiered the first
        # ended (retention included) before the next began, with the new config in force.
        for _ in range(2):
            produce(kafka_single.bootstrap, topic, 1100, value_bytes=1000, start=end)
            end = broker_end(kafka_single.bootstrap, topic, 0)
            wait_until(lambda last=rolled_end: segment_bases(part)[-1] > last, timeout=60, what="a roll")
            rolled_end = segment_bases(part)[-1]
            row = wait_tiered(rlm.url, topic, 0, rolled_end - 1)
        assert row["remote_log_start_offset"] == 0 and row["log_start_offset"] == 0
        assert row["local_log_start_offset"] > 0  # the broker really deleted what rlm keeps
        assert consume(rlm.kafka_bootstrap, topic, 0, 0, len(from_broker)) == from_broker
    log = (tmp_path / "rlm" / f"rlm-{node.node_id}.log").read_text()
    assert "deleted remote segment" not in log


def _policy_seen(url: str, topic: str) -> dict[str, Any] | None:
    """rlm's row once its policy shows the topic's retention.bytes as the broker's local limit."""
    row = partition_row(url, topic, 0)
    local = row["policy"]["local_retention_bytes"]
    return row if (local["value"], local["from"]) == (SEGMENT, "retention.bytes on the topic") else None
