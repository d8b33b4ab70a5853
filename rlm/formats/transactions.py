"""Transactions in a run of record batches: what a read_committed consumer keeps, which
transactions a run aborts, which are still open (docs/transactions.md).

Pure: functions take a buffer and the :class:`~rlm.formats.records.RecordBatch` headers
:func:`~rlm.formats.records.iter_batches` read from it. Only control batches are decoded (one small
uncompressed record each); data batches are judged by their header alone.

Kafka's rules, restated:

* a producer has at most one open transaction per partition; its transactional data batches up to
  its next control batch (COMMIT type 1 or ABORT type 0) belong to it;
* a read_committed consumer walks the fetched batches with the fetch response's aborted
  transactions (by ``firstOffset``): a producer becomes *aborted* once a batch's last offset
  reaches an aborted transaction's ``firstOffset``, stops being so at its ABORT marker, and its
  transactional batches in between are skipped (``CompletedFetch``); control batches are never
  returned as records.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from rlm.formats.indexes.offset_index import Buffer
from rlm.formats.indexes.txn_index import AbortedTxn
from rlm.formats.records import ControlRecordType, RecordBatch, decode_records, parse_control_record

__all__ = [
    "REBUILT_LAST_STABLE_OFFSET",
    "OpenTxn",
    "PendingAbort",
    "TxnSummary",
    "committed_batches",
    "control_type",
    "open_after",
    "resolve_first",
    "summarize",
]

ABORT = int(ControlRecordType.ABORT)
COMMIT = int(ControlRecordType.COMMIT)


def control_type(buf: Buffer, batch: RecordBatch) -> int | None:
    """The type of a control batch's first record (0 ABORT, 1 COMMIT, …); None for a data batch or
    a control batch with no record left (compaction)."""
    if not batch.is_control or batch.record_count == 0:
        return None
    records = decode_records(buf, batch)
    return parse_control_record(records[0]).type if records else None


def committed_batches(
    buf: Buffer, batches: Iterable[RecordBatch], aborted: Iterable[AbortedTxn]
) -> tuple[list[RecordBatch], int]:
    """The batches a read_committed consumer returns records from, and how many it skipped
    (aborted data batches and control batches).

    ``aborted`` must hold every aborted transaction overlapping the batches (a fetch response's
    list: ``lastOffset >= first batch offset``, ``firstOffset <= last batch offset``); entries of
    other producers or ranges are harmless.
    """
    queue = [(a.first_offset, a.producer_id) for a in aborted]
    heapq.heapify(queue)
    aborted_pids: set[int] = set()
    kept: list[RecordBatch] = []
    skipped = 0
    for batch in batches:
        if batch.producer_id >= 0:
            while queue and queue[0][0] <= batch.last_offset:
                aborted_pids.add(heapq.heappop(queue)[1])
            if batch.is_control and control_type(buf, batch) == ABORT:
                aborted_pids.discard(batch.producer_id)
            elif batch.is_transactional and batch.producer_id in aborted_pids:
                skipped += 1
                continue
        if batch.is_control:
            skipped += 1
            continue
        kept.append(batch)
    return kept, skipped


@dataclass(frozen=True, slots=True)
class PendingAbort:
    """An ABORT marker found in a run. ``first_offset`` is the first data offset of its transaction
    seen in the run (None: none); ``resolved`` says the transaction began in the run (after an
    earlier marker of the producer in it), else it may have begun in an earlier run."""

    producer_id: int
    first_offset: int | None
    marker_offset: int
    resolved: bool


@dataclass(frozen=True, slots=True)
class OpenTxn:
    """A transaction still open at the end of a run: its first data offset in the run, and whether
    it surely began there (``resolved``) or may continue one from an earlier run."""

    first_offset: int
    resolved: bool


@dataclass
class TxnSummary:
    """What a run of batches says about transactions; offsets are absolute and inclusive.

    ``aborts``: ABORT markers in order; ``open``: producer → transaction open at the end of the
    run; ``marked``: producers with any marker in the run; ``next_offset``: after the last batch.
    """

    next_offset: int = -1
    aborts: list[PendingAbort] = field(default_factory=list)
    commits: int = 0
    open: dict[int, OpenTxn] = field(default_factory=dict)
    marked: set[int] = field(default_factory=set)


def summarize(buf: Buffer, batches: Iterable[RecordBatch]) -> TxnSummary:
    """One pass over the batch headers (control batches decoded) → :class:`TxnSummary`."""
    out = TxnSummary()
    for batch in batches:
        out.next_offset = batch.last_offset + 1
        pid = batch.producer_id
        if pid < 0 or not batch.is_transactional:
            continue
        if not batch.is_control:
            if pid not in out.open:
                out.open[pid] = OpenTxn(batch.base_offset, pid in out.marked)
            continue
        kind = control_type(buf, batch)
        if kind not in (ABORT, COMMIT):
            continue
        current = out.open.pop(pid, None)
        if kind == ABORT:
            out.aborts.append(
                PendingAbort(
                    pid, current.first_offset if current else None, batch.base_offset, pid in out.marked
                )
            )
        else:
            out.commits += 1
        out.marked.add(pid)
    return out


#: ``lastStableOffset`` of an entry rebuilt from batches: the LSO when the marker was written needs
#: every producer's state, which one segment does not show; 0 is a true lower bound, so Kafka's
#: "an entry with lastStableOffset >= bound ends the search" never fires early on a rebuilt entry.
REBUILT_LAST_STABLE_OFFSET = 0


def resolve_first(pending: PendingAbort, earlier: Iterable[TxnSummary]) -> int:
    """The ``firstOffset`` of an aborted transaction that may have begun before its run:
    ``earlier`` are the preceding runs, newest first; the walk stops at the first run where the
    producer has a marker (its transaction began after it). With no data at all the marker's own
    offset is used (an ABORT with nothing to abort)."""
    first = pending.first_offset
    if not pending.resolved:
        for summary in earlier:
            txn = summary.open.get(pending.producer_id)
            if txn is not None:
                first = txn.first_offset
                if txn.resolved:
                    break
            elif pending.producer_id in summary.marked:
                break
    return pending.marker_offset if first is None else first


def open_after(summaries: Sequence[TxnSummary], before: Mapping[int, int] | None = None) -> dict[int, int]:
    """Producer → first offset of its transaction still open after ``summaries`` (oldest first,
    consecutive runs): the state the last stable offset is computed from. ``before``: the
    transactions open before the first run (a producer snapshot's; none when not given)."""
    state: dict[int, int] = dict(before or {})
    for summary in summaries:
        for pid in summary.marked:
            state.pop(pid, None)
        for pid, txn in summary.open.items():
            if txn.resolved or pid not in state:
                state[pid] = txn.first_offset
    return state
