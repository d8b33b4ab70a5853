"""Retries for transient storage failures, applied once, where the store is opened (docs/storage.md).

:class:`RetryingBackend` applies a :class:`~rlm.storage.retry_policy.RetryPolicy` (exponential
backoff with full jitter over :class:`~rlm.errors.TransientStorageError`) to every call of a backend.
The policy is a leaf, :mod:`rlm.storage.retry_policy`, so the backend contract can name it without
importing this wrapper; ``RetryPolicy`` and ``gave_up`` stay importable from here.

The one seam: :func:`with_retries` wraps a backend in a :class:`RetryingBackend` whose policy the
backend declares (:meth:`~rlm.storage.api.StorageBackend.retry_options`, e.g. the ``s3`` options
``max_attempts`` / ``retry_base_delay`` / ``retry_max_delay``); :func:`rlm.storage.registry.open_backend`
applies it to every store an rlm process opens. Backends report transient errors and never retry
themselves, and callers never wrap calls, so one request is attempted at most ``max_attempts``
times — never ``max_attempts`` squared. Wrappers that must see every attempt (request metering)
go *under* the retries: :func:`under_retries`.

Retrying a write whose acknowledgement was lost is safe for plain puts (same content again) but not
for "create only if absent": the retry finds the object that the lost attempt created and raises
:class:`~rlm.errors.ObjectExistsError`. :func:`put_if_absent_idempotent` resolves that by comparing
content: the same bytes under the key mean the earlier attempt won, so it is success (the object is
not written twice and no duplicate is ever visible); different bytes mean someone else won.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, BinaryIO, ClassVar

from rlm.errors import ObjectExistsError, TransientStorageError
from rlm.storage.api import Data, ListPage, ObjectInfo, StorageBackend, validate_key
from rlm.storage.retry_policy import RetryPolicy, gave_up
from rlm.storage.wrapper import WrappingBackend

__all__ = [
    "RetryPolicy",
    "RetryingBackend",
    "create_or_find_identical",
    "gave_up",
    "policy_for",
    "put_if_absent_idempotent",
    "same_content",
    "under_retries",
    "with_retries",
]

log = logging.getLogger(__name__)


def _rewinder(stream: BinaryIO) -> Callable[[], None]:
    """Return a callable that seeks ``stream`` back to its current position (ValueError if unseekable)."""
    try:
        pos = stream.tell() if stream.seekable() else None
    except (OSError, ValueError):
        pos = None

    def rewind() -> None:
        if pos is None:
            raise TransientStorageError("cannot retry an upload from a non-seekable stream")
        stream.seek(pos)

    return rewind


def same_content(backend: StorageBackend, key: str, data: bytes) -> bool:
    """True iff ``key`` holds exactly ``data`` (size first, then the bytes)."""
    info = backend.head(key)
    return info.size == len(data) and backend.read(key) == data


def put_if_absent_idempotent(
    backend: StorageBackend, key: str, data: bytes, policy: RetryPolicy | None = None
) -> ObjectInfo:
    """Create ``key`` with ``data`` only if absent, retrying transient errors, idempotently.

    Returns the object's info if ``key`` now holds ``data`` — whether this call created it or an
    earlier attempt whose acknowledgement was lost did. Raises ObjectExistsError if ``key`` holds
    different bytes (another writer won), TransientStorageError when retries are exhausted.
    Use for small objects such as manifests (the existing object is read back to compare).
    """
    policy = policy or RetryPolicy()
    validate_key(key)
    return policy.call(create_or_find_identical, backend, key, bytes(data))


def create_or_find_identical(backend: StorageBackend, key: str, data: bytes) -> ObjectInfo:
    """One attempt of :func:`put_if_absent_idempotent`: create ``key``, or find ``data`` already
    there (an earlier attempt whose acknowledgement was lost) and return its info."""
    try:
        return backend.put(key, data, if_absent=True)
    except ObjectExistsError:
        if same_content(backend, key, data):
            log.debug("conditional create of %r found identical content: an earlier attempt won", key)
            return backend.head(key)
        raise


class RetryingBackend(WrappingBackend):
    """Wrap ``inner`` so that every call is retried under ``policy``.

    Conditional creates go through the same content comparison as :func:`put_if_absent_idempotent`
    when the data is small enough to hold (bytes, or a seekable stream up to 16 MiB), so a retried
    create that finds its own lost-ack object succeeds. A put from a stream rewinds it to where it
    started before each retry (a non-seekable stream is not retried). Not an entry point:
    :func:`with_retries` builds it where the store is opened.
    """

    name: ClassVar[str] = "retrying"
    MAX_COMPARE = 16 << 20

    def __init__(self, inner: StorageBackend, policy: RetryPolicy | None = None) -> None:
        self.inner = inner
        self.policy = policy or RetryPolicy()
        self.options = {}
        inner.use_retry_policy(self.policy)  # multipart steps: the same policy, no second one

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "inner": self.inner.describe(),
            "max_attempts": self.policy.max_attempts,
        }

    def __repr__(self) -> str:
        return f"RetryingBackend({self.inner!r}, max_attempts={self.policy.max_attempts})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (RetryingBackend, (self.inner, self.policy))

    def put(self, key: str, data: Data, *, if_absent: bool = False) -> ObjectInfo:
        validate_key(key)
        small = self._comparable(data) if if_absent else None
        if small is not None:
            return put_if_absent_idempotent(self.inner, key, small, self.policy)
        return super().put(key, data, if_absent=if_absent)

    def _comparable(self, data: Data) -> bytes | None:
        """``data`` as bytes when a lost-ack create can be recognised by comparing content (bytes,
        or a seekable stream of at most ``MAX_COMPARE`` bytes); else None, the stream rewound."""
        if isinstance(data, bytes | bytearray | memoryview):
            return bytes(data)
        if not data.seekable():
            return None
        rewind = _rewinder(data)
        chunk = data.read(self.MAX_COMPARE + 1)
        if len(chunk) <= self.MAX_COMPARE:
            return chunk
        rewind()
        return None

    def _put(self, key: str, stream: BinaryIO, if_absent: bool) -> ObjectInfo:
        return self.policy.call(
            self.inner.put, key, stream, if_absent=if_absent, before_retry=_rewinder(stream)
        )

    def _read(self, key: str, start: int, end: int | None) -> bytes:
        return self.policy.call(self.inner.read, key, start, end)

    def _head(self, key: str) -> ObjectInfo:
        return self.policy.call(self.inner.head, key)

    def _list_page(self, prefix: str, start_after: str | None, limit: int) -> ListPage:
        return self.policy.call(self.inner.list_page, prefix, token=start_after, limit=limit)

    def _delete(self, key: str) -> None:
        self.policy.call(self.inner.delete, key)


def policy_for(backend: StorageBackend) -> RetryPolicy:
    """The policy ``backend`` declares (:meth:`~rlm.storage.api.StorageBackend.retry_options`)."""
    return RetryPolicy(**backend.retry_options())


def with_retries(backend: StorageBackend) -> RetryingBackend:
    """The seam: ``backend`` with every call retried under the policy it declares (module doc).
    A backend already wrapped is returned as is: one policy per request, never two."""
    if isinstance(backend, RetryingBackend):
        return backend
    return RetryingBackend(backend, policy_for(backend))


def under_retries(
    backend: StorageBackend, wrap: Callable[[StorageBackend], StorageBackend]
) -> StorageBackend:
    """``backend`` with ``wrap`` applied below its retries, so the wrapper sees every attempt
    (request metering: each attempt is a request the store bills). A new wrapper chain: the given
    one is not modified. Without retries (a backend built in code), ``wrap(backend)``."""
    if isinstance(backend, RetryingBackend):
        return RetryingBackend(wrap(backend.inner), backend.policy)
    return wrap(backend)
