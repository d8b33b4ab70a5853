"""Gaps reported, never hidden (docs/visibility.md, "Gaps"), beside a live Kafka broker: rlm is
SIGSTOPped while the broker rolls segments and its retention deletes them; once rlm resumes, the
offsets the broker deleted meanwhile are a recorded gap with exactly the range the broker lost (the
broker is the oracle: its log start is where a consumer can start again), named by status, the
metric, HTTP lookups and fetches and rlm's Kafka listener."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from rlm.testing.kafka_cluster import KafkaCluster, wait_until
from rlm.testing.sidecar import consume, run_sidecar, segment_bases
from tests.live.helpers import broker_end, broker_log_start, partition_row, produce, wait_tiered

pytestmark = [pytest.mark.kafka_live, pytest.mark.integration]

SEGMENT = 1024 * 1024  # Kafka 4 refuses a smaller segment.bytes


def test_what_the_broker_deleted_while_rlm_was_stopped_is_a_gap(
    kafka_single: KafkaCluster, tmp_path: Path
) -> None:
    topic = "gaps-while-stopped"
    node = kafka_single.nodes[0]
    boot = kafka_single.bootstrap
    kafka_single.create_topic(topic, configs={"segment.bytes": SEGMENT})
    produce(boot, topic, 2500, value_bytes=1000)  # ~2.5 segments
    part = node.log_dir / f"{topic}-0"
    with run_sidecar(node, tmp_path / "store", tmp_path / "rlm", topics={"include": [topic]}) as rlm:
        tiered = segment_bases(part)[-1] - 1  # what rolled before rlm stops
        wait_tiered(rlm.url, topic, 0, tiered)
        end = broker_end(boot, topic, 0)
        before = consume(boot, topic, 0, 0, end)
        rlm.daemon.proc.send_signal(signal.SIGSTOP)
        try:
            # While rlm is stopped: more segments roll, and the broker's retention deletes all
            # but the newest rolled one — segments rlm never saw among them.
            produce(boot, topic, 4500, value_bytes=1000, start=end)
            kafka_single.alter_topic(topic, {"retention.bytes": SEGMENT})
            wait_until(
                lambda: (
                    len(segment_bases(part)) == 2
                    and broker_log_start(boot, topic, 0) == segment_bases(part)[0]
                ),
                timeout=120,
                what="the broker's retention deleting all but the newest rolled segment",
            )
        finally:
            rlm.daemon.proc.send_signal(signal.SIGCONT)
        lost_from, broker_start = tiered + 1, broker_log_start(boot, topic, 0)
        assert broker_start > lost_from  # the broker really deleted untiered offsets
        row = wait_until(lambda: _gaps(rlm.url, topic), timeout=120, what="rlm recording the gap")
        assert [(g["first_offset"], g["last_offset"]) for g in row["gaps"]] == [(lost_from, broker_start - 1)]
        row = wait_tiered(rlm.url, topic, 0, segment_bases(part)[-1] - 1)  # the copy went on above it
        assert row["gaps"][0]["first_offset"] == lost_from and row["log_start_offset"] == 0
        _check_reads(rlm.url, rlm.kafka_bootstrap, topic, lost_from, broker_start)
        # What was tiered before the stop is still served exactly as the broker served it.
        assert consume(rlm.kafka_bootstrap, topic, 0, 0, lost_from) == before[:lost_from]
        assert _metric(rlm.url, topic) == broker_start - lost_from
    log = (tmp_path / "rlm" / f"rlm-{node.node_id}.log").read_text()
    assert f"offsets {lost_from}-{broker_start - 1} are not available in any tier" in log


def _gaps(url: str, topic: str) -> dict[str, object] | None:
    row = partition_row(url, topic, 0)
    return row if row.get("gaps") else None


def _check_reads(url: str, kafka: str, topic: str, first: int, end: int) -> None:
    """Every read surface names the gap ``[first, end)``; the offset after it reads normally."""
    base = f"{url}/v1/topics/{topic}/partitions/0"
    for offset in (first, end - 1):
        with urllib.request.urlopen(f"{base}/offsets/{offset}", timeout=10) as resp:
            doc = json.load(resp)
        assert not doc["found"] and (doc["gap"]["first_offset"], doc["gap"]["last_offset"]) == (
            first,
            end - 1,
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{base}/records?offset={offset}", timeout=10)
        assert err.value.code == 416 and f"{first}-{end - 1}" in err.value.read().decode()
    with urllib.request.urlopen(f"{base}/offsets/{end}", timeout=10) as resp:
        assert json.load(resp)["offset"] == end
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import OffsetOutOfRangeError

    tp = TopicPartition(topic, 0)
    consumer = KafkaConsumer(bootstrap_servers=kafka, auto_offset_reset="none", enable_auto_commit=False)
    try:
        consumer.assign([tp])
        consumer.seek(tp, first)
        with pytest.raises(OffsetOutOfRangeError):  # auto_offset_reset=none: raised to the caller
            for _ in range(60):  # bounded: the answer comes with the first fetch
                consumer.poll(timeout_ms=1000)
    finally:
        consumer.close()
    # auto_offset_reset=earliest resets to the log start — below the gap — and reads up to the gap
    # again (docs/visibility.md: why an operator must move such a group past a gap).
    consumer = KafkaConsumer(bootstrap_servers=kafka, auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        consumer.assign([tp])
        consumer.seek(tp, first)
        got = wait_until(
            lambda: consumer.poll(timeout_ms=1000).get(tp), timeout=60, what="records after the reset"
        )
        assert got[0].offset == 0
    finally:
        consumer.close()


def _metric(url: str, topic: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    want = f'rlm_gap_offsets{{partition="0",topic="{topic}"}} '
    return float(next(line[len(want) :] for line in text.splitlines() if line.startswith(want)))
