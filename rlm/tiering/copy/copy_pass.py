"""The copy step of a pass (docs/architecture.md §2, step 4): which eligible segments are not yet
tiered (:func:`pending_segments`), and copying them oldest first (:func:`copy_pending`) with the
next one pinned and checksummed on a helper thread while the current one uploads, and uploading
while the current one commits (pipelined: committed only after it).

A quarantined segment stops the partition's copies (tiering past it would leave a gap); a segment
the log store deleted first is skipped and counted; leadership moving away stops after the
current copy. What was copied is recorded in the pass's tally as it happens, so a pass that fails
later still reports it. Offsets are Kafka's; sizes bytes.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from typing import NamedTuple, Protocol

from rlm.errors import PinRoomExhausted, RlmError, SegmentQuarantined, SegmentVanished
from rlm.logdir.discovery import EligibilityPolicy, PartitionState, SegmentFiles, eligible_segments
from rlm.tiering.converge import note_committed
from rlm.tiering.copy.copier import StagedCopy, commit_staged, drop_staged, stage_segment, start_staging
from rlm.tiering.copy.prepare import PreparedSegment, prepare_segment
from rlm.tiering.copy.quarantine import quarantine
from rlm.tiering.copy.sight import drop, pinned_only, release_tiered
from rlm.tiering.copy.upload import UploadControl
from rlm.tiering.copy.watchdog import CopyWatchdog
from rlm.tiering.local import PartitionContext, Progress, crash_point

log = logging.getLogger(__name__)

#: How long a copy run may go without saving the partition's progress, in seconds (it is always
#: saved when the run ends, however it ends). Each commit fsyncs the store's manifest, the local
#: index and the journal; ``progress.json`` and the manifest snapshot only let a restart skip the
#: store (docs/remote-state.md "What a restart reads"). Saving them at every commit cost two file
#: creations and fsyncs per segment, and the snapshot holds every manifest of the partition, so a
#: save per commit was O(segments) each time. A restart that finds them behind the index recovers
#: from the store, as a crash in the middle of a run needs anyway: an attempt is open then.
PROGRESS_SAVE_INTERVAL_S = 1.0

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


@dataclasses.dataclass(slots=True)
class _Next:
    """The next segment's copy while the one before it commits (a pipelined copy): journaled, its
    objects uploading on the uploader thread; ``done`` holds its watchdog timer."""

    index: int
    prep: PreparedSegment
    upload: concurrent.futures.Future[StagedCopy]
    control: UploadControl
    done: contextlib.ExitStack


def copy_pending(
    ctx: PartitionContext,
    tally: CopyTally,
    pending: list[PendingSegment],
    *,
    still_leads: Callable[[PartitionContext], bool],
    watchdog: CopyWatchdog,
) -> None:
    """Copy ``pending`` oldest first until done, stopped (shutdown), a quarantine, or
    ``still_leads`` says this node no longer leads the partition.

    The next segment is pinned and checksummed (CRC-verified) on a helper thread while the
    current one uploads: the checksum walk overlaps the network instead of adding to it. It is
    started once the current copy has pinned its segment (pins are taken oldest first) and begun
    uploading (``on_started``). A segment with nothing done ahead (the first) is checksummed while
    its own .log uploads. Once a segment's last part is submitted (or its objects are stored), the
    next one's upload starts, before the segment commits (pipelined, docs/architecture.md §3
    "Pipelined copies"), so the store is idle neither during the upload's tail nor during the
    commit (manifest, local index, journal fsyncs): a segment is committed only after the one
    before it, and discarded when that one's upload or commit fails."""
    _note_gap(ctx, pending)
    run = _CopyRun(ctx, tally, pending, still_leads, watchdog)
    try:
        run.run()
    finally:
        run.close()


