"""Base class for backends that wrap another one (retries, fault injection, request counting).

A wrapper adds behaviour, not a store: it passes every call through to ``inner`` unless it
overrides it, and it names objects by the inner store's URLs, so RDIs written through a wrapper
resolve without it (and ``close`` closes the inner store).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, BinaryIO

from rlm.storage.api import Capabilities, ListPage, ObjectInfo, StorageBackend

if TYPE_CHECKING:
    from rlm.storage.retry_policy import RetryPolicy

__all__ = ["WrappingBackend"]


class WrappingBackend(StorageBackend):
    """Delegates everything to ``self.inner``; subclasses override the operations they change."""

    inner: StorageBackend

    def close(self) -> None:
        self.inner.close()

    def retry_options(self) -> dict[str, Any]:
        return self.inner.retry_options()  # the store's policy, whatever wraps it

    def use_retry_policy(self, policy: RetryPolicy) -> None:
        self.inner.use_retry_policy(policy)

    def url(self, key: str) -> str:
        return self.inner.url(key)

    def key_for_url(self, url: str) -> str:
        return self.inner.key_for_url(url)

    @property
    def capabilities(self) -> Capabilities:
        return self.inner.capabilities

    def _put(self, key: str, stream: BinaryIO, if_absent: bool) -> ObjectInfo:
        return self.inner.put(key, stream, if_absent=if_absent)

    def _read(self, key: str, start: int, end: int | None) -> bytes:
        return self.inner.read(key, start, end)

    def _head(self, key: str) -> ObjectInfo:
        return self.inner.head(key)

    def _list_page(self, prefix: str, start_after: str | None, limit: int) -> ListPage:
        return self.inner.list_page(prefix, token=start_after, limit=limit)

    def _delete(self, key: str) -> None:
        self.inner.delete(key)
