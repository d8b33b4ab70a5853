"""The broker's deadlines beside a live Kafka broker (#30 item 3; docs/topic-policy.md §8), with
the broker as the oracle: rlm runs with a store that fails every call, so a rolled segment stays
untiered while the topic's short ``retention.ms`` runs out; the deadline rlm reports for it (status
and ``rlm_retention_margin_seconds``) must be when the broker really renames it away — not
before, and at most one retention check (``log.retention.check.interval.ms``, 1 s here) after.
The margin goes down pass after pass and rlm warns once."""

from __future__ import annotations

import math
import re
import time
import urllib.request
from pathlib import Path

import pytest

from rlm.testing.configs import faulty_local_options
from rlm.testing.kafka_cluster import KafkaCluster, wait_until
from rlm.testing.sidecar import run_sidecar
from tests.live.helpers import partition_row, produce

pytestmark = [pytest.mark.kafka_live, pytest.mark.integration]

SEGMENT = 1024 * 1024  # Kafka 4 refuses a smaller segment.bytes
RETENTION_MS = 12_000  # rlm sees a rolled segment once the HW checkpoint (every 5 s) covers it
CHECK_INTERVAL_MS = 1_000  # the harness's log.retention.check.interval.ms (rlm.testing.kafka_cluster)
POLL_MS = 50  # how often the test looks for the segment
SLACK_MS = 1_000  # a check that runs late on a loaded host, and the test's own observation


def margin_metric(url: str, topic: str) -> float | None:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    pattern = rf'^rlm_retention_margin_seconds\{{[^}}]*topic="{re.escape(topic)}"[^}}]*\}} (\S+)$'
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else None


def reported_deadline(url: str, topic: str) -> int:
    """The deadline rlm reports for the topic's first segment while its store is down: in status
    (a time deadline, its margin going down pass after pass) and as the metric."""
    row = wait_until(
        lambda: (r := partition_row(url, topic, 0))["retention_deadline_offset"] == 0 and r,
        timeout=RETENTION_MS / 1000,
        what="rlm's deadline of the first segment, before it expires",
    )
    predicted = row["retention_deadline_ms"]
    assert row["retention_deadline_cause"] == "time"
    assert row["highest_tiered_offset"] == -1  # the store took nothing
    assert 0 < row["retention_margin_ms"] <= RETENTION_MS
    assert row["policy"]["local_retention_ms"]["value"] == RETENTION_MS
    later = wait_until(
        lambda: (r := partition_row(url, topic, 0))["retention_margin_ms"] < row["retention_margin_ms"] and r,
        timeout=5,
        what="the margin going down",
    )
    assert later["retention_deadline_ms"] == predicted  # the same deadline, nearer
    metric = wait_until(
        lambda: (m := margin_metric(url, topic)) is not None and m < math.inf and m,
        timeout=5,
        what="a pass publishing the margin although its copy failed",
    )
    assert 0 < metric <= RETENTION_MS / 1000
    return int(predicted)


def test_the_deadline_rlm_reports_is_when_the_broker_deletes_the_segment(
    kafka_single: KafkaCluster, tmp_path: Path
) -> None:
    topic = "deadline-oracle"
    node = kafka_single.nodes[0]
    kafka_single.create_topic(topic, configs={"segment.bytes": SEGMENT, "retention.ms": RETENTION_MS})
    first = node.log_dir / f"{topic}-0" / f"{0:020d}.log"
    store = tmp_path / "store"
    failing = faulty_local_options(store, {"error_rate": 1.0})
    tiering = {"task_interval_ms": 200, "deadline_warn_ms": 60_000}
    with run_sidecar(
        node,
        store,
        tmp_path / "rlm",
        backend="faulty",
        options=failing,
        tiering=tiering,
        topics={"include": [topic]},
    ) as rlm:
        produce(kafka_single.bootstrap, topic, 1500, value_bytes=1000)  # one rolled segment, CreateTime now
        predicted = reported_deadline(rlm.url, topic)
        wait_until(
            lambda: not first.exists(),
            timeout=RETENTION_MS / 1000 + 20,
            what="the broker's deletion",
            interval=POLL_MS / 1000,
        )
        gone_ms = int(time.time() * 1000)
        # The oracle: the broker deleted it at its first retention check at or after the deadline
        # (gone_ms is when the test saw it, at or after the deletion).
        assert predicted <= gone_ms <= predicted + CHECK_INTERVAL_MS + SLACK_MS, (
            predicted,
            gone_ms,
        )
    log = (tmp_path / "rlm" / f"rlm-{node.node_id}.log").read_text()
    warned = [line for line in log.splitlines() if f"{topic}-0: the broker may delete segment 0 " in line]
    assert len(warned) == 1, warned  # once for the episode, not once per pass
