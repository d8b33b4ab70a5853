"""A consumer reads the history through rlm's listener, then continues from the live broker
(issue #33 item 3, docs/kafka-listener.md §6.1): the switch is safe once its position is at or above
the broker's log start (rlm's ListOffsets -4, the local log start). Two ways, both tested here
beside a live broker whose retention removed the topic's first segments:

* **the group**: a grouped consumer at rlm's listener commits (the offsets are the cluster's
  own, docs/kafka-listener.md §6), closes, and the same group id at the broker's bootstrap starts
  exactly at that commit;
* **offsets-for-times**: rlm's ``POST /v1/offsets-for-times`` (and ``rlm offsets-for-times``, the
  same answer) gives the position for a timestamp, and a consumer of the broker seeks there; the
  CLI's CSV, given to Kafka's own ``kafka-consumer-groups --reset-offsets --from-file``, sets a
  group's position there.

The broker is the oracle: every record read, on either side of the switch, is the one it served
before its retention removed the first segments, and no offset is read twice or skipped."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from rlm.testing.daemon import rlm_cli
from rlm.testing.kafka_cluster import KafkaCluster, run_kafka_tool, wait_until
from rlm.testing.sidecar import Record, consume, run_sidecar, segment_bases
from tests.live.helpers import (
    broker_end,
    broker_log_start,
    committed_at_broker,
    librdkafka_consumer,
    produce,
    wait_tiered,
)

pytestmark = [pytest.mark.kafka_live, pytest.mark.integration]

SEGMENT = 1024 * 1024  # Kafka 4 refuses a smaller segment.bytes
TOPIC = "handover"
PARTS = (0, 1)
ROUND = 500  # records per partition per produce round; the rounds alternate partitions
ROUNDS = 5  # ~2.5 segments per partition: retention removes the first, the rest stays
Row = tuple[int, int, bytes | None, bytes | None]  # partition, offset, key, value


@dataclass
class Setup:
    broker: str  # the live broker's bootstrap
    rlm: str  # rlm's listener
    url: str  # rlm's HTTP API
    config: str  # rlm's config file (for the CLI)
    records: dict[int, list[Record]]  # per partition, as the broker served them before retention
    starts: dict[int, int]  # the broker's log start after retention
    ends: dict[int, int]


@pytest.fixture(scope="module")
def setup(kafka_single: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    node, broker = kafka_single.nodes[0], kafka_single.bootstrap
    kafka_single.create_topic(TOPIC, partitions=len(PARTS), configs={"segment.bytes": SEGMENT})
    for r in range(ROUNDS):  # interleaved in time, so one timestamp falls inside both partitions
        for p in PARTS:
            produce(broker, TOPIC, ROUND, partition=p, value_bytes=1000, start=r * ROUND)
    ends = {p: broker_end(broker, TOPIC, p) for p in PARTS}
    records = {p: consume(broker, TOPIC, p, 0, ends[p]) for p in PARTS}
    tmp = tmp_path_factory.mktemp("handover")
    sections = {"kafka": {"coordinator_bootstrap": [broker], "idle_timeout_ms": 60_000}}
    with run_sidecar(node, tmp / "store", tmp / "rlm", topics={"include": [TOPIC]}, sections=sections) as rlm:
        for p in PARTS:
            wait_tiered(rlm.url, TOPIC, p, segment_bases(node.log_dir / f"{TOPIC}-{p}")[-1] - 1)
        kafka_single.alter_topic(TOPIC, {"retention.bytes": SEGMENT})
        starts = {
            p: wait_until(
                lambda p=p: broker_log_start(broker, TOPIC, p),
                timeout=120,
                what="the broker's retention deleting old segments",
            )
            for p in PARTS
        }
        yield Setup(broker, rlm.kafka_bootstrap, rlm.url, str(rlm.config), records, starts, ends)


def _rows(records: list[Record], partition: int) -> list[Row]:
    return [(partition, r.offset, r.key, r.value) for r in records]


def _expected(setup: Setup) -> list[Row]:
    return sorted(row for p in PARTS for row in _rows(setup.records[p], p))


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.load(resp)


def _local_log_start(setup: Setup, partition: int) -> int:
    """rlm's answer to timestamp -4 (earliest local, as ListOffsets -4 answers it)."""
    got = _get(f"{setup.url}/v1/topics/{TOPIC}/partitions/{partition}/timestamps/-4")
    assert got["found"], got
    return int(got["offset"])


def _consumer(bootstrap: str, group: str) -> Any:
    return librdkafka_consumer(bootstrap, group, TOPIC)


def _read_until(consumer: Any, rows: list[Row], until: dict[int, int]) -> None:
    """Consume until every partition's position reached ``until`` (pausing each one there, so
    the commit that follows lands at or just past it)."""
    from confluent_kafka import TopicPartition

    def reached() -> bool:
        for msg in consumer.consume(num_messages=200, timeout=0.5):
            assert msg.error() is None, msg.error()
            rows.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
            if msg.offset() + 1 >= until[msg.partition()]:
                consumer.pause([TopicPartition(TOPIC, msg.partition())])
        done = {p for p in PARTS if any(q == p and o + 1 >= until[p] for q, o, _, _ in rows)}
        return done == set(PARTS)

    wait_until(reached, timeout=120, what=f"positions {until} through rlm")


def _read_to_end(consumer: Any, rows: list[Row], ends: dict[int, int]) -> None:
    def done() -> bool:
        for msg in consumer.consume(num_messages=500, timeout=0.5):
            assert msg.error() is None, msg.error()
            rows.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
        return all(any(q == p and o + 1 == ends[p] for q, o, _, _ in rows) for p in PARTS)

    wait_until(done, timeout=120, what=f"the broker's ends {ends}")


