"""Consumer groups through rlm's listener, beside a live broker (docs/kafka-listener.md §6): a
topic whose early segments exist only in rlm (tiered, then removed by the broker's retention) is
read by consumers with a group id at rlm's listener. rlm names itself the coordinator and relays
the group APIs to the broker, so the offsets they commit are the broker's own (asked of the broker
with an admin client), and a restarted consumer resumes exactly there. Two members of one group
split the two partitions. Kafka's ConsumerPerformance with a group reads every record."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kafka.protocol.consumer import OffsetCommitRequest, OffsetFetchRequest

from rlm.kafka.coordinator import Coordinator, RelaySession
from rlm.kafka.protocol import SERVED, parse_request
from rlm.testing.daemon import free_port
from rlm.testing.kafka_cluster import KafkaCluster, kafka_tool_command, run_kafka_tool, wait_until
from rlm.testing.sidecar import consume, run_sidecar, segment_bases
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
TOPIC = "grouped"
PARTS = (0, 1)
Row = tuple[int, int, bytes | None, bytes | None]  # partition, offset, key, value


@dataclass
class Setup:
    broker: str  # the live broker's bootstrap
    rlm: str  # rlm's listener
    expected: set[Row]  # every record, as the broker served it before retention removed the first
    ends: dict[int, int]


@pytest.fixture(scope="module")
def setup(kafka_single: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    node, broker = kafka_single.nodes[0], kafka_single.bootstrap
    kafka_single.create_topic(TOPIC, partitions=len(PARTS), configs={"segment.bytes": SEGMENT})
    for p in PARTS:
        produce(broker, TOPIC, 2500, partition=p, value_bytes=1000)  # ~2.5 segments each
    ends = {p: broker_end(broker, TOPIC, p) for p in PARTS}
    expected = {(p, r.offset, r.key, r.value) for p in PARTS for r in consume(broker, TOPIC, p, 0, ends[p])}
    tmp = tmp_path_factory.mktemp("groups")
    sections = {"kafka": {"coordinator_bootstrap": [broker], "idle_timeout_ms": 60_000}}
    with run_sidecar(node, tmp / "store", tmp / "rlm", topics={"include": [TOPIC]}, sections=sections) as rlm:
        for p in PARTS:
            wait_tiered(rlm.url, TOPIC, p, segment_bases(node.log_dir / f"{TOPIC}-{p}")[-1] - 1)
        kafka_single.alter_topic(TOPIC, {"retention.bytes": SEGMENT})
        for p in PARTS:
            wait_until(
                lambda p=p: broker_log_start(broker, TOPIC, p) > 0,
                timeout=120,
                what="the broker's retention deleting old segments",
            )
        yield Setup(broker, rlm.kafka_bootstrap, expected, ends)


def _kafka_python(rlm: str, group: str) -> Any:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        bootstrap_servers=rlm,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=200,
        request_timeout_ms=30_000,
    )
    consumer.subscribe([TOPIC])
    return consumer


def _poll_kafka_python(consumer: Any, rows: list[Row], until: int, each: bool = False) -> None:
    """Poll until at least ``until`` rows are in ``rows`` (``each``: and some of every partition)."""

    def enough() -> bool:
        for batch in consumer.poll(timeout_ms=500).values():
            rows.extend((m.partition, m.offset, m.key, m.value) for m in batch)
        return len(rows) >= until and (not each or {p for p, _, _, _ in rows} == set(PARTS))

    wait_until(enough, timeout=120, what=f"{until} records through rlm")


def test_kafka_python_commits_at_the_broker_and_resumes_there(setup: Setup) -> None:
    group = "kp-group"
    first: list[Row] = []
    consumer = _kafka_python(setup.rlm, group)
    try:
        _poll_kafka_python(consumer, first, 1500, each=True)
        consumer.commit()  # the positions after every record poll returned
        positions = {tp.partition: consumer.position(tp) for tp in consumer.assignment()}
    finally:
        consumer.close(autocommit=False)
    committed = committed_at_broker(setup.broker, group, TOPIC)
    assert committed == positions and set(committed) == set(PARTS)
    assert committed == {p: 1 + max(o for q, o, _, _ in first if q == p) for p in PARTS}
    total = sum(setup.ends.values())
    rest: list[Row] = []
    consumer = _kafka_python(setup.rlm, group)
    try:
        _poll_kafka_python(consumer, rest, total - len(first))
    finally:
        consumer.close(autocommit=False)
    for p in PARTS:  # resumed exactly at the committed offset
        assert min(o for q, o, _, _ in rest if q == p) == committed[p]
    assert len(first) + len(rest) == total and set(first) | set(rest) == setup.expected


def _confluent(rlm: str, group: str) -> Any:
    return librdkafka_consumer(rlm, group, TOPIC)


def _poll_confluent(consumers: list[Any], rows: list[Row], until: int, each: bool = False) -> None:
    """Consume until at least ``until`` rows are in ``rows`` (``each``: and some of every partition)."""

    def enough() -> bool:
        for consumer in consumers:
            for msg in consumer.consume(num_messages=500, timeout=0.5):
                assert msg.error() is None, msg.error()
                rows.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
        return len(rows) >= until and (not each or {p for p, _, _, _ in rows} == set(PARTS))

    wait_until(enough, timeout=120, what=f"{until} records through rlm (librdkafka)")


def test_confluent_kafka_commits_at_the_broker_and_resumes_there(setup: Setup) -> None:
    group = "librdkafka-group"
    first: list[Row] = []
    consumer = _confluent(setup.rlm, group)
    try:
        _poll_confluent([consumer], first, 1500, each=True)
        done = consumer.commit(asynchronous=False)  # the positions after every record returned
        positions = {tp.partition: tp.offset for tp in done}
    finally:
        consumer.close()
    committed = committed_at_broker(setup.broker, group, TOPIC)
    assert committed == positions == {p: 1 + max(o for q, o, _, _ in first if q == p) for p in PARTS}
    total = sum(setup.ends.values())
    rest: list[Row] = []
    consumer = _confluent(setup.rlm, group)
    try:
        _poll_confluent([consumer], rest, total - len(first))
    finally:
        consumer.close()
    for p in PARTS:
        assert min(o for q, o, _, _ in rest if q == p) == committed[p]
    assert len(first) + len(rest) == total and set(first) | set(rest) == setup.expected


def test_two_members_split_the_partitions(setup: Setup) -> None:
    group = "split-group"
    members = [_confluent(setup.rlm, group) for _ in range(2)]
    # Until the group settles, the first member may own both partitions and read from either; with
    # no commit, a partition's next owner starts again at the earliest offset. So records count once
    # by (partition, offset), a member's reads of a partition it gave up are dropped, and only the
    # settled assignment is held to "each reads its own partition only".
    seen: list[set[Row]] = [set(), set()]
    try:

        def split() -> bool:
            for member, got in zip(members, seen, strict=True):
                msg = member.poll(0.2)  # serves the rebalance; a record may come once assigned
                if msg is not None and msg.error() is None:
                    got.add((msg.partition(), msg.offset(), msg.key(), msg.value()))
            owned = [{tp.partition for tp in m.assignment()} for m in members]
            return all(len(o) == 1 for o in owned) and owned[0] | owned[1] == set(PARTS)

        wait_until(split, timeout=120, what="two members with one partition each")
        owned = [{tp.partition for tp in m.assignment()} for m in members]
        for i, mine in enumerate(owned):
            seen[i] = {row for row in seen[i] if row[0] in mine}
        wanted = [{row for row in setup.expected if row[0] in mine} for mine in owned]

        def read_all() -> bool:
            for member, got, mine in zip(members, seen, owned, strict=True):
                for msg in member.consume(num_messages=500, timeout=0.5):
                    assert msg.error() is None, msg.error()
                    assert msg.partition() in mine, f"read partition {msg.partition()}, owns {mine}"
                    got.add((msg.partition(), msg.offset(), msg.key(), msg.value()))
            return seen == wanted

        wait_until(read_all, timeout=120, what="each member's whole partition through rlm")
        assert [{tp.partition for tp in m.assignment()} for m in members] == owned  # still settled
        assert seen[0] | seen[1] == setup.expected
    finally:
        for member in members:
            member.close()


def test_aiokafka_commits_at_the_broker_and_resumes_there(setup: Setup) -> None:
    """aiokafka resolves the coordinator by its node id among Metadata brokers: rlm's own."""
    group = "aiokafka-group"
    first = asyncio.run(_aiokafka_read(setup.rlm, group, 1500, commit=True))
    committed = committed_at_broker(setup.broker, group, TOPIC)
    assert committed == {p: 1 + max(o for q, o, _, _ in first if q == p) for p in PARTS}
    total = sum(setup.ends.values())
    rest = asyncio.run(_aiokafka_read(setup.rlm, group, total - len(first), commit=False))
    for p in PARTS:
        assert min(o for q, o, _, _ in rest if q == p) == committed[p]
    assert len(first) + len(rest) == total and set(first) | set(rest) == setup.expected


