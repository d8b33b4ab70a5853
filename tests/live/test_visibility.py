"""What a reader sees, the broker against rlm (issue #29): at many moments while real producers
write (tests/live/workload.py: both clients, idempotent and transactional with commits, aborts
and transactions left open, every codec, some records with timestamps in the past), the broker's
answers equal rlm's — through rlm's Kafka listener and its HTTP API — for the offsets rlm holds.

**A fair comparison.** rlm sees the broker only through its files: the high watermark is the one in
``replication-offset-checkpoint``, written every ``replica.high.watermark.checkpoint.interval.ms``
(5 s), so while producers write, rlm's answers describe the broker of up to 5 s ago and no single
broker answer is "the same moment". So each moment pauses the producers at a step boundary —
anywhere: with transactions open, just after an abort, between two bursts — waits until rlm's
high watermark is the broker's, then asks both the same questions between two fingerprints of the
broker (its high watermark, last stable offset, log start, local log start and segment files).
Only when nothing changed in between (a transaction's markers, written by the coordinator after
EndTxn returned, may still land; retention may delete a segment) are the answers compared, else
the moment is asked again. The answers are then those of one broker state, which rlm's files
describe completely. (The shared broker keeps Kafka's 5 s checkpoint interval: a shorter one
would make a moment quicker to reach, not the comparison fairer.)

**Differences on purpose** (docs/kafka-listener.md §11), and only these, are accepted; each is
asserted as documented, not skipped:

* rlm holds the offsets the broker deleted by retention (the remote tier): its log start offset
  (Fetch ``log_start_offset``, ListOffsets -2) may be lower, it serves those offsets where the
  broker answers OFFSET_OUT_OF_RANGE, a timestamp lookup may answer one of them, and a
  transaction still open whose first records only rlm holds puts rlm's last stable offset below
  the broker's (both ``max(first unstable offset, log start)``, each with its own log start).
  "Holds" is what rlm had tiered before its answers were asked (its -5) less the gaps it recorded.
  Here the broker may delete a segment within 3 s of its roll (``retention.bytes``; Kafka deletes
  what lies below its in-memory high watermark), while rlm learns that watermark only from the 5 s
  checkpoint: a pass may come too late to pin the segment, more often on a loaded host. Those
  offsets lie inside rlm's ``[log start, HW)`` and are OFFSET_OUT_OF_RANGE all the same: a gap
  (docs/visibility.md "Gaps"), answered so before and after rlm's next pass records it;
* ListOffsets -5 (latest tiered): the broker beside rlm has no remote storage and answers -1, rlm
  its highest tiered offset;
* leader epochs of -1, -2, -4, -5 answers are -1 (clients then skip epoch validation);
* a read_committed Fetch lists the aborted transactions of the batches it returns; the broker's
  list may add transactions that begin after them, up to its offset index's next entry or the
  segment's end (Kafka's ``fetchUpperBoundOffset``), which a consumer ignores;
* a broker's Fetch may end with a partial batch (clients drop it), rlm's never: the whole batches
  are compared (tests/live/wire.py).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlm.testing.kafka_cluster import KafkaCluster, KafkaNode, wait_until
from rlm.testing.sidecar import Sidecar, consume, run_sidecar
from tests.live.answers import (
    EARLIEST,
    LATEST,
    LATEST_TIERED,
    Moment,
    ask,
    fetch_differences,
    fingerprint,
    http_differences,
    list_differences,
    recorded_gaps,
    timestamp_differences,
)
from tests.live.mixed_log import CODECS
from tests.live.wire import Http, Wire
from tests.live.workload import Workload

pytestmark = [pytest.mark.kafka_live, pytest.mark.integration]

TOPIC = "vis"
PARTITIONS = 2
#: Segments roll every few seconds and the oldest are deleted by size while the moments are taken,
#: so the broker's log start moves (and rlm holds offsets below it in its remote tier).
CONFIGS = {"segment.bytes": 1 << 20, "segment.ms": 3000, "retention.bytes": 60_000}
MOMENTS = 12
CONSUMERS_EVERY = 4  # kafka-python consumers on both sides at every 4th moment (they are slow)


@dataclass
class Coverage:
    """What the compared moments contained: the test fails if a kind of moment never came up."""

    moments: int = 0
    retries: int = 0  # the broker moved while asked: asked again
    open_txn: int = 0  # last stable offset below the high watermark
    aborted_listed: int = 0  # a broker Fetch listed aborted transactions
    control_batches: int = 0
    rlm_below_broker: int = 0  # rlm held offsets below the broker's log start
    untiered: int = 0  # rlm had not tiered (or lost) offsets just below the broker's log start
    consumers: int = 0

    def add(self, m: Moment) -> None:
        self.moments += 1
        self.open_txn += m.lso < m.hw
        self.aborted_listed += any(f.aborted for f in m.broker.fetched.values())
        self.control_batches += any(b.control for f in m.broker.fetched.values() for b in f.batches)
        self.rlm_below_broker += m.rlm_start < m.broker_start
        self.untiered += m.rlm_start < m.broker_start and not m.rlm_holds(m.broker_start - 1)


@dataclass
class Sides:
    """One partition asked of the broker and of rlm (its listener and its HTTP API)."""

    broker: Wire
    rlm: Wire
    http: Http
    node: KafkaNode
    partition: int

    @property
    def part_dir(self) -> Path:
        return self.node.log_dir / f"{TOPIC}-{self.partition}"

    def close(self) -> None:
        for c in (self.broker, self.rlm, self.http):
            c.close()


def _starts(rng: random.Random, broker_start: int, rlm_start: int, lso: int, hw: int) -> list[int]:
    """Fetch offsets: the edges (log starts, LSO, HW and their neighbours: the broker's log start
    - 1 is the newest offset only rlm may hold) and a random sample."""
    edges = {broker_start - 1, broker_start, broker_start + 1, rlm_start, rlm_start - 1, lso - 1, lso}
    edges |= {hw - 1, hw, hw + 1}
    inside = [rng.randrange(broker_start, hw) for _ in range(10)] if hw > broker_start else []
    return sorted(o for o in edges | set(inside) if o >= 0)


def _stamps(rng: random.Random, moment: Moment) -> list[int]:
    """Timestamps to look up: of batches the broker returned (some written in the past), their
    neighbours, 0 and one no record has."""
    seen = sorted({t for f in moment.broker.fetched.values() for b in f.batches for t in b.timestamps})
    picked = rng.sample(seen, min(6, len(seen)))
    future = int(time.time() * 1000) + 3_600_000
    return sorted({0, future, *picked, *(t - 1 for t in picked), *(t + 1 for t in picked)})


def _compare_once(s: Sides, rng: random.Random) -> tuple[Moment, list[str]] | None:
    """One attempt at a moment: None when the broker moved while it was asked."""
    p = s.partition
    before = fingerprint(s.broker, TOPIC, p, s.part_dir)
    hw, lso, start = before.hw, before.lso, before.start
    starts = _starts(rng, start, s.rlm.list_offset(TOPIC, p, EARLIEST).offset, lso, hw)
    probe = Moment(ask(s.broker, TOPIC, p, starts, []), ask(s.rlm, TOPIC, p, [], []))
    stamps = _stamps(rng, probe)
    tiered = probe.rlm.offset(LATEST_TIERED)  # before rlm's Fetch answers: what they must serve
    broker, rlm = ask(s.broker, TOPIC, p, starts, stamps), ask(s.rlm, TOPIC, p, starts, stamps)
    moment = Moment(broker, rlm, tiered, recorded_gaps(s.http, TOPIC, p))
    diffs = [
        *fetch_differences(moment),
        *list_differences(moment),
        *http_differences(s.http, TOPIC, p, moment),
        *timestamp_differences(s.http, TOPIC, p, moment),
    ]
    if (
        fingerprint(s.broker, TOPIC, p, s.part_dir) != before
        or s.rlm.list_offset(TOPIC, p, LATEST).offset != hw
    ):
        return None
    return moment, diffs


def _compare(s: Sides, rng: random.Random, cov: Coverage) -> tuple[Moment, list[str]]:
    """One moment of the partition: rlm's high watermark caught up with the broker's, then both
    asked until the broker held still for a whole round (the module doc)."""
    p = s.partition
    for _ in range(8):
        wait_until(
            lambda: (
                s.rlm.list_offset(TOPIC, p, LATEST).offset == s.broker.list_offset(TOPIC, p, LATEST).offset
            ),
            timeout=60,
            what=f"rlm's high watermark of {TOPIC}-{p} = the broker's",
        )
        got = _compare_once(s, rng)
        if got is not None:
            cov.add(got[0])
            return got
        cov.retries += 1
    raise AssertionError(f"{TOPIC}-{p}: the broker never held still for a whole comparison")


def _consumers(sidecar: Sidecar, broker_bootstrap: str, m: Moment, p: int) -> list[str]:
    """kafka-python consumers, the broker's and one through rlm's listener, read the same records
    from the broker's log start to the high watermark (read_committed: to the last stable offset)."""
    diffs = []
    for iso, end in (("read_uncommitted", m.hw), ("read_committed", m.lso)):
        want = consume(broker_bootstrap, TOPIC, p, m.broker_start, end, isolation=iso)
        got = consume(sidecar.kafka_bootstrap, TOPIC, p, m.broker_start, end, isolation=iso)
        if got != want:
            diffs.append(
                f"consumer {iso} [{m.broker_start}, {end}): rlm {len(got)} records, broker {len(want)}"
            )
    return diffs


