"""A leader asks the broker's high watermark when the checkpoint holds a rolled segment back
(docs/operations.md "The high watermark"), against a live broker that writes
``replication-offset-checkpoint`` only every 10 minutes: rlm tiers a segment that rolled just now
while the file still says its records are not committed, and serves it (docs/visibility.md: the
broker's answer is the visible end until the broker writes the file again) — and without
``[cluster] bootstrap_servers`` it waits for the file, as before."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlm.testing.kafka_cluster import KafkaCluster, wait_until
from rlm.testing.sidecar import run_sidecar, segment_bases
from tests.live.cluster_helpers import MiB, send
from tests.live.helpers import broker_end, checkpointed_high_watermark, partition_row

pytestmark = [pytest.mark.kafka_live, pytest.mark.integration]

TOPIC = "hw-live"


@pytest.fixture(scope="module")
def slow_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    from tests.kafkaservers import require_kafka

    require_kafka()
    own = KafkaCluster(
        tmp_path_factory.mktemp("hw"),
        size=1,
        broker_config={"replica.high.watermark.checkpoint.interval.ms": 600_000},
    )
    try:
        yield own.start()
    finally:
        own.close()


@pytest.mark.parametrize("asks", [True, False], ids=["asks-the-broker", "checkpoint-only"])
def test_a_segment_rolled_just_now_is_tiered_before_the_checkpoint_says_it_is_committed(
    slow_checkpoint: KafkaCluster, tmp_path: Path, asks: bool
) -> None:
    kafka, topic = slow_checkpoint, f"{TOPIC}-{asks}"
    node = kafka.nodes[0]
    kafka.create_topic(topic, configs={"segment.bytes": MiB})
    extra = {"cluster": {"bootstrap_servers": [kafka.bootstrap]}} if asks else {}
    with run_sidecar(node, tmp_path / "store", tmp_path / "rlm", **extra) as rlm:
        send(kafka.bootstrap, topic, 0, 2500, tag="hw")  # ~2.5 MB: two segments roll
        part = node.log_dir / f"{topic}-0"
        rolled_end = segment_bases(part)[-1] - 1
        assert rolled_end > 0
        if asks:
            wait_until(
                lambda: partition_row(rlm.url, topic, 0)["highest_tiered_offset"] >= rolled_end,
                timeout=60,
                what="every rolled segment tiered",
            )
            assert checkpointed_high_watermark(node.log_dir, topic, 0) <= rolled_end  # the file lags
            # What was tiered on the broker's word is served too: rlm's listener answers a consumer's
            # ListOffsets latest with that high watermark, never past the broker's own.
            seen, broker_hw = broker_end(rlm.kafka_bootstrap, topic, 0), broker_end(kafka.bootstrap, topic, 0)
            assert rolled_end < seen <= broker_hw
            assert partition_row(rlm.url, topic, 0)["high_watermark_source"] == "broker"
        else:
            time.sleep(5)  # five passes
            assert partition_row(rlm.url, topic, 0)["highest_tiered_offset"] < rolled_end
