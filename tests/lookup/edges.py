"""Generated partitions at Kafka's visibility edges (docs/visibility.md), shared by the lookup, HTTP,
CLI and Spark tests: a high watermark below the log end, and a DeleteRecords point in the middle of
a batch of a tiered segment. Expected answers come from :class:`tests.lookup.helpers.BruteLog`
restricted to the visible offsets, never from the lookup code.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from pathlib import Path

from rlm.config import Settings
from rlm.formats import naming
from rlm.formats.checkpoint import format_offset_checkpoint
from rlm.formats.compression import Compression
from rlm.formats.records import RecordSpec
from rlm.logdir.discovery import LOG_START_OFFSET_CHECKPOINT, list_segments
from rlm.logdir.writer import AppendInfo, LogWriter
from rlm.storage.local import LocalBackend
from rlm.tiering.manager import PassResult, RemoteLogManager
from tests.lookup.helpers import (
    BruteBatch,
    BruteLog,
    BruteRecord,
    delete_local_segments,
    expected_fetch,
    settings_for,
)

T0 = 1_700_000_000_000
#: A timestamp no other record reaches: carried by a record that must never be visible.
HOT_TS = T0 + 10**10
CODECS = [Compression.NONE, Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD]


@dataclass
class Visible:
    """What a consumer may see of one partition: the brute log restricted to ``[start, end)``."""

    log: BruteLog
    start: int
    end: int

    @property
    def records(self) -> list[BruteRecord]:
        return [r for r in self.log.records if self.start <= r.offset < self.end]

    def first_offset_ge(self, offset: int) -> BruteRecord | None:
        return next((r for r in self.records if r.offset >= offset), None)

    def first_ts_ge(self, ts: int) -> BruteRecord | None:
        return next((r for r in self.records if r.timestamp >= ts), None)

    def max_ts_record(self) -> BruteRecord:
        top = max(r.timestamp for r in self.records)
        return next(r for r in self.records if r.timestamp == top)

    def fetch(self, offset: int, max_bytes: int) -> list[BruteBatch]:
        """Kafka fetch below the high watermark: whole batches whose last offset < end."""
        out = []
        for b in expected_fetch(self.log, offset, max_bytes):
            if b.batch.last_offset >= self.end:
                break
            out.append(b)
        return out


def _records(rnd: random.Random, ts: int, n: int, tag: str) -> tuple[list[RecordSpec], int]:
    out = []
    for j in range(n):
        ts += rnd.randint(-40, 200)
        out.append(RecordSpec(ts, f"{tag}-{j}".encode(), rnd.randbytes(rnd.randint(20, 180))))
    return out, ts


def write_hw_partition(
    log_dir: Path,
    topic: str,
    partition: int,
    *,
    batches: int,
    seed: int,
    hw_batch: float | None,
    mid_batch: bool,
) -> int:
    """A partition whose high watermark lies at the batch ``hw_batch`` (fraction of all batches;
    None: the second batch of the active segment): one record into that batch when ``mid_batch``,
    else at its base offset. Returns the HW."""
    rnd = random.Random(seed)
    infos: list[AppendInfo] = []
    ts = T0
    with LogWriter(
        log_dir, topic, partition, segment_bytes=6_000, index_interval_bytes=512, clock=lambda: T0
    ) as w:
        i = 0
        while i < batches or (
            hw_batch is None
            and sum(1 for a in infos if a.segment_base_offset == w.segment_base_offsets[-1]) < 3
        ):
            recs, ts = _records(rnd, ts, rnd.randint(2, 8), f"b{i}")
            infos.append(w.append(recs, compression=CODECS[i % len(CODECS)]))
            i += 1
        if hw_batch is None:
            at = [a for a in infos if a.segment_base_offset == w.segment_base_offsets[-1]][1]
        else:
            at = infos[int(len(infos) * hw_batch)]
        hw = at.base_offset + 1 if mid_batch else at.base_offset
        w.high_watermark = hw
    return hw


def write_delete_records_partition(
    log_dir: Path, topic: str, partition: int, *, batches: int, seed: int, segment_index: int
) -> int:
    """A partition with one batch, in segment ``segment_index`` (not its first batch), whose record
    just below the DeleteRecords point returned here carries :data:`HOT_TS`."""
    rnd = random.Random(seed)
    ts = T0
    point = -1
    with LogWriter(
        log_dir, topic, partition, segment_bytes=6_000, index_interval_bytes=512, clock=lambda: T0
    ) as w:
        for i in range(batches):
            recs, ts = _records(rnd, ts, rnd.randint(2, 8), f"b{i}")
            if point < 0 and len(w.segment_base_offsets) == segment_index + 1 and w.active_segment_size:
                recs = [*recs[:1], RecordSpec(HOT_TS, b"deleted", b"hot"), *recs[1:], *recs[:1]]
                point = w.log_end_offset + 2  # the HOT record is at point - 1, in the same batch
            w.append(recs, compression=CODECS[i % len(CODECS)])
    assert point > 0, "the partition has too few segments"
    return point


def delete_records(log_dir: Path, topic: str, partition: int, point: int) -> list[int]:
    """What the broker does on DeleteRecords: the log start moves to ``point`` (written to
    ``log-start-offset-checkpoint``, above the first local base) and the segments wholly below it
    are deleted. Returns the deleted base offsets."""
    part = log_dir / f"{topic}-{partition}"
    segments = list_segments(part)
    doomed = [s.base_offset for s, nxt in itertools.pairwise(segments) if nxt.base_offset <= point]
    _unlink_segments(part, doomed)
    write_log_start_checkpoint(log_dir, {(topic, partition): point})
    return doomed


def local_retention(log_dir: Path, topic: str, partition: int, keep_last: int) -> list[int]:
    """Local retention after tiering: the oldest segments go, and Kafka drops the partition's
    ``log-start-offset-checkpoint`` entry once its log start is a segment base again."""
    part = log_dir / f"{topic}-{partition}"
    segments = list_segments(part)
    doomed = [s.base_offset for s in segments[: max(0, len(segments) - keep_last)]]
    _unlink_segments(part, doomed)
    write_log_start_checkpoint(log_dir, {})
    return doomed


def write_log_start_checkpoint(log_dir: Path, entries: dict[tuple[str, int], int]) -> None:
    (log_dir / LOG_START_OFFSET_CHECKPOINT).write_text(format_offset_checkpoint(entries))


def _unlink_segments(part: Path, bases: list[int]) -> None:
    for base in bases:
        for suffix in (naming.LOG, naming.INDEX, naming.TIME_INDEX, naming.TXN_INDEX, naming.SNAPSHOT):
            (part / naming.segment_file_name(base, suffix)).unlink(missing_ok=True)


@dataclass
class EdgeLogs:
    """The three edge partitions, tiered (see :func:`build_edge_logs`)."""

    logs: Path
    store: Path
    settings: Settings
    manager: RemoteLogManager
    visible: dict[str, Visible]
    log_end: dict[str, int]
    point: int  # del-0's DeleteRecords point
    records_deleted: list[int]  # del-0 segments the broker deleted (wholly below the point)
    delete_pass: PassResult  # the pass right after DeleteRecords
    highest_tiered: dict[str, int]


def build_edge_logs(tmp: Path) -> EdgeLogs:
    """``vis-0``: HW in the middle of a batch of a rolled, not-last segment, tiered
    (``log.eligibility = rolled`` tiers above the HW) then deleted locally: records above the HW
    exist only remotely. ``vis-1``: HW at a batch boundary inside the active segment.
    ``del-0``: DeleteRecords in the middle of a batch of a tiered segment, a pass, then local
    retention past the point (the broker's checkpoint forgets it) and another pass."""
    logs, store = tmp / "logs", tmp / "store"
    hw = {
        "vis-0": write_hw_partition(logs, "vis", 0, batches=160, seed=11, hw_batch=0.6, mid_batch=True),
        "vis-1": write_hw_partition(logs, "vis", 1, batches=80, seed=12, hw_batch=None, mid_batch=False),
    }
    point = write_delete_records_partition(logs, "del", 0, batches=160, seed=13, segment_index=3)
    brute = {p.name: BruteLog.scan(p) for p in sorted(logs.iterdir()) if p.is_dir()}
    log_end = {name: b.records[-1].offset + 1 for name, b in brute.items()}
    bases = {name: [s.base_offset for s in list_segments(logs / name)] for name in brute}
    assert bases["vis-0"][1] <= hw["vis-0"] < bases["vis-0"][-2] and hw["vis-1"] > bases["vis-1"][-1]
    assert hw["vis-0"] < log_end["vis-0"] and hw["vis-1"] < log_end["vis-1"]
    settings = settings_for(
        [logs], options={"root": str(store)}, eligibility="rolled", server={"host": "127.0.0.1", "port": 0}
    )
    manager = RemoteLogManager(settings, LocalBackend(root=str(store)))
    assert all(r.error is None for r in manager.run_once())
    parts = {p.name: p for p in manager.discover()}
    highest = {name: manager.live_progress(parts[name]).highest_tiered_offset for name in brute}
    assert highest["vis-0"] >= hw["vis-0"]  # records above the HW were tiered: readers must hide them
    delete_local_segments(logs / "vis-0", keep_last=1)
    deleted = delete_records(logs, "del", 0, point)
    assert len(deleted) >= 3 and all(b < point for b in deleted)
    delete_pass = next(r for r in manager.run_once() if (r.topic, r.partition) == ("del", 0))
    local_retention(logs, "del", 0, keep_last=2)
    assert list_segments(logs / "del-0")[0].base_offset > point
    assert all(r.error is None for r in manager.run_once())
    visible = {
        "vis-0": Visible(brute["vis-0"], 0, hw["vis-0"]),
        "vis-1": Visible(brute["vis-1"], 0, hw["vis-1"]),
        "del-0": Visible(brute["del-0"], point, log_end["del-0"]),
    }
    return EdgeLogs(logs, store, settings, manager, visible, log_end, point, deleted, delete_pass, highest)