def _moments(sidecar: Sidecar, node: KafkaNode, workload: Workload, cov: Coverage) -> list[str]:
    """Every moment's differences, each line naming the moment and the partition."""
    rng = random.Random(41)
    sides = [
        Sides(Wire(node.bootstrap), Wire(sidecar.kafka_bootstrap), Http(sidecar.url), node, p)
        for p in range(PARTITIONS)
    ]
    diffs: list[str] = []
    try:
        for i in range(MOMENTS):
            workload.wait_steps(rng.randint(5, 40))
            open_now = workload.pause()
            for s in sides:
                moment, found = _compare(s, rng, cov)
                if i % CONSUMERS_EVERY == CONSUMERS_EVERY - 1:
                    found += _consumers(sidecar, node.bootstrap, moment, s.partition)
                    cov.consumers += 1
                diffs += [f"moment {i} ({len(open_now)} open) {TOPIC}-{s.partition}: {d}" for d in found]
            workload.resume()
    finally:
        for s in sides:
            s.close()
    return diffs


def test_the_broker_and_rlm_answer_alike_at_every_moment(kafka_single: KafkaCluster, tmp_path: Path) -> None:
    node = kafka_single.nodes[0]
    kafka_single.create_topic(TOPIC, partitions=PARTITIONS, configs=CONFIGS)
    tps = [(TOPIC, p) for p in range(PARTITIONS)]
    workload = Workload(node.bootstrap, {c: tps for c in CODECS}, old_timestamps=True, gap_s=0.05, seed=41)
    cov = Coverage()
    sidecar_cm = run_sidecar(
        node,
        tmp_path / "store",
        tmp_path / "work",
        tiering={"state_dir": str(tmp_path / "state")},  # this module's own (the broker is shared)
        topics={"include": [TOPIC]},
    )
    with sidecar_cm as sidecar, workload:
        diffs = _moments(sidecar, node, workload, cov)
        workload.stop()
    print(f"visibility: {cov}; {workload.counts}")
    assert not diffs, "\n".join(diffs[:60])
    assert cov.open_txn and cov.aborted_listed and cov.control_batches and cov.consumers, cov
