"""``memory``: an in-process dict store — tests, demos, and the default inner store of ``faulty``.

Option ``namespace`` (optional): backends built with the same namespace share their objects within
the process (so a daemon and a tool built from the same config see the same data); without it each
instance is private. All operations are atomic under one lock; conditional create is atomic.
"""

from __future__ import annotations

import bisect
import hashlib
import threading
import time
from typing import Any, BinaryIO, ClassVar

from rlm.errors import ObjectExistsError, ObjectNotFoundError
from rlm.storage.api import Capabilities, ListPage, ObjectInfo, StorageBackend, page_from_sorted
from rlm.storage.options import Option

__all__ = ["MemoryBackend"]


class _Store:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.data: dict[str, tuple[bytes, ObjectInfo]] = {}
        self.keys: list[str] = []  # sorted


_NAMESPACES: dict[str, _Store] = {}
_NAMESPACES_LOCK = threading.Lock()


class MemoryBackend(StorageBackend):
    """Objects live in a sorted in-memory map; see module doc."""

    name: ClassVar[str] = "memory"
    OPTIONS: ClassVar[tuple[Option, ...]] = (
        Option("namespace", "str", help="share objects with other instances of the same namespace"),
    )

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        ns = self.options["namespace"]
        if ns is None:
            self._store = _Store()
        else:
            with _NAMESPACES_LOCK:
                self._store = _NAMESPACES.setdefault(ns, _Store())

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(conditional_create=True, multipart=False, local_io=True)

    def _put(self, key: str, stream: BinaryIO, if_absent: bool) -> ObjectInfo:
        data = stream.read()
        info = ObjectInfo(key, len(data), hashlib.md5(data).hexdigest(), time.time())
        s = self._store
        with s.lock:
            if key not in s.data:
                bisect.insort(s.keys, key)
            elif if_absent:
                raise ObjectExistsError(f"memory: object {key!r} already exists")
            s.data[key] = (data, info)
        return info

    def _get(self, key: str) -> tuple[bytes, ObjectInfo]:
        with self._store.lock:
            try:
                return self._store.data[key]
            except KeyError:
                raise ObjectNotFoundError(f"memory: no object {key!r}") from None

    def _read(self, key: str, start: int, end: int | None) -> bytes:
        return self._get(key)[0][start:end]

    def _head(self, key: str) -> ObjectInfo:
        return self._get(key)[1]

    def _list_page(self, prefix: str, start_after: str | None, limit: int) -> ListPage:
        s = self._store
        with s.lock:
            lo = bisect.bisect_left(s.keys, prefix)
            if start_after is not None:
                lo = max(lo, bisect.bisect_right(s.keys, start_after))
            out: list[ObjectInfo] = []
            for key in s.keys[lo:]:
                if not key.startswith(prefix) or len(out) > limit:
                    break
                out.append(s.data[key][1])
        return page_from_sorted(out, limit)

    def _delete(self, key: str) -> None:
        s = self._store
        with s.lock:
            if s.data.pop(key, None) is not None:
                del s.keys[bisect.bisect_left(s.keys, key)]

    @classmethod
    def drop_namespace(cls, namespace: str) -> None:
        """Forget a shared namespace (tests)."""
        with _NAMESPACES_LOCK:
            _NAMESPACES.pop(namespace, None)
