"""What a reader may see of one partition: Kafka's visibility rule (docs/visibility.md), and
:class:`Visibility`, the one authority every read surface asks — the HTTP API, the CLI, the Kafka
listener, lookups, the jobs' planner (export, Iceberg, verify) and restore. No other module
computes a log start, a DeleteRecords point, a local log start, a visible end, a last stable
offset or a ListOffsets special answer.

Every read surface serves only offsets in ``[log_start_offset, visible_end_offset)``:

* **visible end** — the high watermark from ``replication-offset-checkpoint`` when the log dir
  records one (source ``"checkpoint"``), or the broker's own newer answer: the high watermark a
  leader's copy asked the broker for after the file was last written, when higher than the
  file's and within the local log (source ``"broker"``, rlm/cluster/log_starts.py; it stands
  until the broker writes the file again). Without either, what is assumed depends on
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
* **last stable offset** (read_committed) — the first offset of the oldest transaction still open
  below the visible end, never below the log start (docs/transactions.md), from the partition's
  transaction knowledge (:class:`~rlm.tiering.read.partition_txns.PartitionTxns`), asked only when
  a read_committed answer needs it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from rlm.formats.records import RecordBatch
from rlm.logdir.checkpoint_cache import CheckpointCache
from rlm.logdir.discovery import (
    EligibilityPolicy,
    LogDirCheckpoints,
    PartitionDir,
    PartitionState,
    SegmentFiles,
    list_segments,
    partition_state,
)
from rlm.logdir.segment import log_end_offset
from rlm.storage.api import StorageBackend
from rlm.tiering.local import PartitionContext
from rlm.tiering.read.partition_txns import PartitionTxns, TxnLookup
from rlm.tiering.read.txn_sources import plan_sources
from rlm.tiering.store import Link, StoreProtection

log = logging.getLogger(__name__)

#: Kafka's ListOffsets special timestamps (KIP-734, KIP-1005), and their names in rlm's answers.
LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -1, -2, -3, -4, -5
SPECIAL_TIMESTAMPS = {
    LATEST: "latest",
    EARLIEST: "earliest",
    MAX_TIMESTAMP: "max-timestamp",
    EARLIEST_LOCAL: "earliest-local",
    LATEST_TIERED: "latest-tiered",
}

Isolation = Literal["read_uncommitted", "read_committed"]

#: The checkpoints of callers that keep no cache of their own (the jobs' planners, restore):
#: validated per use like any CheckpointCache, so a broker's rewrite is seen at once.
_SHARED_CHECKPOINTS = CheckpointCache()

HighWatermarkSource = Literal["checkpoint", "broker", "rolled-segments", "tiered", "diverged"]


class Extent(Protocol):
    """What a reader knows of the remote tier and of the points it must remember: the daemon's
    :class:`~rlm.tiering.local.state.Progress`, or :class:`TieredExtent` built from the store's
    chain. Offsets are Kafka's; -1 = nothing tiered / none seen."""

    @property
    def highest_tiered_offset(self) -> int: ...
    @property
    def remote_log_start_offset(self) -> int: ...
    @property
    def delete_records_offset(self) -> int: ...
    @property
    def local_diverged_from(self) -> int: ...


