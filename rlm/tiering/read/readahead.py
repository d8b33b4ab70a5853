"""The remote read engine's shared half (docs/read-path.md): the store, cache and read-ahead every
partition reader uses. The fetch itself (which reads through them) is rlm/tiering/read/remote_fetch.py.

* A reader (an opaque key from the caller, per partition) that fetches where its previous fetch
  ended twice in a row is *sequential*: the next entries of the chain are read ahead in parallel,
  bounded in bytes per reader and in total; a fetch takes a range read ahead instead of reading it
  again. Jumping elsewhere drops (and cancels) the window; so does idling ``idle_s``.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import CancelledError, Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass, field

from rlm.config import TieringSettings
from rlm.formats.indexes.remote_index import DecodedEntry
from rlm.logdir.checkpoint_cache import CheckpointCache
from rlm.logdir.discovery import EligibilityPolicy
from rlm.logdir.index_sets import SetCache
from rlm.logdir.listing_cache import ListingCache
from rlm.storage.api import StorageBackend
from rlm.tiering.read.cache import Admission, RangeBytes, RangeKey, RemoteRangeCache
from rlm.tiering.read.served_sets import StoreSets
from rlm.tiering.store import EntryOpener, StoreProtection

#: The largest ranged GET read-ahead makes of adjacent entries of one object (bytes).
COALESCE_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class ReadAheadLimits:
    """``[tiering] read_ahead_*`` (bytes, seconds, threads); ``reader_bytes`` 0 disables read-ahead."""

    reader_bytes: int = 16 << 20
    total_bytes: int = 128 << 20
    idle_s: float = 30.0
    threads: int = 8

    @classmethod
    def from_settings(cls, t: TieringSettings) -> ReadAheadLimits:
        return cls(
            t.read_ahead_bytes, t.read_ahead_total_bytes, t.read_ahead_idle_ms / 1000, t.read_ahead_threads
        )


@dataclass(slots=True)
class _Ahead:
    size: int
    future: Future[RangeBytes]
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

    def __init__(
        self,
        load: Callable[[RangeKey], RangeBytes],
        limits: ReadAheadLimits,
        cache: RemoteRangeCache,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._load, self.limits, self._m, self._clock = load, limits, cache, clock
        self._readers: dict[Hashable, _Reader] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._sweeper: threading.Thread | None = None
        self._closed = threading.Event()
        # Read when scraped, not set on every reservation (several per Fetch, each a lock and
        # checks in the client library); weak, so the registry does not keep this one alive.
        me = weakref.ref(self)
        cache.prefetch_bytes.set_function(lambda: _gauge(me, lambda ahead: ahead.bytes_reserved))
        cache.prefetch_readers.set_function(lambda: _gauge(me, lambda ahead: len(ahead._readers)))

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

    def take(self, rid: Hashable, key: RangeKey) -> RangeBytes | None:
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

    def landed(self, rid: Hashable, key: RangeKey) -> bool:
        """False while the range ``rid`` has read ahead under ``key`` is still in flight (then
        :meth:`take` would wait for it); True when it landed or is not in the window."""
        with self._lock:
            st = self._readers.get(rid)
            ahead = None if st is None else st.window.get(key)
        return ahead is None or ahead.future.done()

    def keep(self, rid: Hashable, key: RangeKey, data: RangeBytes) -> None:
        """A range the fetch read but did not use up: held at the window's front for the next
        fetch, within the bounds (else the next fetch reads it from the cache or the store)."""
        with self._lock:
            st = self._readers.get(rid)
            if st is None or key in st.window or not self._fits(st, len(data)):
                return
            done: Future[RangeBytes] = Future()
            done.set_result(data)
            self._reserve(st, key, _Ahead(len(data), done, kept=True))
            st.window.move_to_end(key, last=False)

    def ahead(self, rid: Hashable, next_offset: int | None, upcoming: Iterable[tuple[RangeKey, int]]) -> None:
        """After a fetch: where ``rid`` continues; when sequential, issue reads of the ``upcoming``
        ranges (chain order, ``(key, bytes)``) not yet in its window while they fit the bounds."""
        with self._lock:
            st = self._readers.get(rid)
            if st is None:
                return
            st.next_offset = next_offset
            if st.streak < 2 or not self.enabled:
                return
            if st.bytes > self.limits.reader_bytes // 2:
                return  # topped up once half of it is consumed: in runs long enough for large GETs
            picked: list[tuple[RangeKey, Future[RangeBytes]]] = []
            for key, size in upcoming:
                if key in st.window:
                    continue
                if not self._fits(st, size):
                    break
                placeholder: Future[RangeBytes] = Future()
                self._reserve(st, key, _Ahead(size, placeholder))
                picked.append((key, placeholder))
            for run in _runs(picked):
                self._submit_run(run)

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
        return st.bytes + size <= self.limits.reader_bytes and self._bytes + size <= self.limits.total_bytes

    def _reserve(self, st: _Reader, key: RangeKey, ahead: _Ahead) -> None:
        st.window[key] = ahead
        st.bytes += ahead.size
        self._bytes += ahead.size

    def _release(self, st: _Reader, ahead: _Ahead) -> None:
        st.bytes -= ahead.size
        self._bytes -= ahead.size

    def _clear(self, st: _Reader) -> list[_Ahead]:
        dropped = list(st.window.values())
        for ahead in dropped:
            self._release(st, ahead)
        st.window.clear()
        return dropped

    def _expire(self, now: float, dropped: list[_Ahead]) -> None:
        for rid in [r for r, st in self._readers.items() if now - st.seen >= self.limits.idle_s]:
            dropped += self._clear(self._readers.pop(rid))

    def keep_in_window(self, rid: Hashable, key: RangeKey, size: int, future: Future[RangeBytes]) -> bool:
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

    def load_soon(self, key: RangeKey) -> Future[RangeBytes]:
        """One read on the pool for a fetch that needs several entries (not read-ahead)."""
        with self._lock:
            return self._pool_locked().submit(self._load, key)

    def _pool_locked(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.limits.threads, "rlm-read-ahead")
        return self._pool

    def _submit_run(self, run: list[tuple[RangeKey, Future[RangeBytes]]]) -> None:
        """One ranged GET for ``run`` (adjacent ranges of one object); each range's future gets its
        slice. A range dropped meanwhile (its future cancelled) counts as wasted once read."""
        obj, start, end = run[0][0][0], run[0][0][1], run[-1][0][2]
        self._m.prefetch_requests.inc()
        self._m.prefetch_in_flight.inc()
        whole = self._pool_locked().submit(self._load, (obj, start, end))

        def spread(done: Future[RangeBytes]) -> None:
            self._m.prefetch_in_flight.dec()
            error = CancelledError() if done.cancelled() else done.exception()
            data = done.result() if error is None else b""
            # Zero-copy slices: copying each range out of the GET cost more GIL time than any
            # other step of a 4-reader catch-up (py-spy, BENCHMARKS.md "Catch-up reads").
            view = memoryview(data) if len(run) > 1 else data
            for (_obj, lo, hi), part in run:
                try:
                    if error is not None:
                        part.set_exception(error)
                    elif not part.cancelled():
                        part.set_result(view[lo - start : hi - start])
                        continue
                except InvalidStateError:  # cancelled between the check and the set
                    pass
                if error is None:
                    self._m.prefetch_wasted.inc(hi - lo)
            # The GET and its ranges refer to each other (this callback holds ``run``, each
            # range's ``unwanted`` holds the GET): a cycle that only the cyclic collector frees,
            # which the daemon runs rarely (tune_gc). Cut here, the GET's bytes go with the last
            # range that uses them, on the spot, so the allocator hands their pages to the next
            # GET instead of faulting in fresh ones (hundreds of MiB of garbage per catch-up).
            run.clear()

        whole.add_done_callback(spread)

        def unwanted(_: Future[RangeBytes]) -> None:  # every range dropped: a queued GET never runs
            if all(part.cancelled() for _key, part in run):
                whole.cancel()

        for _key, part in run:
            part.add_done_callback(unwanted)

    def _discard(self, dropped: list[_Ahead]) -> None:
        """Cancel what has not started; what was (or is being) read counts as wasted bytes."""
        for ahead in dropped:
            if not ahead.kept and not ahead.future.cancel():
                ahead.future.add_done_callback(self._wasted)

    def _wasted(self, future: Future[RangeBytes]) -> None:
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


def _gauge(ref: weakref.ReferenceType[ReadAhead], value: Callable[[ReadAhead], int]) -> float:
    """A read-ahead's gauge at a scrape: ``value`` of it, 0 once it is gone."""
    ahead = ref()
    return 0.0 if ahead is None else float(value(ahead))


