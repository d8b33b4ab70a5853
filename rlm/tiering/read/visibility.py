"""What a reader may see of one partition: Kafka's visibility rule (docs/visibility.md).

Every read surface (lookups, fetch, offsets-for-times, the Spark reader and export) serves only
offsets in ``[log_start_offset, visible_end_offset)``:

* **visible end** — the high watermark from ``replication-offset-checkpoint`` when the log dir
  records one (source ``"checkpoint"``). Without one, what is assumed depends on
  ``log.eligibility``: ``"rolled"`` declares rolled segments committed, so the end of the last
  rolled segment (= the active segment's base offset, or past the highest tiered offset if that is
  higher) is visible (``"rolled-segments"``); ``"high-watermark"`` serves only what was provably
  committed, i.e. tiered while a high watermark was known: ``highest tiered + 1``
  (``"tiered"``; nothing at all when nothing is tiered). In a cluster, a replica whose own log
  left the store's lineage (an unclean election threw its records from there away, and its
  broker has not truncated them yet) is visible only below that offset (``"diverged"``,
  :attr:`Progress.local_diverged_from`, docs/cluster.md).
* **log start** — the first local segment's base, raised by ``log-start-offset-checkpoint``,
  and by the DeleteRecords point: a checkpointed log start ABOVE the first local segment's base
  (Kafka writes the entry only then), remembered in the progress file once the daemon has seen
  it (:attr:`Progress.delete_records_offset`), because the broker forgets it when its own
  retention passes it. The remote tier starts at ``max(remote log start, DeleteRecords point)``.
  Until the broker's checkpoint reaches disk, readers learn the point from the broker itself
  (``broker_log_start``, asked by rlm/cluster/log_starts.py) when it can only be one.
* a checkpointed high watermark above the local log's end is not this log's (the topic was
  deleted and created again since the broker last wrote the file): it is not used.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rlm.formats.records import RecordBatch, decode_records
from rlm.logdir.checkpoint_cache import CheckpointCache
from rlm.logdir.scan import (
    EligibilityPolicy,
    LogDirCheckpoints,
    PartitionDir,
    PartitionState,
    SegmentFiles,
    list_segments,
    partition_state,
)
from rlm.logdir.segment import LogSegment, log_end_offset
from rlm.tiering.local import PartitionContext, Progress

log = logging.getLogger(__name__)

#: The checkpoints of callers that keep no cache of their own (the jobs' planners, restore):
#: validated per use like any CheckpointCache, so a broker's rewrite is seen at once.
_SHARED_CHECKPOINTS = CheckpointCache()

HighWatermarkSource = Literal["checkpoint", "rolled-segments", "tiered", "diverged"]


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """The offsets that bound each tier (docs/formats.md §8); None when unknown/empty, -1 = nothing tiered.

    ``high_watermark`` is the checkpointed value (None when the log dir has none);
    ``visible_end_offset`` is the exclusive bound every read surface applies and
    ``high_watermark_source`` says where it comes from. ``delete_records_offset`` is the
    DeleteRecords point (-1 = none seen).
    """

    log_start_offset: int | None
    local_log_start_offset: int | None
    high_watermark: int | None
    log_end_offset: int | None
    highest_tiered_offset: int
    remote_log_start_offset: int | None
    visible_end_offset: int | None = None
    high_watermark_source: HighWatermarkSource = "checkpoint"
    delete_records_offset: int = -1

    def visible(self, offset: int) -> bool:
        """Whether ``offset`` may be served: ``log_start ≤ offset < visible_end``."""
        return (
            self.log_start_offset is not None
            and self.visible_end_offset is not None
            and self.log_start_offset <= offset < self.visible_end_offset
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "log_start_offset": self.log_start_offset,
            "local_log_start_offset": self.local_log_start_offset,
            "high_watermark": self.high_watermark,
            "log_end_offset": self.log_end_offset,
            "highest_tiered_offset": self.highest_tiered_offset,
            "remote_log_start_offset": self.remote_log_start_offset,
            "local": [self.local_log_start_offset, self.log_end_offset],  # half-open
            "remote": (
                [self.remote_log_start_offset, self.highest_tiered_offset]  # inclusive
                if self.remote_log_start_offset is not None
                else None
            ),
            "visible_end_offset": self.visible_end_offset,
            "high_watermark_source": self.high_watermark_source,
            "delete_records_offset": self.delete_records_offset,
            "visible": [self.log_start_offset, self.visible_end_offset],  # half-open
        }


def batches_below(batches: Iterator[RecordBatch], end: int) -> Iterator[RecordBatch]:
    """The batches up to the first one reaching ``end``: a fetch returns whole visible batches."""
    for batch in batches:
        if batch.last_offset >= end:
            return
        yield batch


def invisible_reason(offset: int, ranges: PartitionOffsets) -> str:
    """Why ``offset`` is not served (for a not-found answer or an out-of-range error)."""
    end = ranges.visible_end_offset
    if end is not None and offset >= end:
        return (
            f"offset {offset} is out of range: at or above the high watermark {end} "
            f"({ranges.high_watermark_source})"
        )
    return f"offset {offset} is out of range"


def delete_records_point(state: PartitionState, segments: Sequence[SegmentFiles]) -> int | None:
    """The checkpointed log start when it is a DeleteRecords point, else None.

    Kafka writes ``log-start-offset-checkpoint`` entries only for logs whose log start offset is
    above their first local segment's base: anything else (local retention moving the first
    segment forward, no local segment to compare with) is not a deletion.
    """
    lso = state.log_start_offset
    if lso is None or not segments:
        return None
    return lso if lso > segments[0].base_offset else None


def broker_delete_point(broker_start: int | None, segments: Sequence[SegmentFiles]) -> int | None:
    """The broker's live log start (ListOffsets earliest) when it can only be a DeleteRecords point:
    above the first local segment's base and equal to no local segment's base. The broker's local
    retention moves its log start only ever to the base of a segment it keeps, so a log start
    inside a segment was set by DeleteRecords; one at a segment's base is left to the checkpoint
    (docs/visibility.md "Before the checkpoint reaches disk"). ``segments`` must be listed after
    the answer was asked: the broker raises its log start before it renames the segments it deletes.
    """
    if broker_start is None or not segments or broker_start <= segments[0].base_offset:
        return None
    if any(s.base_offset == broker_start for s in segments):
        return None
    return broker_start


def note_delete_records(
    ctx: PartitionContext, state: PartitionState, segments: Sequence[SegmentFiles] | None = None
) -> None:
    """Persist a DeleteRecords point the checkpoint shows: the broker forgets it once its own
    retention passes it, rlm must not. It never moves backwards. ``segments``: the partition's
    listing when the caller has one."""
    point = delete_records_point(state, list_segments(ctx.part) if segments is None else segments)
    if point is not None and point > ctx.progress.delete_records_offset:
        log.info(
            "%s: records below offset %d were deleted (DeleteRecords): no longer served, "
            "remote segments wholly below it will be deleted",
            ctx.part.name,
            point,
        )
        ctx.progress.delete_records_offset = point
        ctx.save_progress()


def _snapshot_end(segments: Sequence[SegmentFiles]) -> int:
    """The highest offset of a producer-state snapshot (``<offset>.snapshot``) in the partition's
    directory, -1 without one. Kafka writes one at its log end offset on every roll and shutdown
    and deletes those above a truncation point, so the log's end is at least this — also when the
    cleaner removed the last batches of a compacted log, whose last batch then ends below the high
    watermark (a real broker's ``__consumer_offsets`` does). Listed only on that rare path."""
    if not segments:
        return -1
    try:
        names = os.listdir(segments[0].log.parent)
    except OSError:
        return -1
    ends = [int(n[:-9]) for n in names if n.endswith(".snapshot") and n[:-9].isdigit()]
    return max(ends, default=-1)


def visible_end(
    state: PartitionState,
    segments: Sequence[SegmentFiles],
    highest_tiered: int,
    policy: EligibilityPolicy,
    log_end: int | None = None,
) -> tuple[int | None, HighWatermarkSource]:
    """The exclusive end of what may be served and where it comes from (module doc). ``log_end``:
    the local log's end offset; a checkpointed high watermark above it is another log's (a high
    watermark never passes its log's end) and is treated as absent."""
    hw = state.high_watermark
    if hw is not None and (log_end is None or hw <= log_end or hw <= _snapshot_end(segments)):
        return hw, "checkpoint"
    tiered_end = highest_tiered + 1 if highest_tiered >= 0 else None
    if policy == "rolled":
        rolled_end = segments[-1].base_offset if segments else None
        ends = [e for e in (rolled_end, tiered_end) if e is not None]
        return (max(ends) if ends else None), "rolled-segments"
    return tiered_end, "tiered"


def partition_offsets(
    part: PartitionDir,
    progress: Progress,
    segments: Sequence[SegmentFiles] | None = None,
    checkpoints: LogDirCheckpoints | None = None,
    policy: EligibilityPolicy = "high-watermark",
    broker_log_start: int | None = None,
) -> PartitionOffsets:
    """Where each tier starts and ends now (local from the log dir, remote from ``progress``)
    and the visible range (module doc); ``policy`` is ``log.eligibility``; ``broker_log_start``:
    the broker's live log start, asked before ``segments`` were listed (:func:`broker_delete_point`).

    ``checkpoints``: the log dir's, as the caller's cache has them; without, a cache shared by the
    process serves them (each checkpoint file lists every partition of the log dir, so parsing it
    per partition made a pass over P partitions O(P²)).
    """
    segments = list_segments(part) if segments is None else segments
    if checkpoints is None:
        checkpoints = _SHARED_CHECKPOINTS.get(part.log_dir)
    state = partition_state(part, checkpoints)
    deleted = max(
        progress.delete_records_offset,
        delete_records_point(state, segments) or -1,
        broker_delete_point(broker_log_start, segments) or -1,
    )
    local_start = segments[0].base_offset if segments else None
    if local_start is not None:
        local_start = max(local_start, state.log_start_offset or 0, deleted)
    highest = progress.highest_tiered_offset
    remote_start: int | None = None
    if highest >= 0 and 0 <= progress.remote_log_start_offset <= highest:
        remote_start = max(progress.remote_log_start_offset, deleted)
        if remote_start > highest:
            remote_start = None  # DeleteRecords passed everything tiered
    starts = [o for o in (remote_start, local_start) if o is not None]
    log_start = min(starts) if starts else None
    log_end = log_end_offset(segments)
    end, source = visible_end(state, segments, highest, policy, log_end)
    if 0 <= progress.local_diverged_from < (end if end is not None else -1):
        # this replica's log left the lineage there: an unclean election threw the rest away
        end, source = progress.local_diverged_from, "diverged"
    if end is not None and log_start is not None:
        end = max(end, log_start)  # an empty visible range, never one that ends before it starts
    elif end is None and source == "tiered" and log_start is not None:
        end = log_start  # nothing is provably committed: nothing is visible
    return PartitionOffsets(
        log_start,
        local_start,
        state.high_watermark,
        log_end,
        highest,
        remote_start,
        end,
        source,
        deleted,
    )


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


__all__ = [
    "HighWatermarkSource",
    "PartitionOffsets",
    "batches_below",
    "batches_max_timestamp",
    "broker_delete_point",
    "delete_records_point",
    "invisible_reason",
    "local_max_timestamp",
    "partition_offsets",
    "visible_end",
]
