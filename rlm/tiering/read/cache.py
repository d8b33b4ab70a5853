"""A byte-bounded cache of remote byte ranges in two segments, with hit/miss/eviction metrics.

Keys are ``(object key, start, end)`` half-open ranges exactly as read; values are the bytes. The
bound is on the bytes held (``max_bytes``), not on the number of ranges, so one huge read cannot
hide behind a small count. A range larger than the whole cache is returned but not kept.

Admission has two classes (docs/read-path.md): ``lookup`` ranges (point lookups, random fetches)
live in the main LRU segment; ``sequential`` ranges (what a catch-up reader read or had read
ahead) live in a low-priority segment that is evicted first, so a catch-up scan only ever uses free
space and evicts its own ranges, never another reader's hot entries, and holds at most
:data:`SCAN_SHARE` of the bound. A ``lookup`` hit on a
sequential range promotes it to the main segment; a ``sequential`` admission of a range the main
segment holds (a catch-up passing a hot entry) leaves it there. Thread-safe; loads of the same range by
concurrent callers are not coalesced (both fetch). Loads (the reads that reach the store) are
counted as Kafka's RemoteFetch{Requests,Bytes,Errors}.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["Admission", "RangeBytes", "RangeKey", "RemoteRangeCache", "owned"]

RangeKey = tuple[str, int, int]
Admission = Literal["lookup", "sequential"]
#: A range's bytes: read-ahead hands out zero-copy slices of one larger GET (docs/read-path.md).
RangeBytes = bytes | memoryview
#: The scan segment's part of the bound at most: a catch-up reads each range once, and what it
#: keeps serves only a reader close behind it (a retried fetch, a second consumer in step), which
#: a quarter covers. Filling the whole cache instead put every page of a first catch-up's first
#: 256 MiB in new memory, which a VM whose freed pages go back to its host faults in at ~20 µs a
#: page: most of that catch-up's CPU (BENCHMARKS.md, #35).
SCAN_SHARE = 0.25


def owned(data: RangeBytes) -> RangeBytes:
    """``data`` itself unless it is a slice of a larger buffer, which it would keep alive: then a
    copy, so that what the main segment holds is what it counts (its byte bound stays true)."""
    if isinstance(data, memoryview) and data.nbytes < memoryview(data.obj).nbytes:
        return bytes(data)
    return data


class RemoteRangeCache:
    def __init__(self, max_bytes: int, registry: CollectorRegistry | None = None) -> None:
        self.max_bytes = max_bytes
        self._main: OrderedDict[RangeKey, RangeBytes] = OrderedDict()
        self._scan: OrderedDict[RangeKey, RangeBytes] = OrderedDict()  # evicted first
        self._bytes = 0
        self._scan_bytes = 0  # of _bytes, in the scan segment
        self._lock = threading.Lock()
        self.registry = registry or CollectorRegistry()
        self._declare_cache_metrics(self.registry)
        self._declare_prefetch_metrics(self.registry)
        self._declare_fetch_metrics(self.registry)

    def _declare_cache_metrics(self, r: CollectorRegistry) -> None:
        """Hits, misses, evictions, size and admissions of this cache."""
        self.hits = Counter("rlm_remote_cache_hits", "Remote range reads served from the cache", registry=r)
        self.misses = Counter(
            "rlm_remote_cache_misses", "Remote range reads that went to the store", registry=r
        )
        self.evictions = Counter(
            "rlm_remote_cache_evictions", "Ranges evicted to stay under the byte bound", registry=r
        )
        self.size = Gauge("rlm_remote_cache_bytes", "Bytes held by the remote range cache", registry=r)
        self.admissions = Counter(
            "rlm_remote_cache_admissions",
            "Ranges admitted to the cache, by "
            "class: lookup (main segment) or sequential (low priority, evicted "
            "first)",
            ["class"],
            registry=r,
        )
        self.class_reads = Counter(
            "rlm_remote_cache_reads",
            "Cache reads by reader class (lookup | sequential) and result (hit | miss)",
            ["class", "result"],
            registry=r,
        )

    def _declare_prefetch_metrics(self, r: CollectorRegistry) -> None:
        """The read-ahead's (rlm/tiering/read/readahead.py): kept here so one registry holds them once."""
        self.prefetch_hits = Counter(
            "rlm_remote_prefetch_hits",
            "Entries a fetch needed that read-ahead had already read (no second GET)",
            registry=r,
        )
        self.prefetch_requests = Counter(
            "rlm_remote_prefetch_requests",
            "Ranged reads issued ahead of sequential readers (also counted in rlm_remote_fetch_requests)",
            registry=r,
        )
        self.prefetch_wasted = Counter(
            "rlm_remote_prefetch_wasted_bytes",
            "Bytes read ahead and dropped unused (the reader jumped, went idle or away)",
            registry=r,
        )
        self.prefetch_in_flight = Gauge(
            "rlm_remote_prefetch_in_flight", "Read-ahead reads queued or running", registry=r
        )
        self.prefetch_bytes = Gauge(
            "rlm_remote_prefetch_bytes",
            "Bytes held or in flight in read-ahead windows, all readers",
            registry=r,
        )
        self.prefetch_readers = Gauge(
            "rlm_remote_prefetch_readers", "Readers tracked by the read-ahead", registry=r
        )

    def _declare_fetch_metrics(self, r: CollectorRegistry) -> None:
        """Reads that reach the store (cache misses and read-ahead), named after Kafka's RemoteFetch*."""
        self.fetch_requests = Counter(
            "rlm_remote_fetch_requests",
            "Ranged reads sent to remote storage by lookups and fetches (Kafka: RemoteFetchRequestsPerSec)",
            registry=r,
        )
        self.fetch_bytes = Counter(
            "rlm_remote_fetch_bytes",
            "Bytes read from remote storage by lookups and fetches (Kafka: RemoteFetchBytesPerSec)",
            registry=r,
        )
        self.fetch_errors = Counter(
            "rlm_remote_fetch_errors",
            "Ranged reads from remote storage that failed (Kafka: RemoteFetchErrorsPerSec)",
            registry=r,
        )

    def get(self, key: RangeKey, admission: Admission = "lookup") -> RangeBytes | None:
        with self._lock:
            data = self._main.get(key)
            if data is not None:
                self._main.move_to_end(key)
            else:
                data = self._scan.get(key)
                if data is not None and admission == "lookup":  # wanted by a lookup: promote
                    del self._scan[key]
                    self._scan_bytes -= len(data)
                    self._main[key] = promoted = owned(data)
                    self._bytes += len(promoted) - len(data)
                    data = promoted
        (self.hits if data is not None else self.misses).inc()
        self.class_reads.labels(admission, "hit" if data is not None else "miss").inc()
        return data

    def note_miss(self, admission: Admission = "lookup") -> None:
        """A miss found without :meth:`get` (a fetch that checked ``in`` and read ahead itself)."""
        self.misses.inc()
        self.class_reads.labels(admission, "miss").inc()

    def put(self, key: RangeKey, data: RangeBytes, admission: Admission = "lookup") -> None:
        """Admit ``data``: ``lookup`` into the main segment, ``sequential`` into the scan segment
        (evicted first). A slice of a larger read-ahead GET is kept as a slice only in the scan
        segment, whose ranges leave in read order with their siblings; the main one copies it."""
        if len(data) > self.max_bytes:
            return
        with self._lock:
            # A catch-up reading through a range a lookup already holds must not demote it to the
            # scan segment (evicted first): the hot range stays in the main one.
            keep_main = admission == "lookup" or key in self._main
            if keep_main:
                data = owned(data)
            old = self._main.pop(key, None)
            if old is not None:
                self._bytes -= len(old)
            old = self._scan.pop(key, None)
            if old is not None:
                self._bytes -= len(old)
                self._scan_bytes -= len(old)
            if keep_main:
                self._main[key] = data
            else:
                self._scan[key] = data
                self._scan_bytes += len(data)
            self._bytes += len(data)
            scan_max = int(self.max_bytes * SCAN_SHARE)
            while self._bytes > self.max_bytes or self._scan_bytes > scan_max:
                if self._scan:
                    _, evicted = self._scan.popitem(last=False)
                    self._scan_bytes -= len(evicted)
                else:
                    _, evicted = self._main.popitem(last=False)
                self._bytes -= len(evicted)
                self.evictions.inc()
            self.size.set(self._bytes)
        self.admissions.labels(admission).inc()

    def load(self, load: Callable[[], RangeBytes]) -> RangeBytes:
        """``load()`` counted as one store read (requests, bytes, errors); nothing is admitted."""
        self.fetch_requests.inc()
        try:
            data = load()
        except Exception:
            self.fetch_errors.inc()
            raise
        self.fetch_bytes.inc(len(data))
        return data

    def get_or_load(
        self, key: RangeKey, load: Callable[[], RangeBytes], admission: Admission = "lookup"
    ) -> RangeBytes:
        data = self.get(key, admission)
        if data is None:
            data = self.load(load)
            self.put(key, data, admission)
        return data

    @property
    def ranges_held(self) -> int:
        """Ranges held, both segments (no ``__len__``: an empty cache must stay truthy)."""
        with self._lock:
            return len(self._main) + len(self._scan)

    def __contains__(self, key: RangeKey) -> bool:
        with self._lock:
            return key in self._main or key in self._scan

    @property
    def bytes_held(self) -> int:
        return self._bytes
