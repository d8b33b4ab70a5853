"""The copy step of a pass (docs/architecture.md §2, step 4): which eligible segments are not yet
tiered (:func:`pending_segments`), and copying them oldest first (:func:`copy_pending`) with the
next one pinned and checksummed on a helper thread while the current one uploads.

A quarantined segment stops the partition's copies (tiering past it would leave a gap); a segment
the log store deleted first is skipped and counted; leadership moving away stops after the
current copy. What was copied is recorded in the pass's tally as it happens, so a pass that fails
later still reports it. Offsets are Kafka's; sizes bytes.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
from collections.abc import Callable
from typing import NamedTuple, Protocol

from rlm.errors import PinRoomExhausted, RlmError, SegmentQuarantined, SegmentVanished
from rlm.logdir.discovery import EligibilityPolicy, PartitionState, SegmentFiles, eligible_segments
from rlm.tiering.converge import note_committed
from rlm.tiering.copy.copier import copy_segment
from rlm.tiering.copy.prepare import PreparedSegment, prepare_segment
from rlm.tiering.copy.quarantine import quarantine
from rlm.tiering.copy.sight import drop, pinned_only, release_tiered
from rlm.tiering.copy.watchdog import CopyWatchdog
from rlm.tiering.local import PartitionContext, Progress

log = logging.getLogger(__name__)

__all__ = ["CopyTally", "PendingSegment", "committed", "copy_pending", "pending_segments", "publish_lag"]


class PendingSegment(NamedTuple):
    """A segment waiting to be tiered: its next segment's base (exclusive end of its offsets) and
    the offset it is copied from (its base, or above it for a partial copy)."""

    segment: SegmentFiles
    next_base: int
    from_offset: int


class CopyTally(Protocol):
    """What a pass records of its copies (:class:`rlm.tiering.manager.PassResult`)."""

    copied: list[int]  # base offsets
    copied_bytes: int
    error: str | None


def pending_segments(
    ctx: PartitionContext,
    segments: list[SegmentFiles],
    state: PartitionState,
    eligibility: EligibilityPolicy,
    *,
    compacted: bool,
    progress: Progress | None = None,
) -> list[PendingSegment]:
    """Eligible segments not yet tiered: each with its next base offset and the offset to copy
    from — its base, or the highest tiered offset + 1 for a segment that straddles it (a
    replica that rolled elsewhere than the one whose sidecar tiered so far: only its tail is
    copied, docs/cluster-copy.md). A segment wholly below the DeleteRecords point is deleted
    data: never copied; nor is one holding offsets this replica's log holds past where it left
    the store's lineage (an unclean election threw them away, docs/cluster.md). A segment the
    broker deleted after rlm pinned it on sight is pending as long as its pin holds it
    (rlm.tiering.copy.sight): it was committed when pinned."""
    progress = progress or ctx.progress
    highest = progress.highest_tiered_offset
    eligible = eligible_segments(segments, committed(ctx, segments, state, eligibility, highest), eligibility)
    bases = [s.base_offset for s in segments]
    pending = []
    for seg in eligible:
        next_base = bases[bases.index(seg.base_offset) + 1]
        if next_base - 1 <= highest or next_base <= progress.delete_records_offset:
            continue  # already remote, or deleted by DeleteRecords
        if 0 <= progress.local_diverged_from < next_base:
            break  # diverged, and so is everything after it
        if seg.base_offset <= highest and compacted:
            continue  # the cleaner merged tiered offsets into it: reported, never re-uploaded
        pending.append(PendingSegment(seg, next_base, max(seg.base_offset, highest + 1)))
    for seg, next_base in pinned_only(ctx, segments, progress):
        if (seg.base_offset <= highest and compacted) or 0 <= progress.local_diverged_from < next_base:
            continue
        pending.append(PendingSegment(seg, next_base, max(seg.base_offset, highest + 1)))
    pending.sort(key=lambda p: p.segment.base_offset)
    return pending


def committed(
    ctx: PartitionContext,
    segments: list[SegmentFiles],
    state: PartitionState,
    eligibility: EligibilityPolicy,
    highest: int,
) -> PartitionState:
    """``state``, with the broker's live high watermark when the checkpoint's holds a rolled segment
    back and this node leads the partition: the broker writes ``replication-offset-checkpoint``
    every ``replica.high.watermark.checkpoint.interval.ms`` (5 s by default), so a segment rolled
    just now would wait that long (docs/operations.md "The high watermark"). One ListOffsets
    request, only then (not once every rolled segment is tiered: ``highest``). Without ``[cluster]
    bootstrap_servers``, or when the broker does not answer, the checkpoint decides. The leader's
    high watermark is the partition's: every offset below it is committed, on the log this node
    holds while it leads."""
    ask = ctx.shared.high_watermarks
    known = -1 if state.high_watermark is None else state.high_watermark
    if (
        ask is None
        or eligibility != "high-watermark"
        or len(segments) < 2
        or segments[-1].base_offset <= known  # every rolled segment is committed by the checkpoint
        or segments[-1].base_offset <= highest + 1  # or tiered already
        or not getattr(ctx.leadership, "is_leader", False)
    ):
        return state
    live = ask.high_watermark(ctx.topic, ctx.partition)
    return state if live is None or live <= known else dataclasses.replace(state, high_watermark=live)


def publish_lag(ctx: PartitionContext, pending: list[PendingSegment]) -> int:
    """Publish the copy lag; return how many segments are pending."""
    m = ctx.shared.metrics
    ctx.series(m.copy_lag_segments).set(len(pending))
    ctx.series(m.copy_lag_bytes).set(sum(p.segment.size for p in pending))
    return len(pending)


def copy_pending(
    ctx: PartitionContext,
    tally: CopyTally,
    pending: list[PendingSegment],
    *,
    still_leads: Callable[[PartitionContext], bool],
    watchdog: CopyWatchdog,
) -> None:
    """Copy ``pending`` oldest first until done, stopped (shutdown), a quarantine, or
    ``still_leads`` says this node no longer leads the partition."""
    _note_gap(ctx, pending)
    # The next segment is pinned and checksummed (CRC-verified) on a helper thread while the
    # current one uploads: the checksum walk overlaps the network instead of adding to it. It is
    # started once the current copy has pinned its segment (pins are taken oldest first) and
    # begun uploading (copy_segment's on_started). A segment with nothing done ahead (the first)
    # is checksummed while its own .log uploads.
    preparer = (
        concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rlm-prepare")
        if len(pending) > 1
        else None
    )
    ahead: concurrent.futures.Future[PreparedSegment] | None = None

    def prepare_next(index: int) -> None:
        nonlocal ahead
        if preparer is not None and index + 1 < len(pending):
            nxt = pending[index + 1]
            ahead = preparer.submit(prepare_segment, ctx, nxt.segment, nxt.from_offset)

    try:
        for index, (seg, _next_base, from_offset) in enumerate(pending):
            # A quarantined segment stops its partition: tiering past it would leave a gap.
            if ctx.shared.stop.is_set() or seg.base_offset in ctx.quarantined:
                break
            if index > 0 and not still_leads(ctx):
                break  # leadership moved: the new leader continues from what is committed
            current, ahead = ahead, None
            if not _copy_one(
                ctx, tally, seg, current, from_offset, watchdog, functools.partial(prepare_next, index)
            ):
                break
            publish_lag(ctx, pending[index + 1 :])
    finally:
        if ahead is not None:  # prepared but not copied: drop its pin (never journaled)
            with contextlib.suppress(Exception):
                ahead.result().discard()
        if preparer is not None:
            preparer.shutdown(wait=True)


def _note_gap(ctx: PartitionContext, pending: list[PendingSegment]) -> None:
    """Warn and count when the oldest pending offset lies above the highest tiered one + 1: the
    offsets between were deleted locally before they were tiered."""
    highest = ctx.progress.highest_tiered_offset
    if pending and highest >= 0 and pending[0].from_offset > highest + 1:
        log.warning(
            "%s: offsets %d-%d were deleted locally before they were tiered",
            ctx.part.name,
            highest + 1,
            pending[0].from_offset - 1,
        )
        ctx.series(ctx.shared.metrics.skipped_deleted).inc()


def _copy_one(
    ctx: PartitionContext,
    tally: CopyTally,
    seg: SegmentFiles,
    prepared: concurrent.futures.Future[PreparedSegment] | None,
    from_offset: int,
    watchdog: CopyWatchdog,
    on_started: Callable[[], object] | None = None,
) -> bool:
    """Copy one segment from ``from_offset`` and record it in the partition's progress; False
    when it was quarantined (the partition's pass stops there). ``on_started``: see
    :func:`copy_segment`."""
    m = ctx.shared.metrics
    try:
        with watchdog.watch(ctx, seg):
            copied = copy_segment(
                ctx, seg, prepared.result() if prepared is not None else None, from_offset, on_started
            )
    except SegmentVanished as err:
        log.warning("%s", err)
        ctx.series(m.skipped_deleted).inc()
        return True
    except PinRoomExhausted as err:  # the next pass tries again (rlm.tiering.local.pin_ledger)
        log.info("%s", err)
        return False
    except SegmentQuarantined as err:
        quarantine(ctx, seg, err)
        drop(ctx, seg.base_offset)
        ctx.series(m.copy_errors).inc()
        tally.error = f"quarantined: {err}"
        return False
    except (RlmError, OSError) as err:
        ctx.series(m.copy_errors).inc()
        if not isinstance(err, RlmError):  # an OS error no layer translated (a store miss is both)
            raise RlmError(f"copy failed: {err}", file=seg.log, offset=seg.base_offset) from err
        raise
    if copied is not None:
        ctx.manifests.append(copied.manifest)
        note_committed(ctx, copied.manifest)
        ctx.progress.highest_tiered_offset = copied.manifest.last_offset
        if ctx.progress.remote_log_start_offset < 0:
            ctx.progress.remote_log_start_offset = copied.manifest.base_offset
        ctx.save_progress()
        release_tiered(ctx)  # its sight pin: the segment is remote now
        tally.copied.append(copied.manifest.base_offset)
        tally.copied_bytes += copied.manifest.size_bytes
    return True
