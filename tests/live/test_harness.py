"""The live-Kafka harness itself (rlm/testing/kafka_cluster.py): a port taken by another process
between choosing it and the JVM binding it is chosen anew on the first start — the busy-host case
where suites run side by side."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from rlm.testing.kafka_cluster import KafkaCluster
from tests.kafkaservers import require_kafka

pytestmark = [pytest.mark.kafka_live, pytest.mark.integration]


def test_a_taken_port_is_chosen_anew_on_first_start(tmp_path: Path) -> None:
    require_kafka()
    cluster = KafkaCluster(tmp_path, size=1)
    taken = cluster.nodes[0].broker_port
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        with cluster:
            assert cluster.nodes[0].broker_port != taken
            assert cluster.nodes[0].port_taken()  # the first attempt's log says why it moved
            with cluster.admin() as admin:
                assert len(admin.describe_cluster()["brokers"]) == 1
