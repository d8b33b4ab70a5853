"""Live Kafka for the suites that need a real broker (rlm/testing/kafka_cluster.py).

``kafka_single`` is one combined KRaft node shared by the package that loads it
(tests/live/conftest.py; tests use their own topic names); ``kafka_trio`` is a 3-node cluster shared
by one test module (its tests kill and restart nodes). Where the runtime is missing (no Java,
``make kafka`` not run) a test skips outside CI and fails in CI (``CI`` set, as .ci/run's
environment has it): a live-broker suite never passes by not running there.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rlm.testing.kafka_cluster import KafkaCluster, kafka_runtime_problem
from tests.needs import unavailable

#: Every live cluster's brokers roll and delete on a short clock (see kafka_cluster's docstring).
#: The log start checkpoint is written at startup (the log manager's tasks start at once, not after
#: 30 s), then only when a topic is deleted (or daily): what rlm knows of a DeleteRecords before it
#: reaches disk must come from the broker itself (tests/live/test_delete_records.py).
BROKER_CONFIG: dict[str, object] = {
    "log.initial.task.delay.ms": 0,
    "log.flush.start.offset.checkpoint.interval.ms": 86_400_000,
}


def require_kafka() -> None:
    """Skip (outside CI) or fail (in CI) when the Kafka runtime cannot run here."""
    problem = kafka_runtime_problem()
    if problem is not None:
        unavailable(f"live Kafka: {problem}")


def _running(tmp: pytest.TempPathFactory, name: str, size: int) -> Iterator[KafkaCluster]:
    """A started cluster of ``size`` nodes under a fresh temp dir, killed by pid afterwards."""
    require_kafka()
    cluster = KafkaCluster(tmp.mktemp(name), size=size, broker_config=BROKER_CONFIG)
    try:
        yield cluster.start()
    finally:
        cluster.close()


@pytest.fixture(scope="package")
def kafka_single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """One KRaft broker+controller for the package whose conftest loads it (tests/live)."""
    yield from _running(tmp_path_factory, "kafka1", 1)


@pytest.fixture(scope="module")
def kafka_trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """Three KRaft broker+controllers (RF 3, min ISR 2) for one test module."""
    yield from _running(tmp_path_factory, "kafka3", 3)