async def _aiokafka_read(rlm: str, group: str, until: int, *, commit: bool) -> list[Row]:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        TOPIC,
        bootstrap_servers=rlm,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=200,
    )
    rows: list[Row] = []
    await consumer.start()
    try:
        deadline = asyncio.get_running_loop().time() + 120
        while len(rows) < until or (commit and {p for p, _, _, _ in rows} != set(PARTS)):
            assert asyncio.get_running_loop().time() < deadline, f"{len(rows)} of {until} records"
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                rows.extend((m.partition, m.offset, m.key, m.value) for m in batch)
        if commit:
            await consumer.commit()  # the positions after every record getmany returned
    finally:
        await consumer.stop()
    return rows


def _console_consumer(
    rlm: str, group: str, *limit: str, may_be_empty: bool = False
) -> dict[int, list[tuple[int, bytes]]]:
    """Kafka's own ConsoleConsumer with ``--group`` through rlm: ``(offset, value)`` per partition,
    in the order printed (``may_be_empty``: the group may have committed every offset already)."""
    done = run_kafka_tool(
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
        *("--bootstrap-server", rlm, "--topic", TOPIC, "--group", group, "--from-beginning"),
        *("--property", "print.partition=true", "--property", "print.offset=true", *limit),
        timeout=180,
    )
    out: dict[int, list[tuple[int, bytes]]] = {}
    for line in done.stdout.splitlines():
        if not line.startswith("Partition:"):  # the tool's log lines (a --timeout-ms exit logs one)
            continue
        part, offset, value = line.split("\t", 2)
        out.setdefault(int(part.removeprefix("Partition:")), []).append(
            (int(offset.removeprefix("Offset:")), value.encode())
        )
    assert out or may_be_empty, done.stderr[-2000:]
    return out