@dataclass(frozen=True, slots=True)
class TieredExtent:
    """An :class:`Extent` of a reader outside the daemon (the jobs' planner, restore): the store's
    chain says what is tiered, the daemon's persisted progress the DeleteRecords point and where
    this replica's log diverged (-1 = none)."""

    highest_tiered_offset: int = -1
    remote_log_start_offset: int = -1
    delete_records_offset: int = -1
    local_diverged_from: int = -1

    @classmethod
    def of_chain(cls, links: Sequence[Link], deleted: int = -1, diverged: int = -1) -> TieredExtent:
        """The extent of the chain's ``links`` (what the store serves, docs/cluster.md)."""
        if not links:
            return cls(-1, -1, deleted, diverged)
        return cls(links[-1].last_offset, links[0].first_offset, deleted, diverged)


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

    def asks_broker(self, offset: int) -> bool:
        """Whether a read at ``offset`` asks the broker's live log start (docs/visibility.md "Which
        reads ask"): ``offset`` is visible, or the local log holds it past the visible end. A
        checkpointed high watermark lags the broker's, and DeleteRecords may have moved the log
        start past it: by these offsets alone a read at the end answers "nothing yet" with the
        files' log start where the broker answers out of range, and a consumer reset to the new
        start is out of range here. At the log's own end (a consumer waiting for new records) no
        DeleteRecords point can lie above the offset: no request."""
        if self.visible(offset):
            return True
        end, log_end = self.visible_end_offset, self.log_end_offset
        return end is not None and log_end is not None and end <= offset < log_end

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
    broker_hw: tuple[int, int] | None = None,
) -> tuple[int | None, HighWatermarkSource]:
    """The exclusive end of what may be served and where it comes from (module doc). ``log_end``:
    the local log's end offset; a high watermark above it is another log's (a high watermark
    never passes its log's end) and is treated as absent. ``broker_hw``: (high watermark,
    ``time.time_ns()`` when asked) of the broker's last answer to the copy, used when asked after
    the checkpoint file was written and higher than its value."""
    hw = state.high_watermark
    if hw is not None and not (log_end is None or hw <= log_end or hw <= _snapshot_end(segments)):
        hw = None
    if broker_hw is not None and log_end is not None:
        told, asked_ns = broker_hw
        if asked_ns > state.high_watermark_written_ns and told <= log_end and (hw is None or told > hw):
            return told, "broker"
    if hw is not None:
        return hw, "checkpoint"
    tiered_end = highest_tiered + 1 if highest_tiered >= 0 else None
    if policy == "rolled":
        rolled_end = segments[-1].base_offset if segments else None
        ends = [e for e in (rolled_end, tiered_end) if e is not None]
        return (max(ends) if ends else None), "rolled-segments"
    return tiered_end, "tiered"


def told_high_watermark(ctx: PartitionContext) -> tuple[int, int] | None:
    """The high watermark the broker recently answered this daemon's copy of ``ctx`` (module doc),
    for the daemon's own answers (status, DeleteRecords) to match its readers'; None: not asked."""
    told = ctx.shared.high_watermarks
    return told.recent(ctx.topic, ctx.partition) if told is not None else None


