"""One partition's transaction knowledge (docs/transactions.md): :class:`PartitionTxns` over a
list of :class:`~rlm.tiering.read.txn_sources.TxnSource` — the segments of both tiers in offset order —
answers which transactions a fetch must list as aborted (:meth:`PartitionTxns.aborted`) and where
the last stable offset is (:meth:`PartitionTxns.last_stable_offset`).

Each source's aborted transactions come from its stored ``.txnindex`` (uploaded, or the broker's
local one, checked against the segment's ABORT markers), else from its control batches, scanned
once per process and version of its bytes (:data:`~rlm.tiering.read.txn_sources.FACTS`). The last
stable offset is replayed from a known producer state — a copy's recorded ``open_at_end`` or
Kafka's producer snapshot (:mod:`rlm.tiering.store.producer_state`) — at or below the first local
segment. :mod:`rlm.tiering.read.isolation` applies them to a fetch; offsets are Kafka's.
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlm.errors import CorruptIndexError, ObjectNotFoundError, RlmError
from rlm.formats.indexes.offset_index import Buffer
from rlm.formats.indexes.txn_index import AbortedTxn, collect_aborted, parse_txn_index
from rlm.formats.records import iter_batches
from rlm.formats.transactions import (
    REBUILT_LAST_STABLE_OFFSET,
    TxnSummary,
    open_after,
    resolve_first,
    summarize,
)
from rlm.nowait import may_wait
from rlm.storage.api import StorageBackend
from rlm.tiering.read.txn_sources import FACTS, TxnSource
from rlm.tiering.store import StoreProtection, open_at_local, open_at_remote

__all__ = ["PartitionTxns", "TxnLookup"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TxnLookup:
    """The aborted transactions of one fetch and the segments whose batches had to be scanned
    (no index stored: tiered before rlm captured it, or no local ``.txnindex``)."""

    entries: list[AbortedTxn]
    scanned: list[str] = field(default_factory=list)


class PartitionTxns:
    """Aborted transactions and the last stable offset of one partition, over ``sources``.

    ``log_start``: the partition's log start offset (None: unknown), the floor of the last
    stable offset (:meth:`last_stable_offset`).
    """

    def __init__(
        self,
        sources: Sequence[TxnSource],
        backend: StorageBackend | None,
        protection: StoreProtection | None = None,
        *,
        log_start: int | None = None,
    ) -> None:
        self.sources = list(sources)
        self.backend = backend
        self.protection = protection or StoreProtection()
        self.log_start = log_start

    # -- reading ------------------------------------------------------------------------------

    def _with_bytes(self, src: TxnSource, use: Callable[[Buffer], Any]) -> Any:
        if src.tier == "local":
            may_wait("a segment's records on disk")
            with open(src.location, "rb") as fh:
                if fh.seek(0, 2) == 0:
                    return use(b"")
                with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                    return use(buf)
        if self.backend is None:
            raise RlmError("a remote transaction source needs a backend")
        backend = self.backend
        may_wait("a tiered segment's control batches")
        data = backend.read(src.location)
        if src.manifest is not None:  # stored compressed/encrypted: entry by entry
            data = self.protection.open_log(backend, src.manifest, data)
        if not src.captured:  # once per segment and process: the summary is cached
            log.info(
                "%s: tiered before rlm captured its transaction index: scanned its control "
                "batches (one read of %d bytes; docs/transactions.md)",
                src.location,
                len(data),
            )
        return use(data)

    def summary(self, i: int) -> TxnSummary:
        """The source's :class:`TxnSummary` (its batches read once per process)."""
        src = self.sources[i]

        def load() -> TxnSummary:
            def run(buf: Buffer) -> TxnSummary:
                mine = (
                    b
                    for b in iter_batches(buf, verify_crc=False)
                    if b.base_offset >= src.first_offset and b.last_offset <= src.last_offset
                )
                return summarize(buf, mine)

            try:
                return self._with_bytes(src, run)  # type: ignore[no-any-return]
            except RlmError as err:
                raise err.in_file(src.location) if err.file is None else err from err

        found: TxnSummary = FACTS.get(
            ("summary", src.location, src.identity, src.first_offset, src.last_offset), load
        )
        return found

    def _earlier(self, i: int) -> Iterator[TxnSummary]:
        for j in range(i - 1, -1, -1):
            yield self.summary(j)

    def _stored(self, src: TxnSource) -> list[AbortedTxn] | None:
        if src.txn_index is None:
            return [] if src.tier == "remote" and src.captured else None
        index_key = src.txn_index

        def load() -> list[AbortedTxn] | None:
            try:
                if src.tier == "local":
                    raw = Path(index_key).read_bytes()
                else:
                    assert self.backend is not None
                    may_wait("a tiered transaction index")
                    raw = self.backend.read(index_key)
                    if src.manifest is not None:
                        raw = self.protection.open_object(src.manifest, index_key, raw)
                return parse_txn_index(raw)
            except ObjectNotFoundError:
                raise  # its manifest lists it: a miss is the store's damage (502), not "none kept"
            except FileNotFoundError:
                return None
            except CorruptIndexError as err:
                log.warning("%s: %s; scanning the segment's control batches instead", index_key, err)
                return None

        found: list[AbortedTxn] | None = FACTS.get(("txnindex", index_key, src.identity), load)
        if found is None:
            return None
        return [e for e in found if src.first_offset <= e.last_offset <= src.last_offset]

    def entries(self, i: int) -> tuple[list[AbortedTxn], bool]:
        """Source ``i``'s aborted transactions and whether they came from a stored index."""
        src = self.sources[i]
        stored = self._stored(src)
        if stored is not None and src.tier == "local":
            stored = self._checked(i, stored)  # the summary is read for the LSO anyway
        if stored is not None:
            return stored, True
        summary = self.summary(i)
        return [
            AbortedTxn(
                resolve_first(p, self._earlier(i)), p.marker_offset, p.producer_id, REBUILT_LAST_STABLE_OFFSET
            )
            for p in summary.aborts
        ], False

    def _checked(self, i: int, stored: list[AbortedTxn]) -> list[AbortedTxn] | None:
        """A broker's local entries if they name the segment's ABORT markers, else None (scan)."""
        markers = [(p.producer_id, p.marker_offset) for p in self.summary(i).aborts]
        if [(e.producer_id, e.last_offset) for e in stored] == markers:
            return stored
        src = self.sources[i]
        FACTS.get(
            ("mismatch", src.txn_index, src.identity),
            lambda: log.warning(
                "%s: its entries do not name the segment's %d ABORT markers; scanning the segment's "
                "control batches instead (docs/transactions.md)",
                src.txn_index,
                len(markers),
            ),
        )
        return None

    # -- answers ------------------------------------------------------------------------------

    def _index_of(self, offset: int) -> int:
        found = 0
        for i, src in enumerate(self.sources):
            if src.first_offset <= offset:
                found = i
        return found

    def aborted(self, fetch_offset: int, upper_bound: int) -> TxnLookup:
        """What Kafka's broker lists for a fetch of ``[fetch_offset, upper_bound)``: from the
        segment holding ``fetch_offset`` on, until an entry proves the list complete (Kafka's
        rule; entries rlm rebuilt carry :data:`REBUILT_LAST_STABLE_OFFSET` and never do)."""
        out = TxnLookup([])
        for i in range(self._index_of(fetch_offset), len(self.sources)):
            src = self.sources[i]
            if src.last_offset < fetch_offset:
                continue
            entries, stored = self.entries(i)
            if not stored:
                out.scanned.append(src.location)
            found, complete = collect_aborted(entries, fetch_offset, upper_bound)
            out.entries.extend(found)
            if complete:
                break
        return out

    def last_stable_offset(self, visible_end: int) -> int:
        """The first offset of the oldest transaction still open below ``visible_end``, or
        ``visible_end`` when none is: producer state replayed from the newest known state at or
        below the first local segment (:meth:`_seed`), each source summarized once per version
        of its bytes. Never below the log start (Kafka's ``max(first unstable offset, log start
        offset)``): a transaction still open whose first records were deleted (retention,
        DeleteRecords) bounds readers at the log start, not at offsets nobody serves."""
        if not self.sources:
            return visible_end
        start, seed = self._seed()
        state = open_after([self.summary(i) for i in range(start, len(self.sources))], seed)
        first_open = min([visible_end, *state.values()])
        floor = self.log_start if self.log_start is not None else first_open
        return min(visible_end, max(first_open, floor))

    def _snapshot(self, src: TxnSource) -> dict[int, int] | None:
        """The transactions open at ``src.first_offset`` by its producer snapshot, or None."""
        if src.snapshot is None:
            return None
        where = src.snapshot
        if src.tier == "local":
            try:
                st = os.stat(where)
            except FileNotFoundError:
                return None
            return FACTS.get(
                ("snapshot", where, st.st_ino, st.st_size, st.st_mtime_ns),
                lambda: open_at_local(where),
            )
        if self.backend is None:
            raise RlmError("a remote transaction source needs a backend")
        backend = self.backend
        return FACTS.get(
            ("snapshot", where),
            lambda: open_at_remote(backend, self.protection, where, src.manifest),
        )

    def _state_before(self, i: int) -> dict[int, int] | None:
        """The transactions open before ``sources[i]`` (``i == len``: after the last), if known:
        recorded by the copy of the source before it when nothing lies between the two, or by a
        producer snapshot at its start. Offsets between them (a gap: the broker deleted them before
        they were tiered) may hold the markers that closed what the copy recorded as open: that
        record is the state at the gap, not after it (docs/transactions.md)."""
        before = self.sources[i - 1] if i > 0 else None
        adjacent = i == len(self.sources) or (
            before is not None and before.last_offset + 1 == self.sources[i].first_offset
        )
        if before is not None and before.open_at_end is not None and adjacent:
            return dict(before.open_at_end)
        if i < len(self.sources):
            if self.sources[i].first_offset == 0:
                return {}  # nothing lies below offset 0
            return self._snapshot(self.sources[i])
        return None

    def _seed(self) -> tuple[int, dict[int, int]]:
        """``(i, state)``: the transactions open before ``sources[i]``, for the newest ``i`` at or
        below the first local source (with none: after the last source) whose state is known —
        no remote source is then replayed when the first local segment's snapshot or the last
        remote segment's recorded state answers. With none, every source is replayed from the
        oldest (the state before it assumed empty, as Kafka assumes at its log start)."""
        local = [i for i, s in enumerate(self.sources) if s.tier == "local"]
        newest = local[0] if local else len(self.sources)
        for i in range(newest, -1, -1):
            found = self._state_before(i)
            if found is not None:
                break
        else:
            i, found = 0, {}
        if newest - i > 1:
            first = self.sources[i]
            FACTS.get(
                ("replay", first.location, first.identity, newest),
                lambda: log.info(
                    "%s: no producer snapshot or recorded open transactions nearer the local log: the "
                    "last stable offset is replayed from the batches of %d tiered segment(s) from "
                    "offset %d (docs/transactions.md)",
                    first.location,
                    newest - i,
                    first.first_offset,
                ),
            )
        return i, found
