"""Keeping up with a live broker (issue #29): real producers write continuously while the broker
rolls and deletes by retention, and rlm runs beside it with its default configuration.

Five topics, one per codec, each rolling by size or by time and deleting by ``retention.bytes`` or
``retention.ms``. Producers: kafka-python and confluent-kafka, idempotent and transactional
(commits, aborts, transactions left open across other writes; tests/live/workload.py). While the
broker still has a segment, its ``.log`` is hard-linked aside and two consumers (read_uncommitted,
read_committed) read it from the broker (tests/live/watch.py). Once the broker deleted it, every
offset of it must be answered by rlm, as the broker answered before:

* ``GET …/offsets/{o}`` for every offset: found in the remote tier, that very offset (data or
  control record), its timestamp and batch;
* ``GET …/records`` raw, walked from the segment's base: the broker's own batches byte for byte
  (read_uncommitted), and exactly its committed data batches under read_committed; a fetch at an
  offset inside each batch starts with that batch;
* ``GET …/records?format=json`` walked at both isolation levels: the records the broker's
  consumers read (offset, timestamp, key, value, headers);
* a kafka-python consumer through rlm's Kafka listener, at both isolation levels: the same records.
"""

from __future__ import annotations

import base64
import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

from rlm.testing.kafka_cluster import KafkaCluster
from rlm.testing.sidecar import Record, Sidecar, consume, run_sidecar
from tests.live.mixed_log import CODECS
from tests.live.watch import TP, BrokerRecorder, Rolled, SegmentWatch
from tests.live.wire import Batch, Http, split_batches
from tests.live.workload import KINDS, Workload

pytestmark = [pytest.mark.kafka_live, pytest.mark.integration]

MiB = 1 << 20
#: codec → topic configs. "none" rolls by size (segment.bytes 1 MiB, Kafka's minimum), the others
#: by time (segment.ms); each deletes by time or by bytes, "zstd" by whichever comes first.
#: Retention leaves rlm tens of seconds to tier a segment (its copy waits for the next segment's
#: base to reach the checkpointed high watermark, written every 5 s).
TOPIC_CONFIGS: dict[str, dict[str, int]] = {
    "none": {"segment.bytes": MiB, "retention.ms": 20_000},
    "gzip": {"segment.bytes": MiB, "segment.ms": 5_000, "retention.bytes": 120_000},
    "snappy": {"segment.bytes": MiB, "segment.ms": 5_000, "retention.ms": 20_000},
    "lz4": {"segment.bytes": MiB, "segment.ms": 5_000, "retention.bytes": 120_000},
    "zstd": {"segment.bytes": MiB, "segment.ms": 5_000, "retention.ms": 25_000, "retention.bytes": 200_000},
}
ISOLATIONS = ("read_uncommitted", "read_committed")
TOPICS = {codec: f"keep-{codec}" for codec in CODECS}


def _rec(doc: dict[str, Any]) -> Record:
    def b64(v: str | None) -> bytes | None:
        return None if v is None else base64.b64decode(v)

    headers = tuple((h["key"], b64(h["value"]) or b"") for h in doc["headers"])
    return Record(doc["offset"], doc["timestamp"], b64(doc["key"]), b64(doc["value"]), headers)


class Segment:
    """A deleted segment as the broker wrote it: its batches and every record's timestamp
    (control records included), decoded by kafka-python from the bytes kept aside."""

    def __init__(self, rolled: Rolled) -> None:
        from kafka.record.memory_records import MemoryRecords

        self.rolled = rolled
        self.raw = rolled.aside.read_bytes()
        self.batches, tail = split_batches(self.raw)
        assert tail == 0 and self.batches, f"{rolled.aside}: not whole batches"
        assert self.batches[0].base_offset == rolled.base and self.batches[-1].last_offset == rolled.end - 1
        self.timestamps: dict[int, int] = {}
        records = MemoryRecords(self.raw)
        while (batch := records.next_batch()) is not None:
            for r in batch:
                self.timestamps[r.offset] = r.timestamp
        assert sorted(self.timestamps) == list(range(rolled.base, rolled.end)), "offsets with gaps"

    def holding(self, offset: int) -> Batch:
        return next(b for b in self.batches if b.base_offset <= offset <= b.last_offset)


