"""The local tier's answers (docs/architecture.md §4, step 3): the first record at or after an
offset or a timestamp in the partition's segments, and a fetch's slice of one ``.log``.

The segments are the log store's: a segment deleted meanwhile is skipped (the next one, or the
remote tier, answers). Batches are CRC-checked when fetched; offsets are Kafka's (64-bit),
timestamps ms since the epoch, positions byte offsets in the ``.log``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from rlm.formats.records import RecordBatch
from rlm.logdir.discovery import SegmentFiles
from rlm.logdir.segment import LogSegment
from rlm.tiering.read.answers import LocalLocation, Located, first_offset_at_least
from rlm.tiering.read.visibility import batches_below


def local_offset(segments: Sequence[SegmentFiles], offset: int, timestamp: bool = True) -> Located | None:
    """The first local record with offset ≥ ``offset``: the segment holding it (``.index`` floor,
    then a scan), else the first record of a later segment. ``timestamp=False``: a batch with no
    offset gaps answers from its header (timestamp None, :func:`first_offset_at_least`)."""
    candidates = [s for s in segments if s.base_offset <= offset][-1:] + [
        s for s in segments if s.base_offset > offset
    ]
    for files in candidates:
        try:
            with LogSegment.open(files) as seg:
                batch = seg.find_batch(offset)
                while batch is not None:
                    where = LocalLocation(files.log, batch.position)
                    first = None if timestamp else first_offset_at_least(batch, offset)
                    if first is not None:
                        return Located("local", first, None, batch, where)
                    for record in seg.read_records(batch):
                        if record.offset >= offset:
                            return Located("local", record.offset, record.timestamp, batch, where)
                    batch = next(seg.batches(batch.position + batch.size), None)
        except FileNotFoundError:
            continue  # deleted by the log store meanwhile: the next segment or the remote tier
    return None


def local_timestamp(segments: Sequence[SegmentFiles], ts: int, start: int | None) -> Located | None:
    """The first local record at or after offset ``start`` (the local log start; None: from each
    segment's base) whose timestamp is ≥ ``ts`` (docs/formats.md §4.3)."""
    for files in segments:
        try:
            with LogSegment.open(files) as seg:
                hit = seg.find_offset_by_timestamp(ts, max(start or 0, files.base_offset))
        except FileNotFoundError:
            continue
        if hit is not None:
            where = LocalLocation(files.log, hit.batch.position)
            return Located("local", hit.offset, hit.timestamp, hit.batch, where)
    return None


def local_fetch(log: Path, position: int, end: int, max_bytes: int) -> tuple[bytes, list[RecordBatch]]:
    """Whole CRC-checked batches of ``log`` from byte ``position`` whose last offset is below
    ``end`` (the visible end), while they fit ``max_bytes`` (at least one): their bytes and the
    batches with positions relative to the first. Empty when no whole visible batch is there."""
    with LogSegment(log) as seg:
        batches = _take(batches_below(seg.batches(position, verify_crc=True), end), max_bytes)
        if not batches:
            return b"", []
        data = bytes(seg.buffer[batches[0].position : batches[-1].end_position])
    origin = batches[0].position
    return data, [b.moved(-origin) for b in batches]


def _take(batches: Iterator[RecordBatch], max_bytes: int) -> list[RecordBatch]:
    taken: list[RecordBatch] = []
    total = 0
    for batch in batches:
        if taken and total + batch.size > max_bytes:
            break
        taken.append(batch)
        total += batch.size
    return taken


__all__ = ["local_fetch", "local_offset", "local_timestamp"]
