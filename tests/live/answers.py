"""One moment's answers of a partition, asked of the broker and of rlm, and their comparison
(tests/live/test_visibility.py says what is compared and which differences are on purpose).

Every comparison returns the differences it found as lines, so a failing moment names all of them
at once: the broker's answer, rlm's, and the question.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from tests.live.wire import COMMITTED, UNCOMMITTED, Batch, Fetched, Http, Listed, Wire, consumer_filter

OUT_OF_RANGE = 1
SPECIALS = (-1, -2, -3, -4, -5)
LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = SPECIALS
#: Fetch budgets: one batch at most (the first is always whole), a few batches, everything.
SIZES = (1, 6000, 1 << 20)

Question = tuple[int, int, int]  # fetch offset, isolation, max bytes


@dataclass
class Answers:
    """What one listener answered: Fetch by (offset, isolation, max bytes), ListOffsets by
    (timestamp, isolation)."""

    fetched: dict[Question, Fetched] = field(default_factory=dict)
    listed: dict[tuple[int, int], Listed] = field(default_factory=dict)

    def offset(self, timestamp: int, isolation: int = UNCOMMITTED) -> int:
        return self.listed[(timestamp, isolation)].offset


def ask(wire: Wire, topic: str, partition: int, starts: Iterable[int], stamps: Iterable[int]) -> Answers:
    """Fetch from every start at both isolation levels and every size of :data:`SIZES`; ListOffsets
    for each special timestamp and each of ``stamps``, at both isolation levels."""
    out = Answers()
    for start in starts:
        for iso in (UNCOMMITTED, COMMITTED):
            for size in SIZES:
                out.fetched[(start, iso, size)] = wire.fetch(topic, partition, start, iso, size)
    for ts in (*SPECIALS, *stamps):
        for iso in (UNCOMMITTED, COMMITTED):
            out.listed[(ts, iso)] = wire.list_offset(topic, partition, ts, iso)
    return out


class Fingerprint(NamedTuple):
    """The broker's state as far as a reader can tell: HW, LSO, log start, local log start and the
    segment files (a roll or a deletion changes them)."""

    hw: int
    lso: int
    start: int
    local_start: int
    files: tuple[str, ...]


def fingerprint(wire: Wire, topic: str, partition: int, part_dir: Path) -> Fingerprint:
    def listed(ts: int, iso: int = UNCOMMITTED) -> int:
        return wire.list_offset(topic, partition, ts, iso).offset

    files = tuple(sorted(n for n in os.listdir(part_dir) if n.endswith((".log", ".deleted"))))
    return Fingerprint(
        listed(LATEST), listed(LATEST, COMMITTED), listed(EARLIEST), listed(EARLIEST_LOCAL), files
    )


# -- the comparison ---------------------------------------------------------------------------------


@dataclass
class Moment:
    """The two sides' answers at one broker state, and what the broker's own answers say of it.

    ``tiered``: rlm's highest tiered offset asked before its Fetch answers (its -5; it only grows);
    ``gaps``: the gaps rlm recorded (inclusive ranges, docs/visibility.md "Gaps"), asked after them.
    Together they say which offsets the broker deleted rlm holds (:meth:`rlm_holds`)."""

    broker: Answers
    rlm: Answers
    tiered: int = -1
    gaps: tuple[tuple[int, int], ...] = ()

    @property
    def hw(self) -> int:
        return self.broker.offset(LATEST)

    @property
    def lso(self) -> int:
        return self.broker.offset(LATEST, COMMITTED)

    @property
    def broker_start(self) -> int:
        return self.broker.offset(EARLIEST)

    @property
    def rlm_start(self) -> int:
        return self.rlm.offset(EARLIEST)

    def in_gap(self, offset: int) -> bool:
        return any(first <= offset <= last for first, last in self.gaps)

    def rlm_holds(self, offset: int) -> bool:
        """Whether rlm held ``offset``, one the broker deleted, when its Fetch answers were asked:
        tiered by then and in no gap. Its log start is no promise of that: an offset the broker
        deleted before rlm tiered it is held by no tier (a gap, recorded at rlm's next pass, or a
        pin waiting for its copy, which is no read tier: docs/architecture.md §5.1)."""
        return self.rlm_start <= offset <= self.tiered and not self.in_gap(offset)


def lso_as_broker(m: Moment, broker_lso: int, rlm_lso: int) -> bool:
    """rlm's last stable offset against the broker's: equal, except that a transaction still open
    whose first records the broker deleted while rlm holds them bounds rlm below the broker's log
    start (both answer ``max(first unstable offset, log start)``, each with its own log start)."""
    if rlm_lso == broker_lso:
        return True
    return broker_lso == m.broker_start and m.rlm_start <= rlm_lso < m.broker_start


def fetch_differences(m: Moment) -> Iterator[str]:
    for q, b in m.broker.fetched.items():
        r = m.rlm.fetched[q]
        start = q[0]
        if start < m.broker_start and b.error == OUT_OF_RANGE and m.rlm_start <= start < m.hw:
            yield from _deleted_by_broker(m, q, r)
            continue
        want_lso = b.last_stable_offset  # answered under both isolation levels, as the broker does
        got_lso = r.last_stable_offset
        if lso_as_broker(m, want_lso, got_lso):
            got_lso = want_lso  # the same, or lower on purpose (lso_as_broker)
        want = (b.error, b.high_watermark, want_lso, b.batches)
        got = (r.error, r.high_watermark, got_lso, r.batches)
        if want != got:
            yield f"fetch {q}: broker {_short(b)}, rlm {_short(r)}"
        rlm_start = r.log_start_offset
        if b.error == 0 and not (rlm_start == m.rlm_start and rlm_start <= b.log_start_offset):
            yield f"fetch {q}: log start broker {b.log_start_offset}, rlm {rlm_start} (-2: {m.rlm_start})"
        if b.error == 0 and _relevant(b) != r.aborted:
            yield f"fetch {q}: aborted transactions broker {b.aborted}, rlm {r.aborted}"


def _deleted_by_broker(m: Moment, q: Question, r: Fetched) -> Iterator[str]:
    """rlm's answer for an offset the broker deleted, inside rlm's ``[log start, HW)``: served when
    rlm holds it (on purpose: its remote tier); OFFSET_OUT_OF_RANGE inside a recorded gap, as a
    broker answers an offset it does not have (docs/visibility.md "Gaps"); above what was tiered
    before the question, either: the copy may have landed since."""
    start, iso, _ = q
    served = r.error == 0 and bool(r.batches or (iso == COMMITTED and start >= r.last_stable_offset))
    if m.rlm_holds(start):
        if not served:
            yield f"fetch {q}: rlm does not serve an offset it holds (error {r.error}, tiered {m.tiered})"
    elif m.in_gap(start):
        if r.error != OUT_OF_RANGE:
            yield f"fetch {q}: inside rlm's gaps {m.gaps}: rlm {_short(r)}, not OFFSET_OUT_OF_RANGE"
    elif not served and r.error != OUT_OF_RANGE:
        yield f"fetch {q}: not tiered by {m.tiered}: rlm {_short(r)}, neither records nor OUT_OF_RANGE"


def recorded_gaps(http: Http, topic: str, partition: int) -> tuple[tuple[int, int], ...]:
    """The gaps rlm recorded for the partition (``GET /v1/partitions``, docs/visibility.md "Gaps")."""
    status, _, body = http.get("/v1/partitions")
    assert status == 200, (status, body[:300])
    rows = [r for r in json.loads(body) if (r.get("topic"), r.get("partition")) == (topic, partition)]
    assert len(rows) == 1, f"{topic}-{partition}: {len(rows)} rows in /v1/partitions"
    return tuple((g["first_offset"], g["last_offset"]) for g in rows[0]["gaps"])


def _relevant(b: Fetched) -> tuple[tuple[int, int], ...] | None:
    """The broker's aborted transactions that begin at or before its last returned offset (on
    purpose, see the test's doc); None for read_uncommitted."""
    if b.aborted is None:
        return None
    if not b.batches:
        return ()
    last = b.batches[-1].last_offset
    return tuple(a for a in b.aborted if a[1] <= last)


