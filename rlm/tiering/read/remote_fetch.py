"""A remote fetch (docs/read-path.md): entry bytes for one lookup or fetch — read once per call,
else from the reader's read-ahead window, the cache or the store, several in parallel when a fetch
surely needs them — and the answer: whole batches along the store's chain, zero-copy inside one
entry, no CRC walk unless ``verify``. The shared engine is rlm/tiering/read/readahead.py.

* A remote fetch reads whole ``.remotelogindex`` entries (one ranged GET each, cached under the
  same keys as lookups) along the store's chain — the local sets' order, across entries, objects
  and sets (:func:`rlm.tiering.read.remote_sets.chain_from`) — and answers with slices of them: one
  entry's answer is a zero-copy ``memoryview``; an answer spanning entries is joined once.
* Batches are not CRC-checked again unless asked (``verify``): the copier verified every batch
  before uploading it.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from functools import partial

from rlm.errors import FormatError
from rlm.formats.indexes.remote_index import DecodedEntry
from rlm.formats.records import RecordBatch, iter_batches
from rlm.logdir.index_sets import SetView
from rlm.nowait import may_wait, waiting_allowed
from rlm.tiering.read.cache import Admission, RangeBytes, RangeKey
from rlm.tiering.read.readahead import ReaderResources
from rlm.tiering.read.remote_sets import chain_from

#: The bytes of a fetch's answer: one entry's slice (no copy) or several joined.
FetchBytes = bytes | memoryview


class EntrySource:
    """Entry bytes for one lookup or fetch: read once per call (memo), else from the reader's
    read-ahead window, the cache, or the store. ``rid`` None: no read-ahead."""

    def __init__(self, res: ReaderResources, rid: Hashable | None = None, *, verify: bool = True) -> None:
        self.res, self.verify = res, verify
        self.rid = rid if res.read_ahead and res.ahead.enabled else None
        self.sequential = False
        # range → (plaintext, its batches, the stored bytes read): entries open once per call
        self._memo: dict[RangeKey, tuple[RangeBytes, list[RecordBatch], RangeBytes]] = {}
        self._pending: dict[RangeKey, Future[RangeBytes]] = {}  # this fetch's own parallel reads
        self.views: list[SetView] = []  # the sets as this call found them (listed once per fetch)

    def begin(self, offset: int) -> None:
        if self.rid is not None:
            self.sequential = self.res.ahead.begin(self.rid, offset)

    def batches(self, entry: DecodedEntry) -> tuple[RangeBytes, list[RecordBatch]]:
        """The entry's bytes and batches (CRC-checked only when ``verify``)."""
        key = self.res.key_of(entry)
        got = self._memo.get(key)
        if got is not None:
            return got[0], got[1]
        admission: Admission = "sequential" if self.sequential else "lookup"
        if self.rid is not None and not self.res.ahead.landed(self.rid, key):
            may_wait("a range read ahead, still in flight")  # before take() drops it from the window
        data = self.res.ahead.take(self.rid, key) if self.rid is not None else None
        pending = self._pending.pop(key, None)
        if data is not None:
            self.res.cache.put(key, data, "sequential")  # low priority: only free space
        elif pending is not None:  # none without waiting: load_together() stopped before any
            self.res.cache.note_miss(admission)
            data = pending.result()  # its error is this fetch's
            self.res.cache.put(key, data, admission)
        else:
            data = self._cached_or_read(key, admission)
        stored = data
        # compressed/encrypted: rlm/tiering/store/store_protection.py, docs/protection.md
        if entry.entry.transformed:
            data = self.res.opener.open(entry.entry, bytes(data), log_key=key[0])
        try:
            batches = list(iter_batches(data, skip_crc=not self.verify))
        except FormatError as err:
            where = key[1] if not entry.entry.transformed else 0  # positions in the plaintext entry
            raise err.in_file(f"{entry.entry.rdi}", base_position=where) from err
        self._memo[key] = (data, batches, stored)
        return data, batches

    def _cached_or_read(self, key: RangeKey, admission: Admission) -> RangeBytes:
        """From the cache, else one store read (admitted)."""
        if not waiting_allowed() and key not in self.res.cache:
            # stop before get() counts the miss: the thread that goes on with the fetch counts it
            may_wait("a store read")
        return self.res.cache.get_or_load(key, lambda: self.res.read(key), admission)

    def _settle_pending(self, end: int) -> None:
        """This fetch's parallel reads it did not use: a sequential reader's window takes them,
        else the cache does once they land (never read twice)."""
        admission: Admission = "sequential" if self.sequential else "lookup"
        for key, future in self._pending.items():
            size = key[2] - key[1]
            if (
                self.sequential
                and self.rid is not None
                and self.res.ahead.keep_in_window(self.rid, key, size, future)
            ):
                continue
            future.add_done_callback(partial(self._admit, key, admission))
        self._pending.clear()

    def _admit(self, key: RangeKey, admission: Admission, future: Future[RangeBytes]) -> None:
        if not future.cancelled() and future.exception() is None:
            self.res.cache.put(key, future.result(), admission)

    def load_together(self, entries: Iterable[DecodedEntry]) -> None:
        """Start reading, in parallel, the entries a fetch will need after its first one that are
        neither read, read ahead nor cached (one GET each; the fetch waits for them in turn)."""
        if not (self.res.read_ahead and self.res.ahead.enabled):
            return
        keys = [self.res.key_of(entry) for entry in entries]
        wanted = [
            key
            for key in keys
            if not (
                key in self._memo
                or key in self._pending
                or key in self.res.cache
                or (self.rid is not None and self.res.ahead.holds(self.rid, key))
            )
        ]
        if wanted:
            may_wait("store reads")  # before any starts: whoever goes on with the fetch starts them
        for key in wanted:
            self._pending[key] = self.res.ahead.load_soon(key)

    def finish(
        self,
        next_offset: int | None,
        unused: Sequence[DecodedEntry],
        upcoming: Iterator[DecodedEntry],
        end: int,
    ) -> None:
        """After a fetch: keep what it read but did not use up, read ahead what comes next."""
        # A reader not (yet) sequential finds them in the cache, where they were admitted as lookups.
        for entry in unused if self.sequential and self.rid is not None else ():
            key = self.res.key_of(entry)
            self.res.ahead.keep(self.rid, key, self._memo[key][2])
        self._settle_pending(end)
        if self.rid is None:
            return
        nxt = itertools.takewhile(lambda e: e.entry.first_offset < end, upcoming)
        self.res.ahead.ahead(self.rid, next_offset, ((self.res.key_of(e), e.entry.stored_size) for e in nxt))


