"""Transactional logs and an independent read_committed oracle (docs/transactions.md).

The generator writes, with rlm's LogWriter, interleaved transactions of several producers (COMMIT
and ABORT markers as Kafka's coordinator writes them), plain and idempotent batches between them,
small segments so transactions straddle segment boundaries, and optionally transactions still open
at the end (so the last stable offset is below the high watermark).

The oracle never touches rlm's readers or codecs: it decodes every batch of every ``.log`` file with
kafka-python, replays the markers (a producer's transactional batches up to its next control
record share that record's fate), and answers what a read_committed consumer sees: the records of
committed transactions and non-transactional batches below the LSO (the first offset of the oldest
transaction still open, else the high watermark).
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field
from pathlib import Path

import crc32c
from kafka.record.memory_records import MemoryRecords

from rlm.config import Settings
from rlm.formats import naming
from rlm.formats.compression import Compression
from rlm.formats.records import RecordSpec, encode_control_key, encode_end_txn_marker
from rlm.jobs.reading.decode import iter_task_records, read_task_bytes
from rlm.jobs.reading.plan import BackendSpec, plan_read
from rlm.logdir.discovery import list_segments
from rlm.logdir.writer import LogWriter
from rlm.storage.local import LocalBackend
from rlm.tiering.read import isolation
from rlm.tiering.read.readers import TieredReaders

T0 = 1_700_000_000_000
ABORT, COMMIT = 0, 1
PRODUCERS = (1001, 1002, 1003, 1004)
IDEMPOTENT = 2001  # a producer id that writes without transactions


@dataclass
class Written:
    """What the generator did (for test sanity, never as the expected answer)."""

    aborted: int = 0
    committed: int = 0
    open_at_end: list[int] = field(default_factory=list)


def write_txn_log(
    log_dir: Path,
    topic: str = "txn",
    partition: int = 0,
    *,
    seed: int = 5,
    steps: int = 500,
    segment_bytes: int = 6_000,
    leave_open: bool = True,
) -> Written:
    """Write a transactional partition (see the module doc); returns counts of what it wrote."""
    with LogWriter(
        log_dir, topic, partition, segment_bytes=segment_bytes, index_interval_bytes=512, clock=lambda: T0
    ) as w:
        txn = _TxnProducers(w, random.Random(seed))
        for i in range(steps):
            txn.step(i)
        if not leave_open:
            for pid in sorted(txn.open_txn):
                txn.marker(pid, ABORT if pid % 2 else COMMIT)
        txn.out.open_at_end = sorted(txn.open_txn)
    return txn.out


class _TxnProducers:
    """The producers of write_txn_log over one writer: each step is a random producer's batch or
    the end marker of an open transaction; draws from `rnd` in a fixed order (the seed decides all)."""

    CODECS = (Compression.NONE, Compression.GZIP, Compression.LZ4, Compression.ZSTD, Compression.SNAPPY)

    def __init__(self, w: LogWriter, rnd: random.Random) -> None:
        self.w, self.rnd = w, rnd
        self.open_txn: set[int] = set()
        self.out = Written()
        self.ts = T0
        self.seq = dict.fromkeys((*PRODUCERS, IDEMPOTENT), 0)

    def marker(self, pid: int, kind: int) -> None:
        """Ends pid's open transaction with a COMMIT or ABORT control batch."""
        self.w.append(
            [RecordSpec(self.ts, encode_control_key(kind), encode_end_txn_marker(3))],
            producer_id=pid,
            producer_epoch=0,
            is_transactional=True,
            is_control=True,
        )
        self.open_txn.discard(pid)
        if kind == ABORT:
            self.out.aborted += 1
        else:
            self.out.committed += 1

    def step(self, i: int) -> None:
        rnd = self.rnd
        self.ts += rnd.randint(1, 50)
        pid = rnd.choice(PRODUCERS)
        roll = rnd.random()
        if pid in self.open_txn and roll < 0.25:
            self.marker(pid, ABORT if rnd.random() < 0.45 else COMMIT)
            return
        recs = [
            RecordSpec(self.ts, f"k{i}-{n}".encode(), rnd.randbytes(rnd.randint(5, 60)))
            for n in range(rnd.randint(1, 6))
        ]
        codec = self.CODECS[i % len(self.CODECS)]
        if roll > 0.9:
            self.w.append(recs, compression=codec)  # a plain producer
            return
        transactional = roll <= 0.82
        producer = pid if transactional else IDEMPOTENT
        self.w.append(
            recs,
            compression=codec,
            producer_id=producer,
            producer_epoch=0,
            base_sequence=self.seq[producer],
            is_transactional=transactional,
        )
        self.seq[producer] += len(recs)
        if transactional:
            self.open_txn.add(pid)