def test_the_group_hands_over_from_rlm_to_the_broker(setup: Setup) -> None:
    """Through rlm until the position reaches rlm's local log start (= the broker's log start),
    commit, close; the same group at the broker starts exactly at the commit, reads to the end."""
    group = "handover-group"
    local = {p: _local_log_start(setup, p) for p in PARTS}
    assert local == setup.starts and all(s > 0 for s in local.values())  # the switch point
    first: list[Row] = []
    consumer = _consumer(setup.rlm, group)
    try:
        _read_until(consumer, first, local)
        committed = {tp.partition: tp.offset for tp in consumer.commit(asynchronous=False)}
    finally:
        consumer.close()
    assert committed_at_broker(setup.broker, group, TOPIC) == committed
    for p in PARTS:  # at or above the broker's log start, and something left to read there
        assert setup.starts[p] <= committed[p] < setup.ends[p]
        assert committed[p] == 1 + max(o for q, o, _, _ in first if q == p)
    rest: list[Row] = []
    consumer = _consumer(setup.broker, group)  # the live broker itself, same group
    try:
        _read_to_end(consumer, rest, setup.ends)
    finally:
        consumer.close()
    for p in PARTS:  # exactly at the commit: not reset to the broker's earliest, nothing skipped
        assert min(o for q, o, _, _ in rest if q == p) == committed[p]
    assert sorted(first + rest) == _expected(setup)  # each offset once, as the broker served it


def _offsets_for_times_http(setup: Setup, timestamp: int) -> dict[int, int]:
    body = json.dumps({"timestamp": timestamp, "topics": [TOPIC]}).encode()
    req = urllib.request.Request(
        f"{setup.url}/v1/offsets-for-times", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        rows = json.load(resp)
    return {r["partition"]: r["offset"] for r in rows if r["topic"] == TOPIC}


def _offsets_for_times_csv(setup: Setup, timestamp: int) -> str:
    done = rlm_cli("offsets-for-times", "--config", setup.config, "--timestamp", timestamp, "--topic", TOPIC)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _offsets_for_times_cli(setup: Setup, timestamp: int) -> dict[int, int]:
    lines = [line.split(",") for line in _offsets_for_times_csv(setup, timestamp).splitlines() if line]
    return {int(p): int(o) for t, p, o in lines if t == TOPIC}


def _handover_timestamp(setup: Setup) -> tuple[int, dict[int, int]]:
    """A timestamp just after the records at the broker's log start, and each partition's first
    offset at or after it (from the records the broker served)."""
    ts = {p: [r.timestamp for r in setup.records[p]] for p in PARTS}
    assert all(t == sorted(t) for t in ts.values())  # CreateTime from one producer at a time
    when = 1 + max(ts[p][setup.starts[p]] for p in PARTS)
    return when, {p: next(o for o, t in enumerate(ts[p]) if t >= when) for p in PARTS}


def test_offsets_for_times_hands_over_to_the_broker(setup: Setup) -> None:
    """A timestamp just after the records at the broker's log start: rlm's offsets-for-times (HTTP
    and CLI agree) answers the first record at or after it in each partition — above the broker's
    log start, so a consumer of the broker seeks there and reads on to the end."""
    from confluent_kafka import Consumer, TopicPartition

    when, want = _handover_timestamp(setup)
    got = _offsets_for_times_http(setup, when)
    assert got == _offsets_for_times_cli(setup, when) == want
    for p in PARTS:
        assert setup.starts[p] < got[p] < setup.ends[p]
    consumer = Consumer(
        {"bootstrap.servers": setup.broker, "group.id": "oft-seek", "enable.auto.commit": False}
    )
    rest: list[Row] = []
    try:
        consumer.assign([TopicPartition(TOPIC, p, got[p]) for p in PARTS])
        _read_to_end(consumer, rest, setup.ends)
    finally:
        consumer.close()
    assert sorted(rest) == sorted(row for p in PARTS for row in _rows(setup.records[p][got[p] :], p))


def test_the_offsets_for_times_csv_resets_a_group_with_kafkas_own_tool(
    setup: Setup, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``rlm offsets-for-times`` writes the file ``kafka-consumer-groups --reset-offsets
    --from-file`` reads (docs/cli.md): Kafka's own tool sets the group there at the broker, and
    the group's consumer at the broker starts exactly at those offsets."""
    group = "oft-reset"
    when, want = _handover_timestamp(setup)
    csv = tmp_path_factory.mktemp("reset") / "offsets.csv"
    csv.write_text(_offsets_for_times_csv(setup, when))
    reset = run_kafka_tool(
        "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
        *("--bootstrap-server", setup.broker, "--group", group, "--reset-offsets"),
        *("--from-file", str(csv), "--execute"),
    )
    assert reset.returncode == 0, reset.stdout[-2000:] + reset.stderr[-2000:]
    assert committed_at_broker(setup.broker, group, TOPIC) == want
    rest: list[Row] = []
    consumer = _consumer(setup.broker, group)
    try:
        _read_to_end(consumer, rest, setup.ends)
    finally:
        consumer.close()
    for p in PARTS:  # the group's committed position, not auto.offset.reset
        assert min(o for q, o, _, _ in rest if q == p) == want[p]
    assert sorted(rest) == sorted(row for p in PARTS for row in _rows(setup.records[p][want[p] :], p))
