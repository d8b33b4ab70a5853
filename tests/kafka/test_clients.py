"""Real Kafka clients read both tiers through ``rlm run``'s Kafka listener: kafka-python's
``KafkaConsumer``, aiokafka's consumer and librdkafka through Debian's ``kcat``. Every record is
compared with kafka-python's decode of the original segments (tests/kafka/helpers.py ``oracle``)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as AioTopicPartition
from kafka import KafkaConsumer, TopicPartition

from tests.kafka.conftest import Tiered
from tests.kafka.helpers import Expected, Row

pytestmark = pytest.mark.integration


def _row(m: Any) -> Row:
    return (m.offset, m.timestamp, m.key, m.value, tuple((k, v) for k, v in (m.headers or [])))


def _consume_all(consumer: KafkaConsumer, want: dict[TopicPartition, int]) -> dict[TopicPartition, list[Row]]:
    """Poll until every partition has ``want`` records or nothing came for three polls."""
    got: dict[TopicPartition, list[Row]] = {tp: [] for tp in want}
    idle, deadline = 0, time.monotonic() + 240
    while idle < 3 and time.monotonic() < deadline:
        batch = consumer.poll(timeout_ms=1000, max_records=5000)
        idle = 0 if batch else idle + 1
        for tp, msgs in batch.items():
            got[tp] += [_row(m) for m in msgs]
        if all(len(got[tp]) >= n for tp, n in want.items()):
            break
    return got


def _readable(tiered: Tiered) -> dict[tuple[str, int], Expected]:
    return {k: e for k, e in tiered.expected.items() if e.rows and k[0] not in ("txn", "__cluster_metadata")}


def test_kafka_python_reads_every_record_of_both_tiers(tiered: Tiered) -> None:
    exp = _readable(tiered)
    # The boundary is crossed: segments were deleted locally, and generated partitions kept one.
    assert any(e.deleted_bases for e in exp.values())
    assert any(e.deleted_bases and k[0] == "gen" for k, e in exp.items())
    consumer = KafkaConsumer(
        bootstrap_servers=tiered.daemon.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        fetch_max_bytes=256 * 1024,
        max_partition_fetch_bytes=64 * 1024,
    )
    try:
        # topics() leaves Kafka's internal topics out, as a broker marks them; the KRaft log is no topic
        assert consumer.topics() == {t for t, _ in exp if not t.startswith("__")} | {"txn"}
        tps = {TopicPartition(*k): e for k, e in exp.items()}
        consumer.assign(list(tps))
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(list(tps))
        begins = consumer.beginning_offsets(list(tps))
        got = _consume_all(consumer, {tp: len(e.rows) for tp, e in tps.items()})
    finally:
        consumer.close()
    for tp, e in tps.items():
        assert ends[tp] == e.high_watermark, tp
        assert begins[tp] <= e.rows[0][0], tp
        assert got[tp] == e.rows, tp


def test_kafka_python_seek_and_offsets_for_times(tiered: Tiered) -> None:
    consumer = KafkaConsumer(
        bootstrap_servers=tiered.daemon.bootstrap, group_id=None, enable_auto_commit=False
    )
    try:
        for key in [
            ("gen", 0),
            ("gen", 1),
            ("kp", 0),
            ("oms_order_created", 1),
            ("topic-logx-001", 1),
            ("__consumer_offsets", 19),
        ]:
            e = tiered.expected[key]
            tp = TopicPartition(*key)
            rows = e.rows
            probes = sorted(
                {
                    rows[0][1] - 1,
                    rows[0][1],
                    rows[len(rows) // 3][1],
                    rows[len(rows) // 2][1] + 1,
                    max(r[1] for r in rows),
                    max(r[1] for r in rows) + 1,
                }
            )
            for ts in probes:
                found = consumer.offsets_for_times({tp: ts})[tp]
                first = e.first_at_or_after(ts)
                if first is None:
                    assert found is None, (key, ts)
                else:
                    assert (found.offset, found.timestamp) == (first[0], first[1]), (key, ts)
            # seek into the remote tier and read a few records exactly
            consumer.assign([tp])
            middle = rows[len(rows) // 3]
            consumer.seek(tp, middle[0])
            got = _consume_all(consumer, {tp: 5})[tp]
            i = rows.index(middle)
            assert got[:5] == rows[i : i + 5], key
    finally:
        consumer.close()


def test_kafka_python_read_committed_drops_aborted_records(tiered: Tiered) -> None:
    """The listener sends every batch below the LSO with the aborted transactions; the client's own
    filter must then yield exactly the committed records (the oracle replays the markers)."""
    truth = tiered.txn
    assert tiered.expected[("txn", 0)].deleted_bases  # its markers are read from the remote tier
    tp = TopicPartition("txn", 0)
    for isolation, want in (("read_committed", truth.committed), ("read_uncommitted", truth.uncommitted)):
        consumer = KafkaConsumer(
            bootstrap_servers=tiered.daemon.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            isolation_level=isolation,
            max_partition_fetch_bytes=4096,
        )
        try:
            consumer.assign([tp])
            consumer.seek_to_beginning()
            end = consumer.end_offsets([tp])[tp]
            got = _consume_all(consumer, {tp: len(want)})[tp]
        finally:
            consumer.close()
        assert [(r[0], r[2], r[3]) for r in got] == [(r.offset, r.key, r.value) for r in want], isolation
        bound = truth.last_stable_offset if isolation == "read_committed" else truth.high_watermark
        assert end == bound, isolation
    assert truth.aborted_offsets and truth.last_stable_offset < truth.high_watermark


def test_aiokafka_reads_both_tiers_exactly(tiered: Tiered) -> None:
    keys = [("gen", 1), ("kp", 0), ("topic-logx-001", 0), ("oms_order_status_changed", 0)]

    async def run() -> tuple[dict[Any, list[Row]], dict[Any, Any]]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=tiered.daemon.bootstrap,
            enable_auto_commit=False,
            max_partition_fetch_bytes=32 * 1024,
        )
        await consumer.start()
        try:
            tps = [AioTopicPartition(*k) for k in keys]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            got: dict[Any, list[Row]] = {tp: [] for tp in tps}
            want = {tp: len(tiered.expected[(tp.topic, tp.partition)].rows) for tp in tps}
            idle = 0
            while idle < 3 and any(len(got[tp]) < want[tp] for tp in tps):
                batch = await consumer.getmany(timeout_ms=1000)
                idle = 0 if batch else idle + 1
                for tp, msgs in batch.items():
                    got[tp] += [_row(m) for m in msgs]
            e = tiered.expected[keys[0]]
            ts = e.rows[len(e.rows) // 2][1]
            times = await consumer.offsets_for_times({tps[0]: ts})
            return got, {"ts": ts, "found": times[tps[0]]}
        finally:
            await consumer.stop()

    got, times = asyncio.run(run())
    for tp, rows in got.items():
        assert rows == tiered.expected[(tp.topic, tp.partition)].rows, tp
    first = tiered.expected[keys[0]].first_at_or_after(times["ts"])
    assert first is not None and (times["found"].offset, times["found"].timestamp) == (first[0], first[1])


def _kcat(*args: str) -> bytes:
    proc = subprocess.run(["kcat", *args], capture_output=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _parse_kcat(out: bytes) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Output of ``-f '%o %T %K %S\\n%k%s'``: a text line, then the raw key and value bytes."""
    rows, pos = [], 0
    while pos < len(out):
        nl = out.index(b"\n", pos)
        offset, ts, klen, vlen = (int(x) for x in out[pos:nl].split(b" "))
        pos = nl + 1
        key = None if klen < 0 else out[pos : pos + klen]
        pos += max(klen, 0)
        value = None if vlen < 0 else out[pos : pos + vlen]
        pos += max(vlen, 0)
        rows.append((offset, ts, key, value))
    return rows


