"""A backend wrapper that counts the requests reaching the store, by operation.

Used by the tests and benches that prove request budgets (a cold remote lookup costs at most two
object-store requests): wrap the real backend, do the work, read :attr:`CountingBackend.total`.
"""

from __future__ import annotations

import collections
import threading
from typing import BinaryIO

from rlm.storage.api import ListPage, ObjectInfo, StorageBackend
from rlm.storage.wrapper import WrappingBackend

__all__ = ["CountingBackend"]


class CountingBackend(WrappingBackend):
    """Passes every call to ``inner`` and counts it in :attr:`calls` (``put``/``read``/...)."""

    name = "counting"

    def __init__(self, inner: StorageBackend) -> None:
        super().__init__()
        self.inner = inner
        self.calls: collections.Counter[str] = collections.Counter()
        #: reads by (key, start, end): a range read twice shows a count of 2
        self.ranges: collections.Counter[tuple[str, int, int | None]] = collections.Counter()
        self._lock = threading.Lock()

    def _count(self, op: str) -> None:
        with self._lock:
            self.calls[op] += 1

    @property
    def total(self) -> int:
        """Requests so far, all operations."""
        with self._lock:
            return sum(self.calls.values())

    def _put(self, key: str, stream: BinaryIO, if_absent: bool) -> ObjectInfo:
        self._count("put")
        return super()._put(key, stream, if_absent)

    def _read(self, key: str, start: int, end: int | None) -> bytes:
        self._count("read")
        with self._lock:
            self.ranges[(key, start, end)] += 1
        return super()._read(key, start, end)

    def _head(self, key: str) -> ObjectInfo:
        self._count("head")
        return super()._head(key)

    def _list_page(self, prefix: str, start_after: str | None, limit: int) -> ListPage:
        self._count("list")
        return super()._list_page(prefix, start_after, limit)

    def _delete(self, key: str) -> None:
        self._count("delete")
        super()._delete(key)