def _short(f: Fetched) -> str:
    spans = [(x.base_offset, x.last_offset) for x in f.batches]
    return (
        f"error {f.error} hw {f.high_watermark} lso {f.last_stable_offset} start {f.log_start_offset} "
        f"aborted {f.aborted} batches {spans[:3]}{'...' if len(spans) > 3 else ''}/{len(spans)}"
    )


def has_ts(ts: int) -> bool:
    """Whether a ListOffsets answer for ``ts`` names a record (-3 and timestamps ≥ 0)."""
    return ts == MAX_TIMESTAMP or ts >= 0


def list_differences(m: Moment) -> Iterator[str]:
    for (ts, iso), b in m.broker.listed.items():
        r = m.rlm.listed[(ts, iso)]
        if ts == LATEST_TIERED:  # no remote storage on the broker: -1; rlm's highest tiered offset
            if b.offset != -1 or not (r.offset == -1 or m.rlm_start <= r.offset < m.hw):
                yield f"list {ts} iso {iso}: broker {b}, rlm {r}"
            continue
        if ts == EARLIEST:
            if r.error or not r.offset <= b.offset:
                yield f"list -2 iso {iso}: broker {b}, rlm {r}"
            continue
        if ts >= 0 and 0 <= r.offset < m.broker_start:
            continue  # a record only rlm still holds (on purpose)
        if ts == LATEST and iso == COMMITTED and lso_as_broker(m, b.offset, r.offset):
            continue
        epoch = b.leader_epoch if has_ts(ts) else -1  # -1 on purpose: docs/kafka-listener.md §11
        if (r.error, r.offset, r.timestamp, r.leader_epoch) != (b.error, b.offset, b.timestamp, epoch):
            yield f"list {ts} iso {iso}: broker {b}, rlm {r}"