@dataclass
class ReaderResources:
    """Shared by every partition reader: the store, the byte cache, the read-ahead."""

    backend: StorageBackend
    cache: RemoteRangeCache
    sets: SetCache = field(default_factory=SetCache)
    read_ahead: bool = True  # False: no read-ahead at all (request-count tests, benches' baselines)
    #: ``log.eligibility``: what is visible when the high watermark is unknown (docs/visibility.md)
    eligibility: EligibilityPolicy = "high-watermark"
    limits: ReadAheadLimits = field(default_factory=ReadAheadLimits)
    #: Opens compressed/encrypted entries (docs/protection.md); the cache holds stored bytes.
    protection: StoreProtection = field(default_factory=StoreProtection)
    #: The log dirs' parsed checkpoints, re-read only when a file changed (the daemon shares its
    #: manager's): a lookup would otherwise parse every partition's entries to find its own.
    checkpoints: CheckpointCache = field(default_factory=CheckpointCache)
    #: The partition directories' listings, listed again only when a directory changed.
    listings: ListingCache = field(default_factory=ListingCache)
    #: (topic, partition) → (high watermark, ns when asked) the broker last answered the manager's
    #: copy (rlm.cluster.log_starts.BrokerHighWatermarks.recent; the daemon's), else None: a
    #: visible end newer than the checkpoint's (docs/visibility.md). None: the files alone.
    broker_hw: Callable[[str, int], tuple[int, int] | None] | None = None

    def __post_init__(self) -> None:
        self.ahead = ReadAhead(self.load, self.limits, self.cache)
        #: The store's sets, for partitions whose local index falls short (docs/read-path.md).
        self.store_sets = StoreSets(self.backend, self.protection)
        self.opener = EntryOpener(self.protection, self.backend)
        self._keys: dict[str, str] = {}  # url -> object key: parsing URLs showed in the profile

    def read(self, key: RangeKey) -> bytes:
        """One ranged GET (retried by the store's retry layer); neither counted nor cached."""
        return self.backend.read(*key)

    def load(self, key: RangeKey) -> RangeBytes:
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

    def read_range(self, url: str, start: int, end: int, admission: Admission = "lookup") -> RangeBytes:
        key = (self.backend.key_for_url(url), start, end)
        return self.cache.get_or_load(key, lambda: self.read(key), admission)


_Pick = tuple[RangeKey, Future[RangeBytes]]


def _runs(picked: list[_Pick]) -> list[list[_Pick]]:
    """``picked`` (chain order) cut into runs of adjacent ranges of one object, each at most
    :data:`COALESCE_BYTES`: S3 servers charge per request (SeaweedFS on this host: 4.2 ms of CPU
    per MB at 1 MiB ranges, 1.2 at 8 MiB, client and server together; BENCHMARKS.md), so read-ahead
    reads a sequential reader's next entries with few large GETs."""
    runs: list[list[_Pick]] = []
    for key, part in picked:
        last = runs[-1][-1][0] if runs else None
        if (
            last is not None
            and last[0] == key[0]
            and last[2] == key[1]
            and key[2] - runs[-1][0][0][1] <= COALESCE_BYTES
        ):
            runs[-1].append((key, part))
        else:
            runs.append([(key, part)])
    return runs


__all__ = ["COALESCE_BYTES", "ReadAhead", "ReadAheadLimits", "ReaderResources"]