@dataclass(frozen=True)
class OracleRecord:
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass
class Oracle:
    """The brute-force answers for one partition directory."""

    committed: list[OracleRecord]  # what read_committed returns, in offset order
    uncommitted: list[OracleRecord]  # what read_uncommitted returns (every data record < HW)
    aborted_offsets: set[int]
    last_stable_offset: int
    high_watermark: int
    aborted_txns: list[tuple[int, int, int]]  # (producer id, first data offset, ABORT marker offset)

    @classmethod
    def of(cls, partition_dir: Path, high_watermark: int | None = None) -> Oracle:
        batches = []
        for log in sorted(partition_dir.glob("*.log")):
            records = MemoryRecords(log.read_bytes())
            while (batch := records.next_batch()) is not None:
                batches.append((batch, [OracleRecord(r.offset, r.key, r.value) for r in batch]))
        hw = (
            high_watermark
            if high_watermark is not None
            else (batches[-1][0].base_offset + batches[-1][0].last_offset_delta + 1 if batches else 0)
        )
        fate: dict[int, str] = {}
        pending: dict[int, list[int]] = {}
        aborted_txns: list[tuple[int, int, int]] = []
        for n, (batch, recs) in enumerate(batches):
            if batch.base_offset >= hw:
                break
            if batch.is_control_batch:
                kind = struct.unpack(">hh", recs[0].key[:4])[1] if recs and recs[0].key else -1
                if kind in (ABORT, COMMIT):
                    mine = pending.get(batch.producer_id, [])
                    if kind == ABORT:
                        first = batches[mine[0]][0].base_offset if mine else batch.base_offset
                        aborted_txns.append((batch.producer_id, first, batch.base_offset))
                    for j in pending.pop(batch.producer_id, []):
                        fate[j] = "aborted" if kind == ABORT else "committed"
            elif batch.is_transactional:
                pending.setdefault(batch.producer_id, []).append(n)
            else:
                fate[n] = "committed"
        lso = min([hw, *(batches[js[0]][0].base_offset for js in pending.values() if js)])
        committed, uncommitted, aborted = [], [], set()
        for n, (batch, recs) in enumerate(batches):
            if batch.is_control_batch or batch.base_offset >= hw:
                continue
            uncommitted += [r for r in recs if r.offset < hw]
            if fate.get(n) == "committed" and batch.base_offset < lso:
                committed += recs
            if fate.get(n) == "aborted":
                aborted |= {r.offset for r in recs}
        return cls(committed, uncommitted, aborted, lso, hw, aborted_txns)


Row = tuple[int, bytes | None, bytes | None]  # (offset, key, value)


def read_committed_in_process(settings: Settings, store: Path, start: int = 0) -> tuple[list[Row], int]:
    """Reads partition txn-0 from `start` through the daemon's readers over the local store at
    `store`, read_committed, fetch by fetch (4,000 bytes) until a fetch advances no further;
    returns the data records and the offset it stopped at."""
    readers = TieredReaders(settings, LocalBackend(root=str(store)))
    offset, got = start, []
    while True:
        res = isolation.fetch(readers.reader("txn", 0), offset, 4_000, "read_committed")
        got += [
            (r.offset, r.key, r.value)
            for b in res.batches
            if not b.is_control
            for r in res.records(b, from_requested=True)
        ]
        if res.next_offset == offset:
            return got, offset
        offset = res.next_offset


