"""A topic deleted and created again under the same name on a live broker (issue #29): rlm keeps the
old incarnation's data apart (docs/topic-identity.md), serves the new topic from offset 0 as the
broker does, and never shows a record — or an offset — of the old one for the new one.

The broker deletes the old log at once but rewrites ``replication-offset-checkpoint`` only every
``replica.high.watermark.checkpoint.interval.ms`` (5 s): for a moment the file still carries the
old topic's high watermark under the name the new topic now has (docs/visibility.md).
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from rlm.testing.kafka_cluster import KafkaCluster, KafkaNode, wait_until
from rlm.testing.sidecar import Sidecar, consume, run_sidecar, segment_bases
from tests.live.helpers import broker_end, broker_log_start, partition_row, produce, wait_tiered
from tests.live.surfaces import OFFSET_OUT_OF_RANGE, http_records, listener_fetch

pytestmark = [pytest.mark.kafka_live, pytest.mark.integration]

MiB = 1024 * 1024
UNKNOWN_TOPIC_OR_PARTITION = 3
OLD, NEW = 4000, 1500  # records of each incarnation; the new one starts its keys at NEW_KEYS
NEW_KEYS = 50_000


def _hw_checkpoint(node: KafkaNode) -> Path:
    return node.log_dir / "replication-offset-checkpoint"


def _after_next_hw_checkpoint(node: KafkaNode) -> None:
    """Until the broker rewrote its HW checkpoint: the next rewrite is a whole period away."""
    before = _hw_checkpoint(node).stat().st_mtime_ns
    wait_until(lambda: _hw_checkpoint(node).stat().st_mtime_ns != before, timeout=30, what="a HW checkpoint")


def _delete_topic(kafka: KafkaCluster, node: KafkaNode, topic: str) -> None:
    with kafka.admin() as admin:
        admin.delete_topics([topic])
    wait_until(lambda: not (node.log_dir / f"{topic}-0").exists(), timeout=60, what=f"{topic}-0 deleted")


def _never_more_than_the_broker(rlm: Sidecar, kafka: KafkaCluster, topic: str) -> int:
    """rlm's answers for the new topic now: its end at most the broker's, offsets from 0, and
    what it serves is the new records. Returns rlm's end."""
    end = broker_end(kafka.bootstrap, topic, 0)
    rlm_end = broker_end(rlm.kafka_bootstrap, topic, 0)
    assert rlm_end <= end, f"rlm's high watermark {rlm_end} is above the broker's {end} (the old topic's)"
    assert broker_log_start(rlm.kafka_bootstrap, topic, 0) == 0
    beyond = listener_fetch(rlm.kafka_bootstrap, topic, end + 10)
    assert beyond.error == OFFSET_OUT_OF_RANGE and not beyond.records, beyond
    at_end = listener_fetch(rlm.kafka_bootstrap, topic, rlm_end)
    assert at_end.error == 0, at_end
    # rlm's high watermark may have moved on since ListOffsets (the broker's next HW checkpoint):
    # records at rlm_end are then fine, but only below the fetch's own high watermark, never above
    # the broker's end.
    assert not at_end.records or rlm_end < at_end.high_watermark <= end, at_end
    if rlm_end:
        status, body = http_records(rlm, topic, 0)
        assert status == 200, body
        assert base64.b64decode(body["batches"][0]["records"][0]["key"]) == f"k{NEW_KEYS}".encode()
    return rlm_end


def test_recreated_topic_is_served_from_zero_and_never_mixed(
    kafka_single: KafkaCluster, tmp_path: Path
) -> None:
    topic = "recreated"
    node = kafka_single.nodes[0]
    kafka_single.create_topic(topic, configs={"segment.bytes": MiB})
    with run_sidecar(node, tmp_path / "store", tmp_path, topics={"include": [topic]}) as rlm:
        produce(kafka_single.bootstrap, topic, OLD)
        bases = segment_bases(node.log_dir / f"{topic}-0")
        old_id = wait_tiered(rlm.url, topic, 0, bases[-1] - 1)["topic_id"]

        _after_next_hw_checkpoint(node)  # the old high watermark (OLD) stays in the file a while
        _delete_topic(kafka_single, node, topic)
        gone = listener_fetch(rlm.kafka_bootstrap, topic, 0)
        assert (gone.error, gone.records) == (UNKNOWN_TOPIC_OR_PARTITION, b"")
        kafka_single.create_topic(topic, configs={"segment.bytes": MiB})
        produce(kafka_single.bootstrap, topic, NEW, start=NEW_KEYS)
        _never_more_than_the_broker(rlm, kafka_single, topic)

        end = broker_end(kafka_single.bootstrap, topic, 0)
        assert end == NEW
        wait_until(
            lambda: _never_more_than_the_broker(rlm, kafka_single, topic) == end,
            timeout=60,
            what="rlm's high watermark reaching the new topic's",
        )
        from_broker = consume(kafka_single.bootstrap, topic, 0, 0, end)
        assert consume(rlm.kafka_bootstrap, topic, 0, 0, end) == from_broker
        assert from_broker[0].key == f"k{NEW_KEYS}".encode()

        new_bases = segment_bases(node.log_dir / f"{topic}-0")
        row = wait_tiered(rlm.url, topic, 0, new_bases[-1] - 1)
        assert row["topic_id"] != old_id
        assert row["highest_tiered_offset"] == new_bases[-1] - 1
        assert [old["topic_id"] for old in row["old_incarnations"]] == [old_id]
        assert consume(rlm.kafka_bootstrap, topic, 0, 0, end) == from_broker
        log = rlm.daemon.log_text()
        assert "Traceback" not in log and "unexpected" not in log, log[-3000:]
        assert partition_row(rlm.url, topic, 0)["last_error"] is None
