"""Request economics: every store call counted by operation, bytes and partition.

:class:`MeteringBackend` wraps the store where the manager builds it — below the call sites and
below the retry layer (:func:`rlm.storage.retry.under_retries`), so every attempt of a retried
call is counted, as the store bills each one — and counts each call of the contract — ``put``,
``get`` (ranged reads), ``list`` (one page), ``head``, ``delete`` — with the bytes sent (put) or
received (get). The partition a call is for comes from a context variable: the manager sets it
around a partition's pass and the read path around a fetch (:func:`attributed`); calls outside
any (GC sweeps, startup) are attributed by their key, through the ``attribute`` function the
tiering layer hands in (a key's root names its partition; read-ahead threads run outside the
fetch's context), else count under the empty partition label. It sits above the key spread, so it
sees logical keys. Units: requests and bytes (put: the stored object's size; a multipart upload
is one put, the re-sent steps of one upload are not counted again).

Exported (docs/store-requests.md)::

    rlm_store_requests_total{op, topic, partition}
    rlm_store_request_bytes_total{op, direction}      direction = "sent" | "received"

and per partition in ``rlm status`` / ``GET /v1/partitions`` rows (:meth:`RequestMeter.row`).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, ClassVar

from prometheus_client import CollectorRegistry, Counter

from rlm.storage.api import ListPage, ObjectInfo, StorageBackend
from rlm.storage.wrapper import WrappingBackend

__all__ = ["OPS", "MeteringBackend", "RequestMeter", "attributed"]

OPS = ("put", "get", "list", "head", "delete")
_FIELDS = (*OPS, "bytes_sent", "bytes_received")
_PARTITION: contextvars.ContextVar[tuple[str, int] | None] = contextvars.ContextVar(
    "rlm_store_partition", default=None
)


@contextlib.contextmanager
def attributed(topic: str, partition: int) -> Iterator[None]:
    """Count the store calls made inside (this thread/context) for ``topic``-``partition``."""
    token = _PARTITION.set((topic, partition))
    try:
        yield
    finally:
        _PARTITION.reset(token)


class RequestMeter:
    """Per-partition request counts and bytes, plus the Prometheus counters; thread-safe."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        attribute: Callable[[str], tuple[str, int] | None] | None = None,
    ) -> None:
        r = registry or CollectorRegistry()
        self.attribute = attribute
        self._requests = Counter(
            "rlm_store_requests",
            "Object-store requests by operation and partition (empty labels: not for one partition, e.g. GC)",
            ["op", "topic", "partition"],
            registry=r,
        )
        self._bytes = Counter(
            "rlm_store_request_bytes",
            "Bytes sent to (put) and received from (get) the object store",
            ["op", "direction"],
            registry=r,
        )
        self._lock = threading.Lock()
        self._by_partition: dict[tuple[str, int] | None, dict[str, int]] = {}

    def count(self, op: str, key: str, sent: int = 0, received: int = 0) -> None:
        """One ``op`` request on ``key`` (a listing's prefix) moving ``sent``/``received`` bytes."""
        who = _PARTITION.get()
        if who is None and self.attribute is not None:
            who = self.attribute(key)
        with self._lock:
            row = self._by_partition.setdefault(who, dict.fromkeys(_FIELDS, 0))
            row[op] += 1
            row["bytes_sent"] += sent
            row["bytes_received"] += received
        topic, partition = who if who is not None else ("", "")
        self._requests.labels(op=op, topic=topic, partition=str(partition)).inc()
        if sent:
            self._bytes.labels(op=op, direction="sent").inc(sent)
        if received:
            self._bytes.labels(op=op, direction="received").inc(received)

    def row(self, topic: str, partition: int) -> dict[str, int]:
        """``{put, get, list, head, delete, bytes_sent, bytes_received}`` of one partition so far."""
        with self._lock:
            return dict(self._by_partition.get((topic, partition)) or dict.fromkeys(_FIELDS, 0))

    def totals(self) -> dict[str, int]:
        """The same fields summed over every partition and the unattributed calls."""
        out = dict.fromkeys(_FIELDS, 0)
        with self._lock:
            for row in self._by_partition.values():
                for k, v in row.items():
                    out[k] += v
        return out


class MeteringBackend(WrappingBackend):
    """Passes every call to ``inner`` and counts it in ``meter``; see module doc."""

    name: ClassVar[str] = "metering"

    def __init__(self, inner: StorageBackend, meter: RequestMeter) -> None:
        self.inner = inner
        self.meter = meter
        self.options = {}

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()

    def __repr__(self) -> str:
        return f"MeteringBackend({self.inner!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (MeteringBackend, (self.inner, RequestMeter()))

    def _put(self, key: str, stream: BinaryIO, if_absent: bool) -> ObjectInfo:
        info: ObjectInfo | None = None
        try:
            info = self.inner.put(key, stream, if_absent=if_absent)
            return info
        finally:  # the stored size: the stream is passed through untouched (zero-copy paths)
            self.meter.count("put", key, sent=info.size if info is not None else 0)

    def _read(self, key: str, start: int, end: int | None) -> bytes:
        data = b""
        try:
            data = self.inner.read(key, start, end)
            return data
        finally:
            self.meter.count("get", key, received=len(data))

    def _head(self, key: str) -> ObjectInfo:
        try:
            return self.inner.head(key)
        finally:
            self.meter.count("head", key)

    def _list_page(self, prefix: str, start_after: str | None, limit: int) -> ListPage:
        try:
            return self.inner.list_page(prefix, token=start_after, limit=limit)
        finally:
            self.meter.count("list", prefix)

    def _delete(self, key: str) -> None:
        try:
            self.inner.delete(key)
        finally:
            self.meter.count("delete", key)