@dataclasses.dataclass(slots=True)
class _CopyRun:
    """The state of one :func:`copy_pending` (its arguments): the helper threads, the segment
    prepared ahead and the pipelined copies started ahead (at most two: the one committing next,
    and the one after it, started once the first's last part was submitted)."""

    ctx: PartitionContext
    tally: CopyTally
    pending: list[PendingSegment]
    still_leads: Callable[[PartitionContext], bool]
    watchdog: CopyWatchdog
    preparer: concurrent.futures.ThreadPoolExecutor | None = dataclasses.field(init=False)
    uploader: concurrent.futures.ThreadPoolExecutor | None = dataclasses.field(init=False)
    ahead: concurrent.futures.Future[PreparedSegment] | None = dataclasses.field(init=False)
    started: collections.deque[_Next] = dataclasses.field(init=False)
    unsaved: bool = dataclasses.field(init=False)  # a commit since the progress was last saved
    saved_at: float = dataclasses.field(init=False)  # time.monotonic() of that save (or the start)

    def __post_init__(self) -> None:
        many = len(self.pending) > 1
        pool = concurrent.futures.ThreadPoolExecutor
        self.preparer = pool(1, thread_name_prefix="rlm-prepare") if many else None
        self.uploader = pool(2, thread_name_prefix="rlm-copy-next") if many else None
        self.ahead = None
        self.started = collections.deque()
        self.unsaved, self.saved_at = False, time.monotonic()

    def prepare_next(self, index: int) -> None:
        if self.preparer is not None and index + 1 < len(self.pending):
            p = self.pending[index + 1]
            self.ahead = self.preparer.submit(prepare_segment, self.ctx, p.segment, p.from_offset)

    def may_copy(self, index: int) -> bool:
        # A quarantined segment stops its partition: tiering past it would leave a gap.
        if self.ctx.shared.stop.is_set() or self.pending[index].segment.base_offset in self.ctx.quarantined:
            return False
        return index == 0 or self.still_leads(self.ctx)  # leadership moved: the new leader continues

    def run(self) -> None:
        ctx, pending = self.ctx, self.pending
        for index, p in enumerate(pending):
            with contextlib.ExitStack() as done:
                if self.started:  # started ahead: start the next once its parts are all submitted
                    cur = self.started[0]
                    done.push(cur.done)
                    cur.control.dispatched.wait()  # or its upload is over
                    self.start_next(index)
                    staged: StagedCopy | bool = _wait_staged(ctx, self.tally, p.segment, cur.upload)
                    self.started.popleft()
                elif not self.may_copy(index):
                    break
                else:
                    current, self.ahead = self.ahead, None
                    done.enter_context(self.watchdog.watch(ctx, p.segment))
                    on_started = functools.partial(self.prepare_next, index)
                    staged = _stage_one(ctx, self.tally, p.segment, current, p.from_offset, on_started)
                    if not isinstance(staged, bool):
                        self._start_after(staged, index)
                if isinstance(staged, bool):
                    if staged:
                        continue  # skipped (vanished before it was pinned)
                    break
                _commit_one(ctx, self.tally, staged)
                self.unsaved = True
                crash_point("after_journal_finish")
                if time.monotonic() - self.saved_at >= PROGRESS_SAVE_INTERVAL_S:
                    self.save_progress()
                if self.started:  # after the commit: its checksum walk holds the GIL at times
                    self.prepare_next(self.started[-1].index)
            publish_lag(ctx, pending[index + 1 :])

    def _start_after(self, staged: StagedCopy, index: int) -> None:
        """:meth:`start_next` once ``staged`` (uploaded on this thread) is stored."""
        try:
            self.start_next(index)
        except BaseException:  # the pass fails: this attempt stays open, for recovery
            self.ctx.in_flight.discard(staged.prep.attempt)
            staged.prep.discard()
            raise

    def start_next(self, index: int) -> None:
        """Journal the next segment's attempt and start its upload (:func:`start_staging`) when
        it may be copied and was prepared ahead without a fault; else the sequential path copies it."""
        ahead, nxt = self.ahead, index + 1
        if self.uploader is None or nxt >= len(self.pending) or ahead is None or not self.may_copy(nxt):
            return
        if ahead.exception() is not None or not ahead.result().checksummed.batches:
            return  # the sequential path reports it
        prep, self.ahead = ahead.result(), None
        done, control, seg = contextlib.ExitStack(), UploadControl(), self.pending[nxt].segment
        try:
            done.enter_context(self.watchdog.watch(self.ctx, seg))
            upload = start_staging(self.ctx, seg, prep, self.uploader, control)
        except BaseException:  # not journaled, or left open for recovery by the failed pass
            self.ctx.in_flight.discard(prep.attempt)
            prep.discard()
            done.close()
            raise
        self.started.append(_Next(nxt, prep, upload, control, done))
        crash_point("after_next_start")

    def save_progress(self) -> None:
        self.ctx.save_progress()
        self.unsaved, self.saved_at = False, time.monotonic()

    def close(self) -> None:
        """Discard what was started or prepared and not committed; stop the helper threads; save
        the progress of what was committed (:data:`PROGRESS_SAVE_INTERVAL_S`)."""
        while self.started:  # a failure before their commit: never committed after a gap
            nxt = self.started.popleft()
            drop_staged(self.ctx, nxt.prep, nxt.upload, nxt.control)
            nxt.done.close()
        if self.ahead is not None:  # prepared but not copied: drop its pin (never journaled)
            with contextlib.suppress(Exception):
                self.ahead.result().discard()
        for pool in (self.uploader, self.preparer):
            if pool is not None:
                pool.shutdown(wait=True)
        if self.unsaved:
            self.save_progress()


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


