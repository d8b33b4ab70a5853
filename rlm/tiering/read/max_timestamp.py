"""The largest record timestamp among a range of offsets (ms since the epoch), for ListOffsets -3
(KIP-734, docs/visibility.md "ListOffsets specs"): of decoded batches, and of the local segments
by their ``.timeindex`` and batch headers. Offsets are Kafka's; ranges are half-open ``[start, end)``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rlm.formats.records import RecordBatch, decode_records
from rlm.logdir.discovery import SegmentFiles
from rlm.logdir.segment import LogSegment

__all__ = ["batches_max_timestamp", "local_max_timestamp"]


def batches_max_timestamp(
    data: bytes | Any, batches: Iterable[RecordBatch], start: int, end: int
) -> int | None:
    """The max record timestamp (ms) of ``batches`` (decoded from ``data``) among the offsets in
    ``[start, end)``: a batch wholly inside counts by its max timestamp, a boundary batch record
    by record, so a deleted or invisible record never contributes."""
    best: int | None = None
    for batch in batches:
        if batch.base_offset >= end:
            break  # offsets only grow within a segment or an entry
        if batch.last_offset < start:
            continue
        if batch.base_offset >= start and batch.last_offset < end:
            candidates = [batch.max_timestamp]
        else:
            candidates = [r.timestamp for r in decode_records(data, batch) if start <= r.offset < end]
        for ts in candidates:
            best = ts if best is None else max(best, ts)
    return best


def local_max_timestamp(segments: Sequence[SegmentFiles], start: int, end: int) -> int | None:
    """The max record timestamp among the local offsets in ``[start, end)`` (None: no record).

    A segment starting inside the range answers from its ``.timeindex`` up to the last entry
    below ``end`` (an entry bounds every record up to its offset) plus a scan of the batch
    headers after it, up to ``end``; the segment holding ``start`` is scanned from ``start``.
    Batches straddling either bound are decoded record by record.
    """
    best: int | None = None
    for i, files in enumerate(segments):
        seg_end = segments[i + 1].base_offset if i + 1 < len(segments) else None
        if (seg_end is not None and seg_end <= start) or files.base_offset >= end:
            continue
        try:
            with LogSegment.open(files) as seg:
                found = _segment_max(seg, files.base_offset >= start, start, end)
        except FileNotFoundError:
            continue  # deleted by the log store meanwhile
        if found is not None:
            best = found if best is None else max(best, found)
    return best


def _segment_max(seg: LogSegment, starts_inside: bool, start: int, end: int) -> int | None:
    best: int | None = None
    times = seg.time_index if starts_inside else None
    lo, hi = 0, len(times) if times else 0
    while lo < hi:  # the number of time index entries whose offset is below end
        mid = (lo + hi) // 2
        assert times is not None
        lo, hi = (mid + 1, hi) if times[mid].offset < end else (lo, mid)
    if times and lo:
        entry = times[lo - 1]
        best = entry.timestamp
        at = seg.find_batch(entry.offset)
    else:
        at = seg.find_batch(start)
    position = at.position if at is not None else seg.size
    found = batches_max_timestamp(seg.buffer, seg.batches(position, verify_crc=False), start, end)
    if found is not None:
        best = found if best is None else max(best, found)
    return best
