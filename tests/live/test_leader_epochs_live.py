"""Leader epochs beside a live broker (issue #33; docs/kafka-listener.md §5.4): a partition that
lived through three leader epochs (its only broker restarted twice), tiered by rlm. The broker is
the oracle: its OffsetForLeaderEpoch and Metadata answers are rlm's — and after the broker's
retention removed the early segments (and trimmed its epoch cache with them), rlm still answers
the epochs of that history as the broker did before. Kafka's Java consumer, which validates its
position with OffsetForLeaderEpoch once Metadata gives epochs, reads everything through rlm."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.consumer import OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from rlm.testing.kafka_cluster import KafkaCluster, wait_until
from rlm.testing.sidecar import consume, run_sidecar, segment_bases
from tests.kafka.helpers import call
from tests.live.helpers import broker_end, broker_log_start, produce, wait_tiered
from tests.live.test_java_consumer import _as_printed, _console_consumer

pytestmark = [pytest.mark.kafka_live, pytest.mark.integration]

SEGMENT = 1024 * 1024
TOPIC = "epochs"
UNKNOWN_LEADER_EPOCH = 75


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    from tests.kafkaservers import require_kafka

    require_kafka()
    home = tmp_path_factory.mktemp("epochs")
    own = KafkaCluster(home, size=1)  # its own broker: restarted twice, which others must not see
    try:
        yield own.start()
    finally:
        own.close()


def port_of(bootstrap: str) -> int:
    return int(bootstrap.rsplit(":", 1)[1])


def _epochs(part: Path) -> list[tuple[int, int]]:
    lines = (part / "leader-epoch-checkpoint").read_text().split("\n")
    return [(int(a), int(b)) for a, b in (ln.split() for ln in lines[2 : 2 + int(lines[1])])]


def _ask(port: int, epochs: list[int]) -> list[tuple[int, int, int]]:
    """OffsetForLeaderEpoch v4 of partition 0 for each epoch (no current epoch checked)."""
    cls = OffsetForLeaderEpochRequest.OffsetForLeaderTopic
    parts = [
        cls.OffsetForLeaderPartition(partition=0, current_leader_epoch=-1, leader_epoch=e) for e in epochs
    ]
    req = OffsetForLeaderEpochRequest(replica_id=-1, topics=[cls(topic=TOPIC, partitions=parts)])
    resp = call(port, req, 4, OffsetForLeaderEpochResponse)
    return [(p.error_code, p.leader_epoch, p.end_offset) for t in resp.topics for p in t.partitions]


def _leader_epoch(port: int) -> int:
    req = MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)], allow_auto_topic_creation=False
    )
    resp: Any = call(port, req, 9, MetadataResponse)
    return int(resp.topics[0].partitions[0].leader_epoch)


def _three_epochs(cluster: KafkaCluster) -> int:
    """1500 records in each of three leader epochs; the log end."""
    node = cluster.nodes[0]
    cluster.create_topic(TOPIC, configs={"segment.bytes": SEGMENT})
    for round_ in range(3):
        if round_:
            node.stop()
            cluster.start_node(node.node_id)
            wait_until(lambda: cluster.leaders(TOPIC).get(0) == node.node_id, timeout=60, what="led again")
        produce(cluster.bootstrap, TOPIC, 1500, value_bytes=1000, start=1500 * round_)
    return broker_end(cluster.bootstrap, TOPIC, 0)


def test_rlm_answers_leader_epochs_as_the_broker(cluster: KafkaCluster, tmp_path: Path) -> None:
    node = cluster.nodes[0]
    end = _three_epochs(cluster)
    part = node.log_dir / f"{TOPIC}-0"
    lineage = _epochs(part)
    assert len(lineage) >= 3, lineage  # each restart is a new leader epoch
    latest = lineage[-1][0]
    asked = sorted({-1, lineage[0][0] - 1, *(e for e, _ in lineage), *(e + 1 for e, _ in lineage[:-1])})
    broker_port = port_of(cluster.bootstrap)
    before = _ask(broker_port, asked)
    from_broker = consume(cluster.bootstrap, TOPIC, 0, 0, end)
    with run_sidecar(node, tmp_path / "store", tmp_path / "rlm", topics={"include": [TOPIC]}) as rlm:
        wait_tiered(rlm.url, TOPIC, 0, segment_bases(part)[-1] - 1)
        rlm_port = port_of(rlm.kafka_bootstrap)
        # the same answers once rlm's high watermark (the broker's checkpoint) caught up with the end
        wait_until(lambda: _ask(rlm_port, asked) == before, timeout=60, what="rlm answering as the broker")
        assert _leader_epoch(rlm_port) == _leader_epoch(broker_port) == latest
        assert _ask(rlm_port, [latest + 1]) == [(UNKNOWN_LEADER_EPOCH, -1, -1)]  # the broker: UNDEFINED
        cluster.alter_topic(TOPIC, {"retention.bytes": SEGMENT})
        wait_until(
            lambda: broker_log_start(cluster.bootstrap, TOPIC, 0) > lineage[1][1],
            timeout=120,
            what="retention",
        )
        assert _epochs(part)[0][0] > lineage[0][0]  # the broker's cache lost the first epoch
        assert _ask(rlm_port, asked) == before  # rlm still knows where it ended
        printed = _console_consumer(rlm.kafka_bootstrap, TOPIC, end)
    assert printed == _as_printed(from_broker)