# -- the HTTP API -----------------------------------------------------------------------------------


def records_of(
    batches: Iterable[Batch],
) -> list[tuple[int, int, bytes | None, bytes | None, tuple[object, ...]]]:
    """Every record of data batches (kafka-python's decode), as (offset, ts, key, value, headers)."""
    from kafka.record.memory_records import MemoryRecords

    out = []
    for b in batches:
        batch = MemoryRecords(b.raw).next_batch()
        out += [(r.offset, r.timestamp, r.key, r.value, tuple((k, v) for k, v in r.headers)) for r in batch]
    return out


def http_differences(http: Http, topic: str, partition: int, m: Moment) -> Iterator[str]:
    """rlm's HTTP answers for the same questions: lookups, raw fetches (read_uncommitted: the
    broker's batches; read_committed: what a consumer keeps of the broker's answer, rlm filtering
    on the server, docs/transactions.md) and JSON (the same records)."""
    for (start, iso, size), b in m.broker.fetched.items():
        if size != SIZES[1] or b.error != 0:
            continue
        isolation = "read_committed" if iso == COMMITTED else None
        status, headers, body = http.records(topic, partition, start, isolation=isolation, max_bytes=size)
        kept = list(b.batches) if iso == UNCOMMITTED else consumer_filter(b.batches, b.aborted or ())
        bases = [x.base_offset for x in kept]
        if status != 200 or body != b"".join(x.raw for x in kept):
            yield f"http raw {start} {isolation}: {status} {len(body)} bytes, the broker's batches {bases}"
            continue
        hw, lso = int(headers["x-rlm-high-watermark"]), int(headers.get("x-rlm-last-stable-offset", -1))
        if hw != m.hw:
            yield f"http raw {start}: X-Rlm-High-Watermark {hw}, the broker's {m.hw}"
        if iso == COMMITTED and not lso_as_broker(m, m.lso, lso):
            yield f"http raw {start}: X-Rlm-Last-Stable-Offset {lso}, the broker's {m.lso}"
        if iso == COMMITTED:
            yield from _json_difference(http, topic, partition, start, size, kept)
        else:
            yield from _lookup_difference(http, topic, partition, start, b, m)