def remote_fetch(
    views: Sequence[SetView], source: EntrySource, offset: int, max_bytes: int, end: int
) -> tuple[FetchBytes, list[RecordBatch]]:
    """Whole batches from the one holding ``offset`` along the chain while they fit ``max_bytes``
    (≥ 1), each with its last offset below ``end``, from one segment (object) as Kafka's fetch;
    batch positions are relative to the answer. Read-ahead crosses segments."""
    chain = chain_from(views, offset)
    planned = _plan(chain, max_bytes, end)
    source.load_together(
        e
        for e in planned[1:]  # the last may be past the object or the end
        if e.entry.rdi.url == planned[0].entry.rdi.url and e.entry.first_offset < end
    )
    chain = itertools.chain(planned, chain)
    parts: list[FetchBytes] = []
    out: list[RecordBatch] = []
    total = 0
    unused: list[DecodedEntry] = []
    url: str | None = None
    for entry in chain:
        if entry.entry.first_offset >= end:
            break
        if url is not None and entry.entry.rdi.url != url:  # the next segment: the next fetch's
            source.finish(
                out[-1].last_offset + 1 if out else offset, unused, itertools.chain([entry], chain), end
            )
            return _joined(parts), out
        url = entry.entry.rdi.url
        data, batches = source.batches(entry)
        taken, full = _fit(batches, offset, end, max_bytes - total, first=not out)
        if taken:
            lo, hi = taken[0].position, taken[-1].end_position
            origin = total - lo
            out += taken if origin == 0 else [b.moved(origin) for b in taken]
            parts.append(data if (lo, hi) == (0, len(data)) else memoryview(data)[lo:hi])
            total += hi - lo
        if full:
            if not taken or taken[-1].end_position < len(data):
                unused.append(entry)  # the next fetch starts in it
            break
    source.finish(out[-1].last_offset + 1 if out else offset, unused, chain, end)
    return _joined(parts), out


def _plan(chain: Iterator[DecodedEntry], max_bytes: int, end: int) -> list[DecodedEntry]:
    """The entries a fetch of ``max_bytes`` from the chain's first entry surely reads: the first,
    then the next while the ones before it hold less than ``max_bytes`` (the answer starts inside
    the first, so at most one more may be read later, never one too many). The last one returned
    may be past the object or the end: the caller only reads those that are not."""
    planned: list[DecodedEntry] = []
    before = 0
    for entry in chain:
        planned.append(entry)
        before += entry.entry.data_length
        if (
            before >= max_bytes
            or entry.entry.first_offset >= end
            or entry.entry.rdi.url != planned[0].entry.rdi.url
        ):
            break
    return planned


def _joined(parts: list[FetchBytes]) -> FetchBytes:
    """One part as it is (no copy); several joined once."""
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _fit(
    batches: Sequence[RecordBatch], offset: int, end: int, room: int, *, first: bool
) -> tuple[list[RecordBatch], bool]:
    """The batches of one entry a fetch takes (last offset ≥ ``offset`` and < ``end``, while they
    fit ``room`` bytes — the first batch of the answer always), and whether the answer is full."""
    taken: list[RecordBatch] = []
    for batch in batches:
        if batch.last_offset < offset:
            continue
        if batch.last_offset >= end or (batch.size > room and not (first and not taken)):
            return taken, True
        taken.append(batch)
        room -= batch.size
    return taken, False


__all__ = ["EntrySource", "FetchBytes", "remote_fetch"]
