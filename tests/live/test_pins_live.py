"""Pin on sight beside a live Kafka broker (#30 item 2; docs/operations.md "Pins and the broker's
retention"): the issue's measurement — the store down while the broker's retention deletes rolled
segments — now loses nothing. rlm runs with a store that fails every call, so it tiers nothing but
pins what rolled; the operator shrinks ``retention.bytes`` and the broker renames its old segments
to ``.deleted`` and unlinks them ``file.delete.delay.ms`` later; rlm restarted with the store back
tiers them from their pins, and every offset is served by rlm's Kafka listener exactly as the
broker served it before."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlm.testing.configs import faulty_local_options
from rlm.testing.kafka_cluster import KafkaCluster, wait_until
from rlm.testing.sidecar import consume, run_sidecar, segment_bases
from tests.live.helpers import broker_end, broker_log_start, partition_row, produce, wait_tiered

pytestmark = [pytest.mark.kafka_live, pytest.mark.integration]

SEGMENT = 1024 * 1024  # Kafka 4 refuses a smaller segment.bytes


def test_segments_the_broker_deletes_while_the_store_is_down_are_tiered_from_their_pins(
    kafka_single: KafkaCluster, tmp_path: Path
) -> None:
    topic = "pinned-on-sight"
    node = kafka_single.nodes[0]
    kafka_single.create_topic(topic, configs={"segment.bytes": SEGMENT, "file.delete.delay.ms": 1000})
    produce(kafka_single.bootstrap, topic, 5000, value_bytes=1000)  # ~5 segments
    end = broker_end(kafka_single.bootstrap, topic, 0)
    from_broker = consume(kafka_single.bootstrap, topic, 0, 0, end)
    part = node.log_dir / f"{topic}-0"
    rolled = segment_bases(part)[:-1]
    store = tmp_path / "store"
    failing = faulty_local_options(store, {"error_rate": 1.0})

    with run_sidecar(
        node, store, tmp_path / "down", backend="faulty", options=failing, topics={"include": [topic]}
    ) as rlm:
        row = wait_until(
            lambda: (r := partition_row(rlm.url, topic, 0))["pinned_segments"] >= len(rolled) and r,
            timeout=120,
            what="every rolled segment pinned on sight",
        )
        assert row["highest_tiered_offset"] == -1  # the store took nothing
        kafka_single.alter_topic(topic, {"retention.bytes": SEGMENT})
        wait_until(
            lambda: (
                broker_log_start(kafka_single.bootstrap, topic, 0) > 0 and not list(part.glob("*.deleted"))
            ),
            timeout=120,
            what="the broker's retention deleting (and unlinking) old segments",
        )
        gone = [b for b in rolled if not (part / f"{b:020d}.log").exists()]
        assert len(gone) >= 2
        row = partition_row(rlm.url, topic, 0)
        # Waiting, not lost: held by pins below the broker's local start.
        assert row["pending_start_offset"] == 0 < row["local_log_start_offset"]
        assert row["pinned_segments"] >= len(rolled)

    with run_sidecar(
        node, store, tmp_path / "up", topics={"include": [topic]}
    ) as rlm:  # restarted: the pins are files
        rolled_end = segment_bases(part)[-1]
        row = wait_tiered(rlm.url, topic, 0, rolled_end - 1)
        assert row["remote_log_start_offset"] == 0
        assert consume(rlm.kafka_bootstrap, topic, 0, 0, end) == from_broker
        wait_until(
            lambda: partition_row(rlm.url, topic, 0)["pinned_segments"] == 0, timeout=60, what="pins dropped"
        )
    log = (tmp_path / "up" / f"rlm-{node.node_id}.log").read_text()
    assert "deleted by the log store before it was copied" not in log
    assert "copying it from its pin" in log
