"""A byte-bounded LRU cache of remote byte ranges, with hit/miss/eviction metrics.

Keys are ``(object key, start, end)`` half-open ranges exactly as read; values are the bytes. The
bound is on the bytes held (``max_bytes``), not on the number of ranges, so one huge read cannot
hide behind a small count. A range larger than the whole cache is returned but not kept.
Thread-safe; loads of the same range by concurrent callers are not coalesced (both fetch).
Loads (the reads that reach the store) are counted as Kafka's RemoteFetch{Requests,Bytes,Errors}.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

RangeKey = tuple[str, int, int]


class RemoteRangeCache:
    def __init__(self, max_bytes: int, registry: CollectorRegistry | None = None) -> None:
        self.max_bytes = max_bytes
        self._data: OrderedDict[RangeKey, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        r = registry or CollectorRegistry()
        self.hits = Counter("rlm_remote_cache_hits", "Remote range reads served from the cache", registry=r)
        self.misses = Counter("rlm_remote_cache_misses", "Remote range reads that went to the store",
                              registry=r)
        self.evictions = Counter("rlm_remote_cache_evictions", "Ranges evicted to stay under the byte "
                                 "bound", registry=r)
        self.size = Gauge("rlm_remote_cache_bytes", "Bytes held by the remote range cache", registry=r)
        # Reads that reach the store (cache misses), named after Kafka's RemoteFetch* meters.
        self.fetch_requests = Counter("rlm_remote_fetch_requests", "Ranged reads sent to remote storage "
                                      "by lookups and fetches (Kafka: RemoteFetchRequestsPerSec)",
                                      registry=r)
        self.fetch_bytes = Counter("rlm_remote_fetch_bytes", "Bytes read from remote storage by "
                                   "lookups and fetches (Kafka: RemoteFetchBytesPerSec)", registry=r)
        self.fetch_errors = Counter("rlm_remote_fetch_errors", "Ranged reads from remote storage that "
                                    "failed (Kafka: RemoteFetchErrorsPerSec)", registry=r)

    def get(self, key: RangeKey) -> bytes | None:
        with self._lock:
            data = self._data.get(key)
            if data is not None:
                self._data.move_to_end(key)
        (self.hits if data is not None else self.misses).inc()
        return data

    def put(self, key: RangeKey, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._bytes -= len(old)
            self._data[key] = data
            self._bytes += len(data)
            while self._bytes > self.max_bytes:
                _, evicted = self._data.popitem(last=False)
                self._bytes -= len(evicted)
                self.evictions.inc()
            self.size.set(self._bytes)

    def get_or_load(self, key: RangeKey, load: Callable[[], bytes]) -> bytes:
        data = self.get(key)
        if data is None:
            self.fetch_requests.inc()
            try:
                data = load()
            except Exception:
                self.fetch_errors.inc()
                raise
            self.fetch_bytes.inc(len(data))
            self.put(key, data)
        return data

    @property
    def bytes_held(self) -> int:
        return self._bytes