def test_java_console_consumer_commits_at_the_broker_and_resumes_there(setup: Setup) -> None:
    """A clean exit after ``--max-messages`` commits the positions (auto commit on close); the
    next run starts at exactly those, and reads on to the end."""
    group = "java-group"
    first = _console_consumer(setup.rlm, group, "--max-messages", "1000")
    assert sum(len(v) for v in first.values()) == 1000
    committed = committed_at_broker(setup.broker, group, TOPIC)
    for p, rows in first.items():  # what was printed is below the commit (a poll may hold more)
        assert committed[p] >= rows[-1][0] + 1
    rest = _console_consumer(setup.rlm, group, "--timeout-ms", "15000")
    values = {(p, o): v for p, o, _, v in setup.expected}
    for p in PARTS:
        offsets = [o for o, _ in rest[p]]
        assert offsets == list(range(committed.get(p, 0), setup.ends[p]))
        assert all(values[(p, o)] == v for o, v in rest[p])


def _commit_request(group: str, partition: int, offset: int) -> Any:
    """A standalone OffsetCommit (no generation: the simple-consumer form, as an admin commits)."""
    t = OffsetCommitRequest.OffsetCommitRequestTopic
    p = t.OffsetCommitRequestPartition(
        partition_index=partition, committed_offset=offset, committed_leader_epoch=-1, committed_metadata=""
    )
    return OffsetCommitRequest(
        group_id=group,
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        retention_time_ms=-1,
        topics=[t(name=TOPIC, partitions=[p])],
    )


async def _relay(session: RelaySession, body: Any, version: int) -> Any:
    """``body`` through the relay as a client's frame (correlation id 41): the decoded answer."""
    body.with_header(correlation_id=41, client_id="t")
    raw = bytes(body.encode(version=version, header=True, framed=False))
    req = parse_request(raw, session.coordinator.served(SERVED))
    answer = await session.relay(req, raw)
    assert int.from_bytes(answer[:4], "big") == len(answer) - 4
    return req.api.response.decode(bytes(answer[4:]), version=version, header=True)


async def _gone_then_found(session: RelaySession, group: str) -> tuple[Any, Any, Any]:
    """A commit to the gone coordinator, the commit retried until the real one took it, and an
    OffsetFetch (v9, batched form) of the group."""
    commit = _commit_request(group, 1, 77)
    g = OffsetFetchRequest.OffsetFetchRequestGroup
    fetch = OffsetFetchRequest(
        groups=[g(group_id=group, member_id=None, member_epoch=-1, topics=None)], require_stable=True
    )
    try:
        gone = await _relay(session, commit, 9)
        assert group not in session.coordinator._where  # dropped: the next request asks again
        for _ in range(100):  # a new group's coordinator answers 14/15 while __consumer_offsets loads
            done = await _relay(session, commit, 9)
            if done.topics[0].partitions[0].error_code not in (14, 15):
                break
            await asyncio.sleep(0.2)
        read = await _relay(session, fetch, 9)
    finally:
        session.close()
    return gone, done, read