class Checks:
    """rlm's answers for the offsets of deleted segments, against what the broker answered."""

    def __init__(self, sidecar: Sidecar, recorder: BrokerRecorder) -> None:
        self.sidecar, self.recorder = sidecar, recorder
        self.http = Http(sidecar.url)
        self.rng = random.Random(7)
        self.offsets = self.control_batches = self.aborted_batches = 0

    def first_look(self, rolled: Rolled) -> None:
        """Right after the broker deleted ``rolled``, while producers keep writing: its first and
        last offsets are found in the remote tier and a fetch at its base starts with its bytes."""
        seg = Segment(rolled)
        (topic, partition) = rolled.tp
        for offset in (rolled.base, rolled.end - 1):
            doc = self.http.lookup(topic, partition, offset)
            assert (doc["found"], doc.get("tier"), doc.get("offset")) == (True, "remote", offset), doc
        status, _, body = self.http.records(topic, partition, rolled.base, max_bytes=1)
        assert status == 200 and split_batches(body)[0][0] == seg.batches[0], (rolled, status, body[:200])

    def segment(self, rolled: Rolled) -> None:
        """Every offset of a deleted segment, every way rlm answers it (the module doc)."""
        seg = Segment(rolled)
        tp, base, end = rolled.tp, rolled.base, rolled.end
        read = {iso: self.recorder.read(iso, tp, base, end) for iso in ISOLATIONS}
        data = [o for b in seg.batches if not b.control for o in range(b.base_offset, b.last_offset + 1)]
        assert [r.offset for r in read["read_uncommitted"]] == data, "the consumer missed records"
        committed = {r.offset for r in read["read_committed"]}
        self.lookups(seg)
        self.raw_walk(seg, None, seg.raw)
        kept = [b for b in seg.batches if not b.control and b.base_offset in committed]
        self.raw_walk(seg, "read_committed", b"".join(b.raw for b in kept))
        self.inner_fetches(seg)
        for iso, expected in read.items():
            assert self.json_walk(tp, base, end, iso) == expected, f"{tp} [{base}, {end}) json {iso}"
        self.offsets += end - base
        self.control_batches += sum(b.control for b in seg.batches)
        self.aborted_batches += sum(
            1 for b in seg.batches if b.transactional and not b.control and b.base_offset not in committed
        )

    def through_listener(self, tp: TP, end: int) -> None:
        """A kafka-python consumer through rlm's Kafka listener reads ``[0, end)`` (every deleted
        segment) exactly as the broker's consumers read it before."""
        for iso in ISOLATIONS:
            expected = self.recorder.read(iso, tp, 0, end)
            got = consume(self.sidecar.kafka_bootstrap, tp[0], tp[1], 0, end, isolation=iso, timeout=180)
            assert got == expected, f"{tp} [0, {end}) through rlm's listener, {iso}"

    def lookups(self, seg: Segment) -> None:
        (topic, partition), rolled = seg.rolled.tp, seg.rolled
        for offset in range(rolled.base, rolled.end):
            doc = self.http.lookup(topic, partition, offset)
            batch = seg.holding(offset)
            want = {"found": True, "tier": "remote", "offset": offset, "timestamp": seg.timestamps[offset]}
            assert {k: doc.get(k) for k in want} == want, (rolled, doc)
            assert doc["batch"] == {"base_offset": batch.base_offset, "last_offset": batch.last_offset}, doc

    def raw_walk(self, seg: Segment, isolation: str | None, expected: bytes) -> None:
        """``/records`` from the segment's base until its end: the bytes of its batches."""
        (topic, partition), rolled = seg.rolled.tp, seg.rolled
        got, offset = b"", rolled.base
        while offset < rolled.end:
            status, headers, body = self.http.records(topic, partition, offset, isolation=isolation)
            assert status == 200, (rolled, offset, isolation, status, body[:200])
            assert headers["x-rlm-tier"] == "remote", headers
            batches, tail = split_batches(body)
            assert tail == 0
            got += b"".join(b.raw for b in batches if b.base_offset < rolled.end)
            nxt = int(headers["x-rlm-next-offset"])
            assert nxt > offset, (rolled, offset, headers)
            offset = nxt
        assert got == expected, f"{rolled} raw {isolation}: {len(got)} bytes, the broker's {len(expected)}"

    def inner_fetches(self, seg: Segment) -> None:
        """A fetch at an offset inside each batch starts with that batch (Kafka's rule)."""
        (topic, partition) = seg.rolled.tp
        for batch in seg.batches:
            offset = self.rng.randint(batch.base_offset, batch.last_offset)
            status, _, body = self.http.records(topic, partition, offset, max_bytes=1)
            assert status == 200, (seg.rolled, offset, body[:200])
            assert split_batches(body)[0][0] == batch, (seg.rolled, offset)

    def json_walk(self, tp: TP, base: int, end: int, isolation: str) -> list[Record]:
        out: list[Record] = []
        offset = base
        while offset < end:
            status, _, body = self.http.records(tp[0], tp[1], offset, fmt="json", isolation=isolation)
            assert status == 200, (tp, offset, status, body[:200])
            doc = json.loads(body)
            for b in doc["batches"]:
                if not b["is_control"]:
                    out += [_rec(r) for r in b["records"] if base <= r["offset"] < end]
            assert doc["next_offset"] > offset, (tp, offset, doc["next_offset"])
            offset = doc["next_offset"]
        return out