def read_committed_planned(settings: Settings) -> list[Row]:
    """Reads topic txn read_committed through the jobs' planner and decoder; rows in offset order."""
    plan = plan_read(settings, ["txn"], isolation="read_committed", target_bytes=4_000)
    spec = BackendSpec.from_settings(settings)
    return sorted(
        (r[2], r[0], r[1]) for t in plan.tasks for r in iter_task_records(t, read_task_bytes(t, spec))
    )


# --- the broker's companion files: .txnindex and producer-state .snapshot ---------------------------


def kafka_txn_entry(pid: int, first: int, last: int, lso: int, version: int = 0) -> bytes:
    """One ``.txnindex`` entry in Kafka's layout (AbortedTxn), written independently of rlm."""
    return struct.pack(">hqqqq", version, pid, first, last, lso)


def write_broker_txn_indexes(part: Path, o: Oracle) -> dict[int, bytes]:
    """``.txnindex`` files as a broker writes them, from the oracle's transactions (LSO: the
    oracle cannot say, the earliest possible one is used)."""
    written = {}
    segs = list_segments(part)
    for n, seg in enumerate(segs):
        end = segs[n + 1].base_offset if n + 1 < len(segs) else 1 << 62
        mine = [t for t in o.aborted_txns if seg.base_offset <= t[2] < end]
        if mine:
            raw = b"".join(kafka_txn_entry(pid, first, last, 0) for pid, first, last in mine)
            (part / f"{seg.base_offset:020d}.txnindex").write_bytes(raw)
            written[seg.base_offset] = raw
    return written


def open_at(partition_dir: Path) -> dict[int, dict[int, int]]:
    """Segment base → producer → first offset of its transaction open before that base, replayed
    from kafka-python's decoding of every batch."""
    out: dict[int, dict[int, int]] = {}
    state: dict[int, int] = {}
    for log in sorted(partition_dir.glob("*.log")):
        out[int(log.stem)] = dict(state)
        records = MemoryRecords(log.read_bytes())
        while (b := records.next_batch()) is not None:
            if b.producer_id < 0 or not b.is_transactional:
                continue
            if b.is_control_batch:
                key = next(iter(b)).key
                if struct.unpack(">hh", key[:4])[1] in (ABORT, COMMIT):
                    state.pop(b.producer_id, None)
            else:
                state.setdefault(b.producer_id, b.base_offset)
    return out


def snapshot_bytes(open_txns: dict[int, int]) -> bytes:
    """A version-1 snapshot naming ``open_txns`` (other fields: plausible constants)."""
    entries = [
        struct.pack(">qhiqiqiq", pid, 0, 0, first, 0, 1_700_000_000_000, 0, first)
        for pid, first in sorted(open_txns.items())
    ]
    body = struct.pack(">i", len(entries)) + b"".join(entries)
    return struct.pack(">hI", 1, crc32c.crc32c(body)) + body


def write_snapshots(
    partition_dir: Path, lie: dict[int, dict[int, int]] | None = None
) -> dict[int, dict[int, int]]:
    """``<base>.snapshot`` beside every segment, as Kafka writes them at each roll (``lie``: extra
    open transactions added to some segments, by index in offset order, negative from the end)."""
    states = open_at(partition_dir)
    for n, (base, state) in enumerate(states.items()):
        extra = (lie or {}).get(n) or (lie or {}).get(n - len(states)) or {}
        state = {**state, **extra}
        (partition_dir / naming.segment_file_name(base, naming.SNAPSHOT)).write_bytes(snapshot_bytes(state))
    return states
