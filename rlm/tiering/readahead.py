"""The remote read engine (docs/read-path.md): entry bytes for lookups and fetches, read-ahead of
sequential readers, and the remote fetch itself.

* A remote fetch reads whole ``.remotelogindex`` entries (one ranged GET each, cached under the
  same keys as lookups) along the store's chain — the local sets' order, across entries, objects
  and sets (:func:`rlm.tiering.remote_sets.chain_from`) — and answers with slices of them: one
  entry's answer is a zero-copy ``memoryview``; an answer spanning entries is joined once.
* Batches are not CRC-checked again unless asked (``verify``): the copier verified every batch
  before uploading it.
* A reader (an opaque key from the caller, per partition) that fetches where its previous fetch
  ended twice in a row is *sequential*: the next entries of the chain are read ahead in parallel,
  bounded in bytes per reader and in total; a fetch takes a range read ahead instead of reading it
  again. Jumping elsewhere drops (and cancels) the window; so does idling ``idle_s``.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

from rlm.config import TieringSettings
from rlm.errors import FormatError
from rlm.formats.records import RecordBatch, iter_batches
from rlm.formats.remote_index import DecodedEntry
from rlm.logdir.scan import EligibilityPolicy
from rlm.storage.api import StorageBackend
from rlm.storage.retry import RetryPolicy
from rlm.tiering.cache import Admission, RangeKey, RemoteRangeCache
from rlm.tiering.remote_sets import SetCache, SetView, chain_from

#: The bytes of a fetch's answer: one entry's slice (no copy) or several joined.
FetchBytes = bytes | memoryview


@dataclass(frozen=True, slots=True)
class ReadAheadLimits:
    """``[tiering] read_ahead_*`` (bytes, seconds, threads); ``reader_bytes`` 0 disables read-ahead."""

    reader_bytes: int = 16 << 20
    total_bytes: int = 128 << 20
    idle_s: float = 30.0
    threads: int = 8

    @classmethod
    def from_settings(cls, t: TieringSettings) -> ReadAheadLimits:
        return cls(t.read_ahead_bytes, t.read_ahead_total_bytes, t.read_ahead_idle_ms / 1000,
                   t.read_ahead_threads)


@dataclass(slots=True)
class _Ahead:
    size: int
    future: Future[bytes]
    kept: bool = False  # read by a fetch (not ahead): never counted as wasted


@dataclass(slots=True)
class _Reader:
    seen: float
    next_offset: int | None = None
    streak: int = 0  # fetches in a row each starting where the previous one ended
    window: OrderedDict[RangeKey, _Ahead] = field(default_factory=OrderedDict)  # chain order
    bytes: int = 0


class ReadAhead:
    """Per-reader windows of ranges read ahead. ``load(key)`` reads one range from the store."""

    def __init__(self, load: Callable[[RangeKey], bytes], limits: ReadAheadLimits,
                 cache: RemoteRangeCache, clock: Callable[[], float] = time.monotonic) -> None:
        self._load, self.limits, self._m, self._clock = load, limits, cache, clock
        self._readers: dict[Hashable, _Reader] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._sweeper: threading.Thread | None = None
        self._closed = threading.Event()

    @property
    def enabled(self) -> bool:
        return self.limits.reader_bytes > 0 and self.limits.total_bytes > 0 and not self._closed.is_set()

    @property
    def bytes_reserved(self) -> int:
        """Bytes held or in flight in every window (≤ ``limits.total_bytes``)."""
        return self._bytes

    def reader_bytes(self, rid: Hashable) -> int:
        with self._lock:
            st = self._readers.get(rid)
            return 0 if st is None else st.bytes

    def begin(self, rid: Hashable, offset: int) -> bool:
        """A fetch by ``rid`` at ``offset``: True when it continues the previous one's run of ≥ 1
        (the reader is sequential). Else its window is dropped. Idle readers are dropped first."""
        now = self._clock()
        dropped: list[_Ahead] = []
        with self._lock:
            self._expire(now, dropped)
            st = self._readers.get(rid)
            if st is None:
                st = self._readers[rid] = _Reader(now)
                self._m.prefetch_readers.set(len(self._readers))
                self._start_sweeper()
            if st.next_offset is not None and st.next_offset == offset:
                st.streak += 1
            else:
                dropped += self._clear(st)
                st.streak = 1
            st.seen = now
            sequential = st.streak >= 2
        self._discard(dropped)
        return sequential

    def take(self, rid: Hashable, key: RangeKey) -> bytes | None:
        """The range read ahead for ``rid`` (waiting for it if still in flight), or None. Ranges
        scheduled before it were skipped by the reader and are dropped."""
        dropped: list[_Ahead] = []
        with self._lock:
            st = self._readers.get(rid)
            if st is None or key not in st.window:
                return None
            while True:
                k, ahead = st.window.popitem(last=False)
                self._release(st, ahead)
                if k == key:
                    break
                dropped.append(ahead)
        self._discard(dropped)
        try:
            data = ahead.future.result()
        except Exception:  # the fetch reads the range itself and reports its own error
            return None
        self._m.prefetch_hits.inc()
        return data

    def keep(self, rid: Hashable, key: RangeKey, data: bytes) -> None:
        """A range the fetch read but did not use up: held at the window's front for the next
        fetch, within the bounds (else the next fetch reads it from the cache or the store)."""
        with self._lock:
            st = self._readers.get(rid)
            if st is None or key in st.window or not self._fits(st, len(data)):
                return
            done: Future[bytes] = Future()
            done.set_result(data)
            self._reserve(st, key, _Ahead(len(data), done, kept=True))
            st.window.move_to_end(key, last=False)

    def ahead(self, rid: Hashable, next_offset: int | None, upcoming: Iterable[tuple[RangeKey, int]]
              ) -> None:
        """After a fetch: where ``rid`` continues; when sequential, issue reads of the ``upcoming``
        ranges (chain order, ``(key, bytes)``) not yet in its window while they fit the bounds."""
        with self._lock:
            st = self._readers.get(rid)
            if st is None:
                return
            st.next_offset = next_offset
            if st.streak < 2 or not self.enabled:
                return
            for key, size in upcoming:
                if key in st.window:
                    continue
                if not self._fits(st, size):
                    break
                self._reserve(st, key, _Ahead(size, self._submit(key)))

    def sweep(self) -> None:
        """Drop readers idle for ``limits.idle_s`` (their queued reads cancelled)."""
        dropped: list[_Ahead] = []
        with self._lock:
            self._expire(self._clock(), dropped)
        self._discard(dropped)

    def settle(self, timeout: float | None = None) -> None:
        """Wait until every read ahead now in a window has landed (tests, benches)."""
        with self._lock:
            futures = [a.future for st in self._readers.values() for a in st.window.values()]
        for future in futures:
            try:
                future.exception(timeout)
            except CancelledError:
                continue

    def close(self) -> None:
        """Cancel everything; later calls read nothing ahead."""
        self._closed.set()
        dropped: list[_Ahead] = []
        with self._lock:
            for st in self._readers.values():
                dropped += self._clear(st)
            self._readers.clear()
        self._discard(dropped)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # -- internals (the lock held where named *_locked or documented) --------------------------

    def _fits(self, st: _Reader, size: int) -> bool:
        return (st.bytes + size <= self.limits.reader_bytes
                and self._bytes + size <= self.limits.total_bytes)

    def _reserve(self, st: _Reader, key: RangeKey, ahead: _Ahead) -> None:
        st.window[key] = ahead
        st.bytes += ahead.size
        self._bytes += ahead.size
        self._m.prefetch_bytes.set(self._bytes)

    def _release(self, st: _Reader, ahead: _Ahead) -> None:
        st.bytes -= ahead.size
        self._bytes -= ahead.size
        self._m.prefetch_bytes.set(self._bytes)

    def _clear(self, st: _Reader) -> list[_Ahead]:
        dropped = list(st.window.values())
        for ahead in dropped:
            self._release(st, ahead)
        st.window.clear()
        return dropped

    def _expire(self, now: float, dropped: list[_Ahead]) -> None:
        for rid in [r for r, st in self._readers.items() if now - st.seen >= self.limits.idle_s]:
            dropped += self._clear(self._readers.pop(rid))
        self._m.prefetch_readers.set(len(self._readers))

    def adopt(self, rid: Hashable, key: RangeKey, size: int, future: Future[bytes]) -> bool:
        """A read a fetch started but did not need after all: into ``rid``'s window (after what
        it holds) when it fits; False otherwise."""
        with self._lock:
            st = self._readers.get(rid)
            if st is None or key in st.window or not self._fits(st, size):
                return False
            self._reserve(st, key, _Ahead(size, future, kept=True))
            return True

    def holds(self, rid: Hashable, key: RangeKey) -> bool:
        with self._lock:
            st = self._readers.get(rid)
            return st is not None and key in st.window

    def load_soon(self, key: RangeKey) -> Future[bytes]:
        """One read on the pool for a fetch that needs several entries (not read-ahead)."""
        with self._lock:
            return self._pool_locked().submit(self._load, key)

    def _pool_locked(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.limits.threads, "rlm-read-ahead")
        return self._pool

    def _submit(self, key: RangeKey) -> Future[bytes]:
        self._m.prefetch_requests.inc()
        self._m.prefetch_in_flight.inc()
        future = self._pool_locked().submit(self._load, key)
        future.add_done_callback(lambda _: self._m.prefetch_in_flight.dec())
        return future

    def _discard(self, dropped: list[_Ahead]) -> None:
        """Cancel what has not started; what was (or is being) read counts as wasted bytes."""
        for ahead in dropped:
            if not ahead.kept and not ahead.future.cancel():
                ahead.future.add_done_callback(self._wasted)

    def _wasted(self, future: Future[bytes]) -> None:
        if not future.cancelled() and future.exception() is None:
            self._m.prefetch_wasted.inc(len(future.result()))

    def _start_sweeper(self) -> None:
        if self._sweeper is not None:
            return
        interval = max(0.05, self.limits.idle_s / 2)
        me, closed = weakref.ref(self), self._closed  # the thread must not keep its owner alive

        def run() -> None:
            while not closed.wait(interval):
                owner = me()
                if owner is None:
                    return
                owner.sweep()
                del owner

        self._sweeper = threading.Thread(target=run, name="rlm-read-ahead-sweep", daemon=True)
        self._sweeper.start()


@dataclass
class ReaderResources:
    """Shared by every partition reader: the store, the byte cache, the read-ahead."""

    backend: StorageBackend
    cache: RemoteRangeCache
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    sets: SetCache = field(default_factory=SetCache)
    read_ahead: bool = True  # False: no read-ahead at all (request-count tests, benches' baselines)
    #: ``log.eligibility``: what is visible when the high watermark is unknown (docs/visibility.md)
    eligibility: EligibilityPolicy = "high-watermark"
    limits: ReadAheadLimits = field(default_factory=ReadAheadLimits)

    def __post_init__(self) -> None:
        self.ahead = ReadAhead(self.load, self.limits, self.cache)
        self._keys: dict[str, str] = {}  # url -> object key: parsing URLs showed in the profile

    def read(self, key: RangeKey) -> bytes:
        """One ranged GET (with retries); neither counted nor cached."""
        return self.retry.call(lambda: self.backend.read(*key))

    def load(self, key: RangeKey) -> bytes:
        """One ranged GET (with retries), counted as a store read; not cached."""
        return self.cache.load(lambda: self.read(key))

    def key_of(self, entry: DecodedEntry) -> RangeKey:
        start, end = entry.entry.byte_range
        url = entry.entry.rdi.url
        key = self._keys.get(url)
        if key is None:
            if len(self._keys) >= 65_536:
                self._keys.clear()  # a bound, not an LRU: re-parsing is only slower
            key = self._keys[url] = self.backend.key_for_url(url)
        return key, start, end

    def read_range(self, url: str, start: int, end: int, admission: Admission = "lookup") -> bytes:
        key = (self.backend.key_for_url(url), start, end)
        return self.cache.get_or_load(key, lambda: self.read(key), admission)


class EntrySource:
    """Entry bytes for one lookup or fetch: read once per call (memo), else from the reader's
    read-ahead window, the cache, or the store. ``rid`` None: no read-ahead."""

    def __init__(self, res: ReaderResources, rid: Hashable | None = None, *, verify: bool = True) -> None:
        self.res, self.verify = res, verify
        self.rid = rid if res.read_ahead and res.ahead.enabled else None
        self.sequential = False
        self._memo: dict[RangeKey, tuple[bytes, list[RecordBatch]]] = {}
        self._pending: dict[RangeKey, Future[bytes]] = {}  # this fetch's own parallel reads
        self.views: list[SetView] = []  # the sets as this call found them (listed once per fetch)

    def begin(self, offset: int) -> None:
        if self.rid is not None:
            self.sequential = self.res.ahead.begin(self.rid, offset)

    def batches(self, entry: DecodedEntry) -> tuple[bytes, list[RecordBatch]]:
        """The entry's bytes and batches (CRC-checked only when ``verify``)."""
        key = self.res.key_of(entry)
        got = self._memo.get(key)
        if got is not None:
            return got
        admission: Admission = "sequential" if self.sequential else "lookup"
        data = self.res.ahead.take(self.rid, key) if self.rid is not None else None
        pending = self._pending.pop(key, None)
        if data is not None:
            self.res.cache.put(key, data, "sequential")  # low priority: only free space
        elif pending is not None:
            self.res.cache.note_miss(admission)
            data = pending.result()  # its error is this fetch's
            self.res.cache.put(key, data, admission)
        else:
            data = self.res.cache.get_or_load(key, lambda: self.res.read(key), admission)
        try:
            batches = list(iter_batches(data, skip_crc=not self.verify))
        except FormatError as err:
            raise err.in_file(f"{entry.entry.rdi}", base_position=key[1]) from err
        self._memo[key] = (data, batches)
        return data, batches

    def _settle_pending(self, end: int) -> None:
        """This fetch's parallel reads it did not use: a sequential reader's window takes them,
        else the cache does once they land (never read twice)."""
        admission: Admission = "sequential" if self.sequential else "lookup"
        for key, future in self._pending.items():
            size = key[2] - key[1]
            if self.sequential and self.rid is not None and self.res.ahead.adopt(self.rid, key, size, future):
                continue
            future.add_done_callback(partial(self._admit, key, admission))
        self._pending.clear()

    def _admit(self, key: RangeKey, admission: Admission, future: Future[bytes]) -> None:
        if not future.cancelled() and future.exception() is None:
            self.res.cache.put(key, future.result(), admission)

    def load_together(self, entries: Iterable[DecodedEntry]) -> None:
        """Start reading, in parallel, the entries a fetch will need after its first one that are
        neither read, read ahead nor cached (one GET each; the fetch waits for them in turn)."""
        if not (self.res.read_ahead and self.res.ahead.enabled):
            return
        for entry in entries:
            key = self.res.key_of(entry)
            if key in self._memo or key in self._pending or key in self.res.cache or (
                    self.rid is not None and self.res.ahead.holds(self.rid, key)):
                continue
            self._pending[key] = self.res.ahead.load_soon(key)

    def finish(self, next_offset: int | None, unused: Sequence[DecodedEntry],
               upcoming: Iterator[DecodedEntry], end: int) -> None:
        """After a fetch: keep what it read but did not use up, read ahead what comes next."""
        # A reader not (yet) sequential finds them in the cache, where they were admitted as lookups.
        for entry in unused if self.sequential and self.rid is not None else ():
            key = self.res.key_of(entry)
            self.res.ahead.keep(self.rid, key, self._memo[key][0])
        self._settle_pending(end)
        if self.rid is None:
            return
        nxt = itertools.takewhile(lambda e: e.entry.first_offset < end, upcoming)
        self.res.ahead.ahead(self.rid, next_offset,
                             ((self.res.key_of(e), e.entry.data_length) for e in nxt))