def _quiet(sidecar: Sidecar) -> None:
    """rlm ran beside the broker's rolls and deletions without an error."""
    text = sidecar.daemon.log_text()
    bad = [line for line in text.splitlines() if " ERROR " in line or "Traceback" in line]
    assert not bad, "\n".join(bad[:20])


def _produce_until_deleted(
    workload: Workload, watch: SegmentWatch, checks: Checks, tps: list[TP], timeout: float = 420
) -> None:
    """Produce until the broker deleted a segment of every partition; each deletion is looked at
    (:meth:`Checks.first_look`) as soon as it is seen, while the producers keep writing."""
    seen: dict[TP, set[int]] = {tp: set() for tp in tps}
    deadline = time.monotonic() + timeout
    while not all(seen.values()):
        assert time.monotonic() < deadline, f"segments the broker deleted within {timeout:.0f} s: {seen}"
        workload.wait_steps(1)
        for tp in tps:
            for rolled in watch.deleted_now(tp):
                if rolled.base not in seen[tp]:
                    checks.first_look(rolled)
                    seen[tp].add(rolled.base)


def _verify_deleted(checks: Checks, recorder: BrokerRecorder, deleted_by_tp: dict[TP, list[Rolled]]) -> int:
    """Every segment the broker deleted while the producers wrote, in full; the number of segments.
    (Not those deleted after they stopped: time retention then deletes the active segment too,
    rolled and deleted at once — a segment never seen rolled cannot have been copied.)"""
    total = 0
    for tp, deleted in deleted_by_tp.items():
        assert [r.base for r in deleted] == [0] + [r.end for r in deleted[:-1]], f"{tp}: a segment unseen"
        for iso in ISOLATIONS:
            assert recorder.past(iso, tp, deleted[-1].end), (tp, iso, recorder.positions[iso][tp])
        for rolled in deleted:
            checks.segment(rolled)
        checks.through_listener(tp, deleted[-1].end)
        total += len(deleted)
    return total


def test_every_offset_the_broker_deleted_is_answered_by_rlm_as_the_broker_did(
    kafka_single: KafkaCluster, tmp_path: Path
) -> None:
    node = kafka_single.nodes[0]
    tps = [(TOPICS[c], 0) for c in CODECS]
    for codec, topic in TOPICS.items():
        kafka_single.create_topic(topic, configs=TOPIC_CONFIGS[codec])
    workload = Workload(
        node.bootstrap,
        {codec: [(TOPICS[codec], 0)] for codec in CODECS},
        value_bytes={TOPICS["none"]: 600},
        weights={"none": 4},
        gap_s=0.05,
    )
    sidecar_cm = run_sidecar(
        node,
        tmp_path / "store",
        tmp_path / "work",
        tiering={"state_dir": str(tmp_path / "state")},
        topics={"include": ["keep-*"]},
    )
    watch = SegmentWatch(node.log_dir, tps, tmp_path / "aside")
    recorder = BrokerRecorder(node.bootstrap, tps)
    with sidecar_cm as sidecar, watch, recorder, workload:
        checks = Checks(sidecar, recorder)
        started = time.monotonic()
        _produce_until_deleted(workload, watch, checks, tps)
        workload.stop()
        recorder.stop()
        deleted = {tp: watch.deleted_now(tp) for tp in tps}
        live_s = time.monotonic() - started
        segments = _verify_deleted(checks, recorder, deleted)
        checks.http.close()
        _quiet(sidecar)
    counts = workload.counts
    assert counts.committed and counts.aborted and counts.left_open, counts
    assert set(workload.per_client) == {(k, c) for k in KINDS for c in CODECS}, workload.per_client
    assert checks.control_batches and checks.aborted_batches, (checks.control_batches, checks.aborted_batches)
    print(f"keeping up: {counts} in {live_s:.0f} s; verified {checks.offsets} offsets in {segments} segments")