def _kcat_consume(
    bootstrap: str, topic: str, part: str, start: str, *settings: str
) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Every record of one partition from ``start`` (kcat's ``-o``) to the end, as kcat decodes
    them; ``settings`` are librdkafka properties (``-X name=value``)."""
    extra = [arg for setting in settings for arg in ("-X", setting)]
    fmt = "%o %T %K %S\n%k%s"
    return _parse_kcat(
        _kcat("-b", bootstrap, "-C", "-t", topic, "-p", part, "-o", start, "-e", "-q", *extra, "-f", fmt)
    )


#: Outside CI a machine without kcat skips these; in CI (``CI`` set, as .ci/run sets it) the
#: Makefile installed it, so a missing kcat fails them instead of hiding the feature.
NEEDS_KCAT = pytest.mark.skipif(
    shutil.which("kcat") is None and not os.environ.get("CI"),
    reason="kcat is not installed (make kcat installs it)",
)


@NEEDS_KCAT
def test_kcat_reads_from_beginning_and_from_a_timestamp(tiered: Tiered) -> None:
    # oms_order_created has only partition 1 here: librdkafka must still see it (Metadata lists 0 too)
    for key in [
        ("gen", 0),
        ("kp", 0),
        ("oms_order_status_changed", 2),
        ("_schemas", 0),
        ("oms_order_created", 1),
    ]:
        e = tiered.expected[key]
        want = [(r[0], r[1], r[2], r[3]) for r in e.rows]
        topic, part = key[0], str(key[1])
        got = _kcat_consume(tiered.daemon.bootstrap, topic, part, "beginning")
        assert got == want, key
        ts = e.rows[len(e.rows) // 2][1]
        first = e.first_at_or_after(ts)
        assert first is not None
        got = _kcat_consume(tiered.daemon.bootstrap, topic, part, f"s@{ts}")
        i = want.index((first[0], first[1], first[2], first[3]))
        assert got == want[i:], key
        queried = _kcat("-b", tiered.daemon.bootstrap, "-Q", "-t", f"{topic}:{part}:{ts}").decode()
        assert queried.split()[-1] == str(first[0]), (key, queried)  # "<topic> [<p>] offset <o>"


@NEEDS_KCAT
def test_kcat_read_committed_filters_aborted_transactions(tiered: Tiered) -> None:
    """librdkafka filters with the aborted-transaction list the listener sends, as against a broker."""
    truth = tiered.txn
    for isolation, want in (("read_committed", truth.committed), ("read_uncommitted", truth.uncommitted)):
        got = _kcat_consume(tiered.daemon.bootstrap, "txn", "0", "beginning", f"isolation.level={isolation}")
        assert [(r[0], r[2], r[3]) for r in got] == [(r.offset, r.key, r.value) for r in want], isolation


def test_aiokafka_read_committed(tiered: Tiered) -> None:
    truth = tiered.txn

    async def run() -> list[Row]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=tiered.daemon.bootstrap,
            enable_auto_commit=False,
            isolation_level="read_committed",
            max_partition_fetch_bytes=4096,
        )
        await consumer.start()
        try:
            tp = AioTopicPartition("txn", 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            got: list[Row] = []
            idle = 0
            while idle < 3 and len(got) < len(truth.committed):
                batch = await consumer.getmany(timeout_ms=1000)
                idle = 0 if batch else idle + 1
                for msgs in batch.values():
                    got += [_row(m) for m in msgs]
            return got
        finally:
            await consumer.stop()

    got = asyncio.run(run())
    assert [(r[0], r[2], r[3]) for r in got] == [(r.offset, r.key, r.value) for r in truth.committed]