def remote_fetch(views: Sequence[SetView], source: EntrySource, offset: int, max_bytes: int,
                 end: int) -> tuple[FetchBytes, list[RecordBatch]]:
    """Whole batches from the one holding ``offset`` along the chain while they fit ``max_bytes``
    (≥ 1), each with its last offset below ``end``, from one segment (object) as Kafka's fetch;
    batch positions are relative to the answer. Read-ahead crosses segments."""
    chain = chain_from(views, offset)
    planned = _plan(chain, max_bytes, end)
    source.load_together(e for e in planned[1:]  # the last may be past the object or the end
                         if e.entry.rdi.url == planned[0].entry.rdi.url and e.entry.first_offset < end)
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
            source.finish(out[-1].last_offset + 1 if out else offset, unused,
                          itertools.chain([entry], chain), end)
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
        if (before >= max_bytes or entry.entry.first_offset >= end
                or entry.entry.rdi.url != planned[0].entry.rdi.url):
            break
    return planned


def _joined(parts: list[FetchBytes]) -> FetchBytes:
    """One part as it is (no copy); several joined once."""
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _fit(batches: Sequence[RecordBatch], offset: int, end: int, room: int, *, first: bool
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


__all__ = ["EntrySource", "FetchBytes", "ReadAhead", "ReadAheadLimits", "ReaderResources", "remote_fetch"]
