"""``isolation = read_committed | read_uncommitted`` for every read surface (docs/transactions.md).

One partition's transaction knowledge is a list of :class:`TxnSource` — the segments of both tiers
in offset order, each with its aborted transactions from, in order of preference:

* a remote segment's uploaded ``.txnindex`` (its manifest says ``txn_index``; ``entries: 0`` needs
  no read at all);
* a local segment's ``.txnindex`` written by the broker (trusted as Kafka trusts it);
* otherwise the segment's control batches, scanned (remote segments tiered before rlm captured the
  index: one whole-object read, cached per process), with the first offset of a transaction that
  began earlier found in the earlier segments' batches.

A read_committed fetch is (1) bounded by the last stable offset (:meth:`PartitionTxns.last_stable_offset`),
(2) given the aborted transactions Kafka's broker would list for it (:func:`collect_aborted` from
the fetch's segment on, until an entry proves the list complete), (3) filtered with a Kafka
consumer's rules (:func:`committed_batches`): aborted batches and control batches are dropped.
The last stable offset is replayed from a known producer state — a copy's recorded
``open_at_end`` or Kafka's producer snapshot (:mod:`rlm.tiering.producer_state`) — at or below
the first local segment, never from the local segments alone (a transaction opened in a tiered
segment by a producer silent since would be missed).
"""

from __future__ import annotations

import functools
import logging
import mmap
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from rlm.errors import CorruptIndexError, InvalidArgumentError, ObjectNotFoundError, RlmError
from rlm.formats.offset_index import Buffer
from rlm.formats.records import iter_batches
from rlm.formats.transactions import (
    REBUILT_LAST_STABLE_OFFSET,
    TxnSummary,
    committed_batches,
    open_after,
    resolve_first,
    summarize,
)
from rlm.formats.txn_index import AbortedTxn, collect_aborted, parse_txn_index
from rlm.logdir.index_sets import SetView
from rlm.logdir.scan import list_segments
from rlm.storage.api import StorageBackend
from rlm.storage.retry import RetryPolicy
from rlm.tiering import keys
from rlm.tiering.lookup import FetchResult, PartitionReader
from rlm.tiering.manifest import TXN_INDEX_OBJECT, SegmentManifest
from rlm.tiering.producer_state import open_at_end, open_at_local, open_at_remote, snapshot_key
from rlm.tiering.protect import StoreProtection
from rlm.tiering.txn_sources import FACTS, TxnSource, local_sources, plan_sources
from rlm.tiering.visibility import PartitionOffsets, batches_below

__all__ = [
    "ISOLATION_LEVELS",
    "Isolation",
    "PartitionTxns",
    "TxnLookup",
    "TxnSource",
    "apply_isolation",
    "check_isolation",
    "fetch",
    "fetcher",
    "local_sources",
    "plan_sources",
    "reader_txns",
]

log = logging.getLogger(__name__)

Isolation = Literal["read_uncommitted", "read_committed"]
ISOLATION_LEVELS: tuple[Isolation, ...] = ("read_uncommitted", "read_committed")


def check_isolation(value: str) -> Isolation:
    """``value`` as an :data:`Isolation` (Kafka's ``isolation.level`` names), else
    :class:`InvalidArgumentError` naming the field."""
    if value == "read_committed":
        return "read_committed"
    if value == "read_uncommitted":
        return "read_uncommitted"
    raise InvalidArgumentError(f"isolation {value!r} must be read_uncommitted or read_committed")


@dataclass(frozen=True, slots=True)
class TxnLookup:
    """The aborted transactions of one fetch and the segments whose batches had to be scanned
    (no index stored: tiered before rlm captured it, or no local ``.txnindex``)."""

    entries: list[AbortedTxn]
    scanned: list[str] = field(default_factory=list)