def test_a_coordinator_gone_away_is_found_again(setup: Setup) -> None:
    """The relay itself against the live broker: a cached coordinator that no longer answers makes
    one request COORDINATOR_NOT_AVAILABLE and drops the entry; the retry asks the cluster again
    (bootstrap servers in order, a dead one first) and reaches the real coordinator: an offset
    committed through the relay is the broker's, and OffsetFetch through it reads it back."""
    dead = f"127.0.0.1:{free_port()}"
    coordinator = Coordinator((dead, setup.broker), node_id=0, timeout_s=10)
    coordinator._where["relay-group"] = (99, "127.0.0.1", free_port())  # a coordinator gone away
    gone, done, read = asyncio.run(_gone_then_found(RelaySession(coordinator), "relay-group"))
    assert gone.header.correlation_id == done.header.correlation_id == 41
    assert [p.error_code for p in gone.topics[0].partitions] == [15]
    assert [p.error_code for p in done.topics[0].partitions] == [0]
    host, port = setup.broker.rsplit(":", 1)
    assert coordinator._where["relay-group"][1:] == (host, int(port))  # the real one, cached
    offsets = [(p.partition_index, p.committed_offset) for t in read.groups[0].topics for p in t.partitions]
    assert offsets == [(1, 77)]
    assert committed_at_broker(setup.broker, "relay-group", TOPIC) == {1: 77}


def test_java_consumer_performance_reads_every_record_with_a_group(setup: Setup) -> None:
    """Kafka's ``ConsumerPerformance --group`` through rlm: it stops after ``--messages`` records
    (or warns at ``--timeout``) and prints how many it consumed; every one of both partitions."""
    total = sum(setup.ends.values())
    done = run_kafka_tool(
        "org.apache.kafka.tools.ConsumerPerformance",
        *("--bootstrap-server", setup.rlm, "--topic", TOPIC, "--group", "perf-group"),
        *("--messages", str(total), "--timeout", "60000"),
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING: Exiting before" not in done.stdout, done.stdout
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    header = lines.index(next(line for line in lines if line.startswith("start.time")))
    stats = dict(zip(lines[header].split(", "), lines[header + 1].split(", "), strict=False))
    assert int(stats["data.consumed.in.nMsg"]) == total, done.stdout
    assert committed_at_broker(setup.broker, "perf-group", TOPIC) == setup.ends  # auto commit on close


def test_a_killed_java_consumer_resumes_at_its_last_commit(setup: Setup) -> None:
    """Kafka's ConsoleConsumer, committing every 200 ms, is SIGKILLed mid-read (no close, no final
    commit). The next run of the group starts exactly at what the broker holds as committed, and
    the two runs together read every record (at least once, as Kafka promises)."""
    group = "java-killed"
    cmd = kafka_tool_command(
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
        *("--bootstrap-server", setup.rlm, "--topic", TOPIC, "--group", group, "--from-beginning"),
        *("--property", "print.partition=true", "--property", "print.offset=true"),
        *(
            "--consumer-property",
            "auto.commit.interval.ms=200",
            "--consumer-property",
            "max.poll.records=100",
            "--consumer-property",
            "session.timeout.ms=6000",  # the broker's minimum: the dead member leaves the group soon
        ),
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    # Drained all along: a full pipe blocks its printing, so it would stop polling and committing.
    drain = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    drain.start()
    try:
        wait_until(lambda: len(lines) >= 1500, timeout=120, what="1500 records printed")
        # auto-commit runs in poll every 200 ms: wait until the broker holds one, then kill
        wait_until(
            lambda: sum(committed_at_broker(setup.broker, group, TOPIC).values()) > 0,
            timeout=60,
            what="a commit of the group at the broker",
        )
    finally:
        proc.kill()  # SIGKILL: no close, no final commit
        proc.wait(timeout=30)
        drain.join(timeout=30)  # what it printed before the kill
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    first = [
        (int(part.removeprefix("Partition:")), int(offset.removeprefix("Offset:")))
        for part, offset, _ in (
            ln.split("\t", 2) for ln in lines if ln.startswith("Partition:") and ln.endswith("\n")
        )  # a line the kill cut short was not printed whole: not counted as read
    ]
    assert len(first) >= 1500
    committed = committed_at_broker(setup.broker, group, TOPIC)
    assert sum(committed.values()) > 0 and all(0 <= committed[p] <= setup.ends[p] for p in committed)
    # the next member joins once the killed one's session timed out (6 s), then reads to the end;
    # the killed one kept reading until the broker held a commit, which may be the end already
    rest = _console_consumer(setup.rlm, group, "--timeout-ms", "30000", may_be_empty=True)
    for p in PARTS:
        offsets = [o for o, _ in rest.get(p, [])]
        assert offsets == list(range(committed.get(p, 0), setup.ends[p]))  # exactly from the commit
        read = {o for q, o in first if q == p} | set(offsets)
        assert read == set(range(setup.ends[p]))  # nothing lost across the kill