def _json_difference(
    http: Http, topic: str, partition: int, start: int, size: int, kept: list[Batch]
) -> Iterator[str]:
    status, _, body = http.records(
        topic, partition, start, fmt="json", isolation="read_committed", max_bytes=size
    )
    doc = json.loads(body)
    if status != 200:
        yield f"http json {start}: {status} {doc}"
        return
    got = [
        (
            r["offset"],
            r["timestamp"],
            _b64(r["key"]),
            _b64(r["value"]),
            tuple((h["key"], _b64(h["value"])) for h in r["headers"]),
        )
        for batch in doc["batches"]
        for r in batch["records"]
    ]
    want = records_of(kept)  # whole batches, as the broker returned them (docs/http-api.md §3)
    if got != want:
        offsets = [r[0] for r in got][:5], [r[0] for r in want][:5]
        yield f"http json {start} read_committed: offsets {offsets[0]}…, the broker's {offsets[1]}…"


def _b64(v: str | None) -> bytes | None:
    return None if v is None else base64.b64decode(v)


def _lookup_difference(
    http: Http, topic: str, partition: int, start: int, b: Fetched, m: Moment
) -> Iterator[str]:
    doc = http.lookup(topic, partition, start)
    if not b.batches:
        if doc["found"] and start >= m.hw:
            yield f"lookup {start}: found at or above the high watermark {m.hw}: {doc}"
        return
    first = b.batches[0]
    ts = _timestamp_of(first, start)
    want = (True, start, ts, {"base_offset": first.base_offset, "last_offset": first.last_offset})
    got = (doc["found"], doc.get("offset"), doc.get("timestamp"), doc.get("batch"))
    if got != want:
        yield f"lookup {start}: rlm {got}, broker's record {want}"


def _timestamp_of(batch: Batch, offset: int) -> int:
    from kafka.record.memory_records import MemoryRecords

    decoded = MemoryRecords(batch.raw).next_batch()
    return next(r.timestamp for r in decoded if r.offset == offset)


def timestamp_differences(http: Http, topic: str, partition: int, m: Moment) -> Iterator[str]:
    """``GET …/timestamps/{ts}`` (rlm's lookup object, docs/visibility.md "ListOffsets specs")
    against the broker's read_uncommitted ListOffsets: the same offset (and for -3 and timestamps
    the same record timestamp), with the differences on purpose of :func:`list_differences`."""
    for (ts, iso), b in m.broker.listed.items():
        if iso != UNCOMMITTED:
            continue
        status, _, body = http.get(f"/v1/topics/{topic}/partitions/{partition}/timestamps/{ts}")
        doc = json.loads(body)
        offset = doc.get("offset") if doc.get("found") else -1
        if status != 200:
            yield f"http timestamps/{ts}: {status} {doc}"
        elif ts == LATEST_TIERED:
            if not (offset == -1 or m.rlm_start <= offset < m.hw):
                yield f"http timestamps/-5: {offset}, rlm holds [{m.rlm_start}, {m.hw})"
        elif ts == EARLIEST:
            if offset != m.rlm_start:
                yield f"http timestamps/-2: {offset}, its listener's -2 {m.rlm_start}"
        elif ts >= 0 and 0 <= offset < m.broker_start:
            continue  # a record only rlm still holds (on purpose)
        elif offset != b.offset or (has_ts(ts) and offset >= 0 and doc["timestamp"] != b.timestamp):
            yield f"http timestamps/{ts}: {offset} at {doc.get('timestamp')}, broker {b.offset}@{b.timestamp}"