class PartitionTxns:
    """Aborted transactions and the last stable offset of one partition, over ``sources``."""

    def __init__(
        self,
        sources: Sequence[TxnSource],
        backend: StorageBackend | None,
        retry: RetryPolicy | None = None,
        protection: StoreProtection | None = None,
    ) -> None:
        self.sources = list(sources)
        self.backend = backend
        self.retry = retry or RetryPolicy()
        self.protection = protection or StoreProtection()

    # -- reading ------------------------------------------------------------------------------

    def _with_bytes(self, src: TxnSource, use: Callable[[Buffer], Any]) -> Any:
        if src.tier == "local":
            with open(src.location, "rb") as fh:
                if fh.seek(0, 2) == 0:
                    return use(b"")
                with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                    return use(buf)
        if self.backend is None:
            raise RlmError("a remote transaction source needs a backend")
        backend = self.backend
        data = self.retry.call(lambda: backend.read(src.location))
        if src.manifest is not None:  # stored compressed/encrypted: entry by entry
            data = self.protection.open_log(backend, self.retry, src.manifest, data)
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
                    backend = self.backend
                    raw = self.retry.call(lambda: backend.read(index_key))
                    if src.manifest is not None:
                        raw = self.protection.open_object(src.manifest, index_key, raw)
                return parse_txn_index(raw)
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
        of its bytes."""
        if not self.sources:
            return visible_end
        start, seed = self._seed()
        state = open_after([self.summary(i) for i in range(start, len(self.sources))], seed)
        return min([visible_end, *state.values()])

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
            lambda: open_at_remote(backend, self.retry, self.protection, where, src.manifest),
        )

    def _state_before(self, i: int) -> dict[int, int] | None:
        """The transactions open before ``sources[i]`` (``i == len``: after the last), if known:
        recorded by the copy of the source before it, or by a producer snapshot at its start."""
        if i > 0 and self.sources[i - 1].open_at_end is not None:
            return dict(self.sources[i - 1].open_at_end or ())
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


def apply_isolation(fetched: Any, txns: PartitionTxns, isolation: Isolation) -> Any:
    """A :class:`~rlm.tiering.lookup.FetchResult` as ``isolation`` returns it: unchanged for
    read_uncommitted; for read_committed only batches below the last stable offset, without
    aborted or control batches, with the aborted transactions Kafka would list and the offset to
    resume from (after the last batch examined, kept or not)."""
    if isolation == "read_uncommitted":
        return fetched
    end = fetched.high_watermark
    lso = txns.last_stable_offset(end) if end is not None else None
    examined = list(fetched.batches if lso is None else batches_below(iter(fetched.batches), lso))
    if not examined:
        return replace(
            fetched,
            data=b"",
            batches=[],
            isolation=isolation,
            last_stable_offset=lso,
            resume_offset=fetched.requested_offset,
        )
    upper = examined[-1].last_offset + 1
    found = txns.aborted(examined[0].base_offset, upper)
    if found.scanned:
        log.debug(
            "read_committed %s-%s [%d, %d): no transaction index stored for %d segment(s); "
            "scanned their control batches",
            fetched.topic,
            fetched.partition,
            examined[0].base_offset,
            upper,
            len(found.scanned),
        )
    kept, _skipped = committed_batches(fetched.data, examined, found.entries)
    data = b"".join(fetched.data[b.position : b.end_position] for b in kept)
    rebased, origin = [], 0
    for b in kept:
        rebased.append(replace(b, position=origin))
        origin += b.size
    return replace(
        fetched,
        data=data,
        batches=rebased,
        isolation=isolation,
        last_stable_offset=lso,
        resume_offset=upper,
        aborted_transactions=tuple(found.entries),
        txn_scanned=tuple(found.scanned),
    )


# -- the partition readers' view (HTTP, CLI) ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Facts:
    """What a reader needs from the manifest committing one log object (docs/transactions.md)."""

    captured: bool = False  # its aborted transactions were captured (``txn_index``)
    txn_key: str | None = None  # the stored entries' key (None: none stored)
    protected: SegmentManifest | None = None  # the manifest, when its objects are protected
    snapshot: tuple[int, str] | None = None  # (offset, key) of its usable producer snapshot
    last_offset: int = -1
    open_at_end: tuple[tuple[int, int], ...] | None = None  # see TxnSource.open_at_end


def _manifest_facts(backend: StorageBackend, retry: RetryPolicy, key: str) -> _Facts:
    """The :class:`_Facts` of the manifest committing the log object ``key`` (all unknown when it
    is gone or names another attempt)."""
    root = keys.parse_root(key)
    ref = keys.parse_data_key(root.topic, root.partition, key, root.topic_id) if root else None
    if root is None or ref is None:
        return _Facts()
    mkey = keys.manifest_key(root.topic, root.partition, ref.base_offset, root.topic_id)
    try:
        manifest = SegmentManifest.from_json(retry.call(lambda: backend.read(mkey)), key=mkey)
    except ObjectNotFoundError:
        return _Facts()  # deleted by retention meanwhile: scan what is still readable
    protected = manifest if manifest.protection is not None else None
    if manifest.attempt_id != ref.attempt_id:
        return _Facts(protected=protected)
    snap = snapshot_key(manifest, manifest.base_offset)
    stored = manifest.objects.get(TXN_INDEX_OBJECT)
    return _Facts(
        manifest.txn_index is not None,
        stored.key if stored is not None else None,
        protected,
        (manifest.base_offset, snap) if snap is not None else None,
        manifest.last_offset,
        open_at_end(manifest),
    )


def _remote_groups(reader: PartitionReader) -> list[tuple[str, int, int]]:
    """``(object url, first offset, last offset)`` of every remote segment in the reader's sets."""
    out: list[tuple[str, int, int]] = []
    for view in reader._sets():
        last = view.last.entry.rdi.url if view.last is not None else ""
        out += FACTS.get(
            ("groups", str(reader.part.path), view.base_offset, len(view.log_index), last),
            functools.partial(_set_groups, view),
        )
    return out


