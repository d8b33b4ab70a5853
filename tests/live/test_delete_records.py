"""DeleteRecords on a live broker (issue #29): once the call returns, no surface of rlm serves an
offset below the new log start — not the local records the broker still keeps on disk, not the ones
rlm tiered — and rlm's retention then deletes the remote segments wholly below it (docs/visibility.md).

The broker writes its new log start to ``log-start-offset-checkpoint`` only every
``log.flush.start.offset.checkpoint.interval.ms`` (an hour on the test brokers,
tests/kafkaservers.py) or when a topic is deleted; until then only the broker itself knows it. rlm
asks it through ``[cluster] bootstrap_servers`` (defect (c) of the issue: the listener went on
serving the deleted records until the checkpoint reached disk).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka import TopicPartition

from rlm.testing.kafka_cluster import KafkaCluster, wait_until
from rlm.testing.sidecar import Sidecar, consume, run_sidecar, segment_bases
from tests.live.helpers import (
    broker_end,
    broker_log_start,
    checkpointed_high_watermark,
    partition_row,
    produce,
    wait_tiered,
)
from tests.live.surfaces import assert_not_served, first_served, listener_fetch, log_start_entries

pytestmark = [pytest.mark.kafka_live, pytest.mark.integration]

MiB = 1024 * 1024


def _delete_records(kafka: KafkaCluster, topic: str, point: int) -> None:
    with kafka.admin() as admin:
        admin.delete_records({TopicPartition(topic, 0): point})
    assert broker_log_start(kafka.bootstrap, topic, 0) == point


def _flush_log_starts(kafka: KafkaCluster, node_log_dir: Path, topic: str, point: int) -> None:
    """Make the broker write its log starts to disk now: deleting a topic rewrites the log dir's
    checkpoints (Kafka's LogManager.asyncDelete)."""
    scratch = f"{topic}-flush"
    kafka.create_topic(scratch)
    with kafka.admin() as admin:
        admin.delete_topics([scratch])
    wait_until(
        lambda: log_start_entries(node_log_dir).get((topic, 0)) == point,
        timeout=120,
        what=f"the broker's log-start-offset-checkpoint recording {topic}-0 at {point}",
    )


def _served_from(rlm: Sidecar, kafka: KafkaCluster, topic: str, start: int) -> None:
    """Everything from ``start`` reads through rlm's listener as a consumer reads it from the broker."""
    end = broker_end(kafka.bootstrap, topic, 0)
    assert consume(rlm.kafka_bootstrap, topic, 0, start, end) == consume(
        kafka.bootstrap, topic, 0, start, end
    )


def test_delete_records_inside_the_local_log_hides_every_tier_at_once(
    kafka_single: KafkaCluster, tmp_path: Path
) -> None:
    topic = "deleted-records"
    node = kafka_single.nodes[0]
    part_dir = node.log_dir / f"{topic}-0"
    kafka_single.create_topic(topic, configs={"segment.bytes": MiB})
    cluster = {"bootstrap_servers": [kafka_single.bootstrap]}
    with run_sidecar(node, tmp_path / "store", tmp_path, cluster=cluster, topics={"include": [topic]}) as rlm:
        produce(kafka_single.bootstrap, topic, 5000)
        bases = segment_bases(part_dir)
        assert len(bases) >= 4, bases
        tiered = wait_tiered(rlm.url, topic, 0, bases[-1] - 1)["remote_segments"]
        assert listener_fetch(rlm.kafka_bootstrap, topic, 0).error == 0  # served before the call
        point = bases[1] + 7  # inside a tiered segment, above the broker's local log start (0)

        _delete_records(kafka_single, topic, point)
        # at once: the broker's files do not know it yet, rlm must not serve below it anyway
        for offset in (0, bases[1], point - 1):
            assert_not_served(rlm, topic, offset, point)
        assert broker_log_start(rlm.kafka_bootstrap, topic, 0) == point
        assert first_served(rlm, topic, point) == point
        assert (topic, 0) not in log_start_entries(node.log_dir), "the checkpoint reached disk: nothing shown"

        # the broker drops its segments wholly below the point: those offsets are remote-only now
        wait_until(lambda: segment_bases(part_dir)[0] == bases[1], timeout=60, what="the broker's deletion")
        for offset in (0, bases[1] - 1):
            assert_not_served(rlm, topic, offset, point)
        _served_from(rlm, kafka_single, topic, point)

        # once the point reaches the files, rlm's retention deletes what lies wholly below it
        _flush_log_starts(kafka_single, node.log_dir, topic, point)
        row = wait_until(
            lambda: (r := partition_row(rlm.url, topic, 0))["remote_segments"] == tiered - 1 and r,
            timeout=60,
            what="rlm's retention deleting the remote segment below the point",
        )
        assert (row["delete_records_offset"], row["remote_log_start_offset"], row["log_start_offset"]) == (
            point,
            point,
            point,
        )
        # the status answers once the manifest is gone; the pass logs the deletion right after it
        line = f"retention (log-start) deleted remote segment 0-{bases[1] - 1} "
        wait_until(lambda: line in rlm.daemon.log_text(), timeout=30, what="the deletion in rlm's log")
        # the straddling segment stays, hidden below the point
        for offset in (0, bases[1], point - 1):
            assert_not_served(rlm, topic, offset, point)
        assert first_served(rlm, topic, point) == point
        _served_from(rlm, kafka_single, topic, point)


def test_delete_records_up_to_the_high_watermark_hides_everything(
    kafka_single: KafkaCluster, tmp_path: Path
) -> None:
    topic = "deleted-to-hw"
    node = kafka_single.nodes[0]
    kafka_single.create_topic(topic, configs={"segment.bytes": MiB})
    cluster = {"bootstrap_servers": [kafka_single.bootstrap]}
    with run_sidecar(node, tmp_path / "store", tmp_path, cluster=cluster, topics={"include": [topic]}) as rlm:
        produce(kafka_single.bootstrap, topic, 2500)
        bases = segment_bases(node.log_dir / f"{topic}-0")
        wait_tiered(rlm.url, topic, 0, bases[-1] - 1)
        end = broker_end(kafka_single.bootstrap, topic, 0)
        # rlm's high watermark is the broker's checkpointed one (docs/visibility.md): an offset at
        # or above it is not visible by the files, so rlm does not ask the broker's live log start
        # for it; on a busy host the checkpoint lagged the produce and end - 1 was such an offset
        wait_until(
            lambda: checkpointed_high_watermark(node.log_dir, topic, 0) >= end,
            timeout=60,
            what="the broker's high-watermark checkpoint reaching the end",
        )

        _delete_records(kafka_single, topic, end)
        for offset in (0, bases[-1], end - 1):
            assert_not_served(rlm, topic, offset, end)
        assert broker_log_start(rlm.kafka_bootstrap, topic, 0) == end
        at_end = listener_fetch(rlm.kafka_bootstrap, topic, end)
        assert (at_end.error, at_end.high_watermark, at_end.records) == (0, end, b"")

        produce(kafka_single.bootstrap, topic, 100, start=2500)
        _served_from(rlm, kafka_single, topic, end)
        assert_not_served(rlm, topic, end - 1, end)