def partition_offsets(
    part: PartitionDir,
    progress: Extent,
    segments: Sequence[SegmentFiles] | None = None,
    checkpoints: LogDirCheckpoints | None = None,
    policy: EligibilityPolicy = "high-watermark",
    broker_log_start: int | None = None,
    broker_hw: tuple[int, int] | None = None,
) -> PartitionOffsets:
    """Where each tier starts and ends now (local from the log dir, remote from ``progress``)
    and the visible range (module doc); ``policy`` is ``log.eligibility``; ``broker_log_start``:
    the broker's live log start, asked before ``segments`` were listed (:func:`broker_delete_point`);
    ``broker_hw``: the high watermark the broker recently answered a leader's copy (:func:`visible_end`).

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
    end, source = visible_end(state, segments, highest, policy, log_end, broker_hw)
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


class Visibility:
    """What a consumer may see of one partition at one moment: the one authority (module doc).

    Built from one listing of the partition (:attr:`segments`, which the reads of that moment use
    too: a request lists the directory once) and one read of its checkpoints (:attr:`offsets`);
    the transaction knowledge (``txns``, called at most once, only when a read_committed answer
    needs it) covers the same moment. Offsets are Kafka's; an answer of -1 means "no such offset",
    as Kafka's ListOffsets answers it.
    """

    def __init__(
        self,
        offsets: PartitionOffsets,
        segments: Sequence[SegmentFiles],
        txns: Callable[[PartitionOffsets], PartitionTxns],
    ) -> None:
        self.offsets = offsets
        self.segments = segments
        self._txns_of = txns
        self._txns: PartitionTxns | None = None
        self._lso: int | None = None

    def txns(self) -> PartitionTxns:
        """The partition's transaction knowledge up to the visible end (built once)."""
        if self._txns is None:
            self._txns = self._txns_of(self.offsets)
        return self._txns

    @property
    def empty(self) -> bool:
        """Whether neither tier holds anything visible or not (no log start, no visible end)."""
        return self.offsets.log_start_offset is None or self.offsets.visible_end_offset is None

    def last_stable_offset(self) -> int | None:
        """The last stable offset (module doc); None when the visible end is unknown."""
        end = self.offsets.visible_end_offset
        if end is None:
            return None
        if self._lso is None:
            self._lso = self.txns().last_stable_offset(end)
        return self._lso

    def end(self, isolation: Isolation = "read_uncommitted") -> int:
        """The exclusive end a consumer under ``isolation`` may read to: the visible end (the high
        watermark), or the last stable offset; with no visible end known, the local log's end,
        else 0, as a broker's empty log answers."""
        visible_end = self.offsets.visible_end_offset
        if visible_end is None:
            return self.offsets.log_end_offset or 0
        lso = self.last_stable_offset() if isolation == "read_committed" else None
        return visible_end if lso is None else lso

    def aborted(self, fetch_offset: int, upper_bound: int) -> TxnLookup:
        """The aborted transactions a read_committed fetch of ``[fetch_offset, upper_bound)``
        lists (:meth:`PartitionTxns.aborted`)."""
        return self.txns().aborted(fetch_offset, upper_bound)

    def special_offset(self, timestamp: int, isolation: Isolation = "read_uncommitted") -> int:
        """Kafka's ListOffsets answer to ``-1``, ``-2``, ``-4`` or ``-5`` (docs/visibility.md
        "ListOffsets specs", docs/kafka-listener.md §4), clamped to the visible range: -1 the end
        under ``isolation``; -2 the log start and -4 the local log start, whatever the isolation
        level, never past the visible end; -5 the highest tiered offset below the end under
        ``isolation``, or -1 when nothing visible is tiered. ``-3`` and timestamps ≥ 0 need records:
        the readers look them up and keep them below :meth:`end`."""
        if timestamp == LATEST:
            return self.end(isolation)
        o = self.offsets
        if timestamp in (EARLIEST, EARLIEST_LOCAL):
            visible = self.end()
            start = o.log_start_offset if timestamp == EARLIEST else o.local_log_start_offset
            return min(visible if start is None else start, visible)
        if timestamp != LATEST_TIERED:
            raise ValueError(f"timestamp {timestamp} is not a special offset")
        last = min(o.highest_tiered_offset, self.end(isolation) - 1)
        if o.remote_log_start_offset is None or last < o.remote_log_start_offset:
            return -1
        return last


def chain_visibility(
    part: PartitionDir,
    links: Sequence[Link],
    segments: Sequence[SegmentFiles],
    backend: StorageBackend,
    protection: StoreProtection,
    *,
    policy: EligibilityPolicy,
    deleted: int = -1,
    diverged: int = -1,
) -> Visibility:
    """What a reader outside the daemon (the jobs' planner, restore) may see of ``part``: the
    store's chain ``links`` as its remote tier, ``segments`` its local listing, ``deleted`` and
    ``diverged`` the DeleteRecords point and divergence the daemon persisted (-1 = none); the
    transactions from the chain's manifests and the local segments, the split a reader makes."""
    offsets = partition_offsets(
        part, TieredExtent.of_chain(links, deleted, diverged), segments, policy=policy
    )

    def txns(o: PartitionOffsets) -> PartitionTxns:
        end = o.visible_end_offset if o.visible_end_offset is not None else 0
        sources = plan_sources(links, segments, end, o.local_log_start_offset)
        return PartitionTxns(sources, backend, protection, log_start=o.log_start_offset)

    return Visibility(offsets, segments, txns)


__all__ = [
    "EARLIEST",
    "EARLIEST_LOCAL",
    "LATEST",
    "LATEST_TIERED",
    "MAX_TIMESTAMP",
    "SPECIAL_TIMESTAMPS",
    "Extent",
    "HighWatermarkSource",
    "Isolation",
    "PartitionOffsets",
    "TieredExtent",
    "Visibility",
    "batches_below",
    "broker_delete_point",
    "chain_visibility",
    "delete_records_point",
    "invisible_reason",
    "partition_offsets",
    "told_high_watermark",
    "visible_end",
]