def _stage_one(
    ctx: PartitionContext,
    tally: CopyTally,
    seg: SegmentFiles,
    prepared: concurrent.futures.Future[PreparedSegment] | None,
    from_offset: int,
    on_started: Callable[[], object],
) -> StagedCopy | bool:
    """Stage one segment from ``from_offset`` on this thread (:func:`stage_segment`); True when
    there is nothing to commit and the pass goes on (the segment vanished first, or holds no
    batch), False when the partition's pass stops here (quarantined, no pin room)."""
    try:
        staged = stage_segment(
            ctx, seg, prepared.result() if prepared is not None else None, from_offset, on_started
        )
    except Exception as err:
        return _failed(ctx, tally, seg, err)
    return True if staged is None else staged


def _wait_staged(
    ctx: PartitionContext, tally: CopyTally, seg: SegmentFiles, upload: concurrent.futures.Future[StagedCopy]
) -> StagedCopy | bool:
    """A pipelined segment's staged copy, once its upload is done (its failure as in
    :func:`_stage_one`: the attempt stays open, for recovery)."""
    try:
        return upload.result()
    except Exception as err:
        return _failed(ctx, tally, seg, err)


def _commit_one(ctx: PartitionContext, tally: CopyTally, staged: StagedCopy) -> None:
    """Commit ``staged`` and record it in the partition's progress in memory (the caller saves
    it); a failure raises (the pass fails, recovery resolves the attempt; the caller discards a
    pipelined next one)."""
    try:
        copied = commit_staged(ctx, staged)
    except Exception as err:
        _failed(ctx, tally, staged.segment, err)
        raise  # _failed raises for every error a commit can raise
    ctx.manifests.append(copied.manifest)
    note_committed(ctx, copied.manifest, copied.stored)
    ctx.progress.highest_tiered_offset = copied.manifest.last_offset
    if ctx.progress.remote_log_start_offset < 0:
        ctx.progress.remote_log_start_offset = copied.manifest.base_offset
    release_tiered(ctx)  # its sight pin: the segment is remote now
    tally.copied.append(copied.manifest.base_offset)
    tally.copied_bytes += copied.manifest.size_bytes


def _failed(ctx: PartitionContext, tally: CopyTally, seg: SegmentFiles, err: Exception) -> bool:
    """What a failed copy of ``seg`` means for the pass: True to go on (it vanished first), False
    to stop (no pin room: the next pass tries again; quarantined); any other error is counted and
    raised (as :class:`RlmError`)."""
    m = ctx.shared.metrics
    if isinstance(err, SegmentVanished):
        log.warning("%s", err)
        ctx.series(m.skipped_deleted).inc()
        return True
    if isinstance(err, PinRoomExhausted):  # the next pass tries again (rlm.tiering.local.pin_ledger)
        log.info("%s", err)
        return False
    if isinstance(err, SegmentQuarantined):
        quarantine(ctx, seg, err)
        drop(ctx, seg.base_offset)
        ctx.series(m.copy_errors).inc()
        tally.error = f"quarantined: {err}"
        return False
    if isinstance(err, (RlmError, OSError)):
        ctx.series(m.copy_errors).inc()
        if not isinstance(err, RlmError):  # an OS error no layer translated (a store miss is both)
            raise RlmError(f"copy failed: {err}", file=seg.log, offset=seg.base_offset) from err
    raise err