def _set_groups(view: SetView) -> list[tuple[str, int, int]]:
    out: list[tuple[str, int, int]] = []
    current = view.first
    while current is not None:
        e = current.entry
        if out and out[-1][0] == e.rdi.url:
            out[-1] = (e.rdi.url, out[-1][1], e.last_offset)
        else:
            out.append((e.rdi.url, e.first_offset, e.last_offset))
        current = view.entry_after(current)
    return out


def reader_txns(reader: PartitionReader, ranges: PartitionOffsets) -> PartitionTxns:
    """The sources a partition reader serves: remote segments below the local log start, then
    the local segments, up to the visible end."""
    end = ranges.visible_end_offset if ranges.visible_end_offset is not None else 0
    local_start = ranges.local_log_start_offset
    res = reader.res
    sources: list[TxnSource] = []
    for url, first, last in _remote_groups(reader):
        if (local_start is not None and first >= local_start) or first >= end:
            continue
        key = res.backend.key_for_url(url)
        facts: _Facts = FACTS.get(
            ("manifest", url),
            lambda k=key: _manifest_facts(  # type: ignore[misc]
                res.backend, res.retry, k
            ),
        )
        last = min(last, end - 1, (local_start if local_start is not None else end) - 1)
        snap = facts.snapshot
        sources.append(
            TxnSource(
                first,
                last,
                "remote",
                key,
                facts.txn_key,
                facts.captured,
                (url,),
                facts.protected,
                snap[1] if snap is not None and snap[0] == first else None,
                facts.open_at_end if last == facts.last_offset else None,
            )
        )
    sources += local_sources(list_segments(reader.part), end, local_start or 0)
    return PartitionTxns(sources, res.backend, res.retry, res.protection)


def fetch(
    reader: PartitionReader,
    offset: int,
    max_bytes: int,
    isolation: Isolation = "read_uncommitted",
    **options: Any,
) -> FetchResult:
    """:meth:`PartitionReader.fetch` (``options``: its keyword options) under ``isolation``
    (see :func:`apply_isolation`)."""
    fetched = reader.fetch(offset, max_bytes, **options)
    if isolation == "read_uncommitted":
        return fetched
    txns = reader_txns(reader, reader.offsets())
    result: FetchResult = apply_isolation(fetched, txns, isolation)
    return result


def fetcher(
    reader: PartitionReader, isolation: Isolation = "read_uncommitted", **options: Any
) -> Callable[[int, int], FetchResult]:
    """``(offset, max_bytes) → FetchResult`` for a stream of fetches (``/records/stream``): under
    read_committed a fetch whose batches were all aborted or markers is followed at once by the
    next one, so an answer has batches unless it reached the last stable offset."""
    if isolation == "read_uncommitted":
        return lambda offset, max_bytes: reader.fetch(offset, max_bytes, **options)

    def run(offset: int, max_bytes: int) -> FetchResult:
        while True:
            got = fetch(reader, offset, max_bytes, isolation, **options)
            if got.batches or got.next_offset is None or got.next_offset <= offset:
                return got
            offset = got.next_offset

    return run
