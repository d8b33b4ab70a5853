"""The aborted-transaction index a copy uploads with its segment (docs/transactions.md).

The broker's ``.txnindex`` is pinned with the segment and checked against the segment's control
batches: every ABORT marker must have exactly one entry (same producer, same offset) and each
entry's ``firstOffset`` must agree with the transaction's data in the segment. A missing file (Kafka
creates it only once a segment aborts something) or one that does not match is replaced by one
rebuilt from the batches — the broker's file is never written — and a rebuild that disagrees with
an existing file is logged, as for the other indexes (docs/broker-files.md). A partial copy keeps
only the entries whose marker is in the uploaded slice.

A transaction that began before the segment gets its ``firstOffset`` from the earlier batches:
the head of the same file (partial copy), then the earlier local segments, newest first, read
only until the producer's previous marker is found.
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rlm.errors import CorruptIndexError, CorruptSnapshotError, RlmError
from rlm.formats.indexes.txn_index import AbortedTxn, encode_txn_index, parse_txn_index
from rlm.formats.producer_snapshot import parse_producer_snapshot
from rlm.formats.records import RecordBatch, iter_batches
from rlm.formats.transactions import (
    REBUILT_LAST_STABLE_OFFSET,
    PendingAbort,
    TxnSummary,
    open_after,
    resolve_first,
    summarize,
)
from rlm.logdir.discovery import SegmentFiles, list_segments
from rlm.tiering.store import SegmentManifest, object_keys, open_at_end

__all__ = ["TxnCapture", "capture_txn_index", "state_before_copy", "summarize_file"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TxnCapture:
    """What a copy uploads: the entries, where they came from (``broker`` / ``rebuilt``) and the
    pinned file holding their image (None when there are none: nothing is uploaded)."""

    entries: tuple[AbortedTxn, ...]
    source: str
    path: Path | None
    #: The uploaded batches' summary (their markers and the transactions open at their end).
    summary: TxnSummary = field(default_factory=TxnSummary)

    def manifest_field(self, before: dict[int, int] | None = None) -> dict[str, object]:
        """The manifest's ``txn_index``; with ``before`` (the transactions open before the first
        uploaded batch, when known) also ``open_at_end``: ``[producer id, first offset]`` pairs
        of those still open after the last one (docs/formats.md §6.3)."""
        doc: dict[str, object] = {"source": self.source, "entries": len(self.entries)}
        if before is not None:
            doc["open_at_end"] = [list(p) for p in sorted(open_after([self.summary], before).items())]
        return doc


def state_before_copy(
    segment: SegmentFiles,
    pinned: dict[str, Path],
    base: int,
    partial: bool,
    committed: Sequence[SegmentManifest],
) -> dict[int, int] | None:
    """The transactions open before the copy named ``base`` (producer → first offset), or None
    when not known: from the broker's pinned producer snapshot (a whole copy), from nothing below
    offset 0, or from the ``open_at_end`` the copy of the segment just below recorded."""
    snap = pinned.get(object_keys.PRODUCER_SNAPSHOT)
    if snap is not None and not partial:
        try:
            return parse_producer_snapshot(snap.read_bytes()).open_transactions()
        except (OSError, CorruptSnapshotError) as err:
            log.warning(
                "%s: producer snapshot unusable (%s); the open transactions come from the "
                "previous copy's record, if any",
                segment.snapshot or snap,
                err,
            )
    if not partial and segment.base_offset == 0:
        return {}
    below = [m for m in committed if m.base_offset < base]
    if not below or below[-1].next_offset != base:
        return None
    recorded = open_at_end(below[-1])
    return dict(recorded) if recorded is not None else None


def summarize_file(path: Path, start: int = 0, end: int | None = None) -> TxnSummary:
    """:func:`summarize` of the batches of ``path`` in bytes ``[start, end)`` (no CRC check: the
    caller verified them, or reads a broker's earlier segment only for its markers)."""
    with path.open("rb") as fh:
        if fh.seek(0, 2) == 0:
            return TxnSummary()
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return summarize(buf, iter_batches(buf, start, end=end, verify_crc=False))


def _summarize_verified(path: Path, batches: Sequence[RecordBatch]) -> TxnSummary:
    """:func:`summarize` of ``path``'s already walked ``batches`` (all of the file's): the file is
    only read for its control batches' records, not walked a second time."""
    if not batches:
        return TxnSummary()
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return summarize(buf, batches)


def _earlier(segment: SegmentFiles, head_end: int | None) -> Iterator[TxnSummary]:
    """Summaries of the batches before the copied ones, newest first, read lazily."""
    older = [s.log for s in list_segments(segment.log.parent) if s.base_offset < segment.base_offset]
    runs: list[tuple[Path, int | None]] = [(segment.log, head_end)] if head_end else []
    for path, end in runs + [(p, None) for p in reversed(older)]:
        try:
            yield summarize_file(path, 0, end)
        except (FileNotFoundError, RlmError) as err:
            log.info(
                "%s: earlier batches in %s unreadable while resolving transactions (%s): "
                "first offsets of older aborted transactions are taken from later batches",
                segment.log,
                path,
                err,
            )
            return


class _Replayable:
    """An iterator's items, read once and replayed to every later walk (each walk stops early)."""

    def __init__(self, source: Iterator[TxnSummary]) -> None:
        self._source = source
        self._seen: list[TxnSummary] = []

    def __iter__(self) -> Iterator[TxnSummary]:
        yield from self._seen
        for item in self._source:
            self._seen.append(item)
            yield item


def _matches(entries: list[AbortedTxn], aborts: list[PendingAbort]) -> str | None:
    """Why the broker's entries do not describe ``aborts`` (None: they do)."""
    markers = [(p.producer_id, p.marker_offset) for p in aborts]
    if [(e.producer_id, e.last_offset) for e in entries] != markers:
        return (
            f"its {len(entries)} entries do not name the segment's {len(aborts)} ABORT markers "
            "(producer, offset)"
        )
    for e, p in zip(entries, aborts, strict=True):
        seen = p.first_offset if p.first_offset is not None else p.marker_offset
        if e.first_offset > seen or (p.resolved and p.first_offset is not None and e.first_offset != seen):
            return (
                f"the aborted transaction of producer {p.producer_id} ending at {p.marker_offset} "
                f"starts at {seen} in the batches, not at {e.first_offset}"
            )
    return None


def capture_txn_index(
    segment: SegmentFiles, pinned: dict[str, Path], batches: list[RecordBatch], source_position: int | None
) -> TxnCapture:
    """Check or rebuild the aborted-transaction entries of the pinned (possibly partial) ``.log``
    whose verified ``batches`` are given; writes their image to the pin dir when there are any."""
    log_path = pinned[object_keys.LOG]
    tail = _summarize_verified(log_path, batches)
    first = batches[0].base_offset if batches else segment.base_offset
    broker = pinned.get(object_keys.TXN_INDEX)
    entries: list[AbortedTxn] | None = None
    source = "broker"
    why = "no .txnindex file"
    if broker is not None:
        try:
            parsed = parse_txn_index(broker.read_bytes(), segment.base_offset)
            found = [e for e in parsed if e.last_offset >= first]
            why = _matches(found, tail.aborts) or ""
            entries = found if not why else None
        except (OSError, CorruptIndexError) as err:
            why = str(err)
    if entries is None:
        source = "rebuilt"
        earlier = _Replayable(_earlier(segment, source_position))
        entries = [
            AbortedTxn(resolve_first(p, earlier), p.marker_offset, p.producer_id, REBUILT_LAST_STABLE_OFFSET)
            for p in tail.aborts
        ]
        if broker is not None or entries:
            level = logging.WARNING if broker is not None else logging.INFO
            log.log(
                level,
                "%s: %s; uploading a transaction index rebuilt from the batches (%d aborted transactions)",
                segment.txn_index or segment.log,
                why,
                len(entries),
            )
    target = log_path.with_name(object_keys.TXN_INDEX)
    if not entries:
        if broker is not None:
            os.unlink(broker)
        return TxnCapture((), source, None, tail)
    tmp = target.with_name(target.name + ".rebuilt")
    tmp.write_bytes(encode_txn_index(entries))  # the broker's bytes when it was kept whole
    os.replace(tmp, target)  # a new inode: the broker's file (hard-linked here) is never written
    return TxnCapture(tuple(entries), source, target, tail)
