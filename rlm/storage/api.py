"""The storage backend contract (docs/storage.md): a small, synchronous object-store interface.

Keys
    ``/``-separated relative paths, e.g. ``"orders-3/00000000000000001000-ab12.log"``: non-empty, at
    most 1024 UTF-8 bytes, no leading/trailing ``/``, no empty, ``.`` or ``..`` component, no ``\\``
    or control characters, and the first component may not start with ``.rlm-`` (reserved for the
    temporary files of directory-based backends). See :func:`validate_key`.

Semantics every backend guarantees (checked by :mod:`rlm.testing.backend_suite`)
    * ``put`` publishes atomically: a reader sees the old object, no object, or the whole new one —
      never a prefix. Large objects are uploaded in parts where the store supports it.
    * ``put(..., if_absent=True)`` is "create only if absent": if the key exists it raises
      :class:`~rlm.errors.ObjectExistsError` and leaves the object untouched. It is atomic (exactly
      one of several racing creators wins) iff ``capabilities.conditional_create``; otherwise it is
      a best-effort check-then-write.
    * ``read(key, start, end)`` returns the half-open byte range ``[start, end)`` with Python slice
      clipping: ``end=None`` means "to the end", a range past EOF is clipped, an empty or fully
      past-EOF range returns ``b""``. A missing key raises :class:`~rlm.errors.ObjectNotFoundError`
      even for an empty range. Negative bounds or ``end < start`` raise :class:`ValueError`.
    * ``list_page`` returns keys that start with ``prefix`` (a plain string prefix, not a directory)
      in ascending key order (code point order = UTF-8 byte order, as S3), at most ``limit`` per page;
      ``next_token`` is ``None`` on the last page. :meth:`StorageBackend.list` iterates all pages.
    * ``delete`` is idempotent: deleting a missing key is not an error.
    * Every SDK/OS error is translated exactly once, inside the backend, into :mod:`rlm.errors`:
      :class:`~rlm.errors.TransientStorageError` for throttling, 5xx and timeouts (safe to retry),
      :class:`~rlm.errors.StorageError` otherwise. Credentials never appear in errors, ``repr`` or
      :meth:`StorageBackend.describe`.
    * A backend reports transient errors and never retries on its own (nor lets its SDK retry):
      retries are applied once, where the store is opened (:mod:`rlm.storage.retry`), under the
      policy the backend declares in :meth:`StorageBackend.retry_options`.
    * Every request (``put``, ``upload_file``, ``read``, ``head``, ``list_page``, ``delete``) first
      calls :func:`rlm.nowait.may_wait`: where waiting is refused (the Kafka listener's event loop,
      docs/kafka-listener.md §8) it raises :class:`BlockingIOError` before anything is sent, so no
      code path can make the loop wait on the store, whichever reader forgot its own check.

Construction
    ``Backend.from_options(mapping)`` validates the ``[remote.options]`` table (unknown keys are
    rejected) — see :mod:`rlm.storage.registry` for name → class resolution. A backend pickles as
    ``(class, options)`` and is rebuilt on unpickling, so it can be shipped to Spark executors.
"""

from __future__ import annotations

import io
import os
import re
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO, ClassVar, Self, cast

from rlm.nowait import may_wait
from rlm.storage.filestream import FileStream
from rlm.storage.options import Option, parse_options, redact

if TYPE_CHECKING:
    from rlm.storage.retry_policy import RetryPolicy

__all__ = [
    "MAX_KEY_BYTES",
    "MAX_LIST_LIMIT",
    "RESERVED_PREFIX",
    "Capabilities",
    "Data",
    "ListPage",
    "ObjectInfo",
    "StorageBackend",
    "as_stream",
    "check_range",
    "page_from_sorted",
    "read_fully",
    "validate_key",
    "validate_prefix",
]

#: Top-level key components starting with this are reserved for backend internals.
RESERVED_PREFIX = ".rlm-"
MAX_KEY_BYTES = 1024
# A backslash or a control character (below 32, or DEL): one regex search, not a Python loop over
# the key's characters (every put, get and read validates its key).
_REFUSED_CHAR = re.compile(r"[\x00-\x1f\x7f\\]")
_REFUSED_PARTS = frozenset(("", ".", ".."))
MAX_LIST_LIMIT = 1000

Data = bytes | bytearray | memoryview | BinaryIO


@dataclass(frozen=True)
class ObjectInfo:
    """Metadata of one stored object. ``etag`` is store-specific (an MD5 hex for memory/local-less
    stores, S3's ETag without quotes), ``None`` when the store has none; ``last_modified`` is epoch
    seconds when known."""

    key: str
    size: int
    etag: str | None = None
    last_modified: float | None = None


@dataclass(frozen=True)
class ListPage:
    """One page of a listing. Pass ``next_token`` back to get the next page; ``None`` = done."""

    objects: tuple[ObjectInfo, ...]
    next_token: str | None

    @property
    def keys(self) -> list[str]:
        return [o.key for o in self.objects]


@dataclass(frozen=True)
class Capabilities:
    """What a backend can promise beyond the base contract.

    conditional_create: ``put(if_absent=True)`` is atomic against concurrent creators.
    multipart: large uploads are split into parts (S3 multipart).
    consistent_listing: a completed ``put``/``delete`` is reflected by the next ``list``.
    atomic_publish: readers never observe a partially written object (true for all shipped backends).
    local_io: a request is a call into this machine's kernel or memory, not a network round trip
    (``local``, ``memory``). A small object then costs less put on the caller's thread than handed
    to another one: the copy puts a segment's companions one after another (#35).
    """

    conditional_create: bool
    multipart: bool = False
    consistent_listing: bool = True
    atomic_publish: bool = True
    local_io: bool = False


def validate_key(key: str) -> str:
    """Return ``key`` if it is a valid object key, else raise :class:`ValueError` (see module doc)."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"invalid object key {key!r}: must be a non-empty string")
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise ValueError(f"invalid object key {key[:60]!r}...: longer than {MAX_KEY_BYTES} bytes")
    if _REFUSED_CHAR.search(key):
        raise ValueError(f"invalid object key {key!r}: backslash or control character")
    parts = key.split("/")
    if not _REFUSED_PARTS.isdisjoint(parts):  # every layer of a put checks its key: kept cheap
        raise ValueError(f"invalid object key {key!r}: empty, '.' or '..' path component")
    if parts[0].startswith(RESERVED_PREFIX):
        raise ValueError(f"invalid object key {key!r}: {RESERVED_PREFIX!r}* is reserved")
    return key


def validate_prefix(prefix: str) -> str:
    """Return ``prefix`` if it can prefix valid keys (``""`` lists everything), else raise ValueError."""
    if not isinstance(prefix, str):
        raise ValueError(f"invalid prefix {prefix!r}: must be a string")
    if prefix == "":
        return prefix
    if prefix.startswith("/") or "\\" in prefix or "//" in prefix:
        raise ValueError(f"invalid prefix {prefix!r}")
    if any(p in (".", "..") for p in prefix.split("/")[:-1]):
        raise ValueError(f"invalid prefix {prefix!r}: '.' or '..' path component")
    return prefix


def check_range(start: int, end: int | None) -> None:
    """Validate a half-open range ``[start, end)``; raise :class:`ValueError` when malformed."""
    if start < 0 or (end is not None and end < start):
        raise ValueError(f"invalid byte range [{start}, {end}): need 0 <= start <= end")


def as_stream(data: Data) -> BinaryIO:
    """Wrap bytes-like ``data`` in a stream; return a stream unchanged."""
    if isinstance(data, bytes | bytearray | memoryview):
        return io.BytesIO(bytes(data))
    return data


def read_fully(stream: BinaryIO, n: int) -> bytes:
    """Read exactly ``n`` bytes, or fewer only at EOF (a raw stream's ``read`` may return less)."""
    buf = bytearray()
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


def _rebuild(cls: type[StorageBackend], options: dict[str, Any]) -> StorageBackend:
    return cls.from_options(options)


class StorageBackend(ABC):
    """Base class of every backend. Public methods validate arguments and delegate to ``_``-methods.

    Subclasses set ``name`` (the entry-point name) and ``OPTIONS`` (accepted options), implement the
    abstract ``_put/_read/_head/_list_page/_delete`` and ``capabilities``, and translate their own
    SDK/OS errors into :mod:`rlm.errors` exactly once.
    """

    name: ClassVar[str] = "abstract"
    OPTIONS: ClassVar[tuple[Option, ...]] = ()

    def __init__(self, **options: Any) -> None:
        #: Validated options with defaults filled in (may contain secrets: never log it).
        self.options: dict[str, Any] = parse_options(self.name, options, self.OPTIONS)

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None = None) -> Self:
        """Build from a ``[remote.options]`` mapping; unknown keys/bad values raise ConfigError."""
        return cls(**dict(options or {}))

    @classmethod
    def portable_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """``options`` meaning the same store in another process on another working directory (a
        Spark executor): relative paths resolved here. Default: unchanged (no path options)."""
        return dict(options)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), dict(self.options)))

    def retry_options(self) -> dict[str, Any]:
        """Keyword arguments of :class:`~rlm.storage.retry_policy.RetryPolicy` for this store (e.g.
        ``max_attempts``, ``base_delay``/``max_delay`` in seconds); ``{}`` = the policy's defaults."""
        return {}

    def use_retry_policy(self, policy: RetryPolicy) -> None:
        """Called by the retry layer wrapping this backend with its policy: a backend whose one
        call is several requests (S3 multipart) may retry those steps under that same policy
        object, never under one of its own. Default: ignored — unless the backend still defines
        the hook's name before 2026-11 (``adopt_retry_policy``), which is called, with a
        ``DeprecationWarning`` (docs/storage.md)."""
        legacy = getattr(self, "adopt_retry_policy", None)
        if legacy is not None:
            warnings.warn(
                f"{type(self).__name__}.adopt_retry_policy: the hook is use_retry_policy now",
                DeprecationWarning,
                stacklevel=2,
            )
            legacy(policy)

    def describe(self) -> dict[str, Any]:
        """The backend name and its options with secrets redacted — safe to log or show."""
        return {"backend": self.name, "options": redact(self.options, self.OPTIONS)}

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.describe()["options"].items() if v is not None)
        return f"{type(self).__name__}({opts})"

    def url(self, key: str) -> str:
        """A URL naming ``key`` in this store (used in RDIs: ``<url>#<byte position>``).

        Backends override it with their native form (``file:///root/key``, ``s3://bucket/prefix/key``).
        :meth:`key_for_url` is its inverse.
        """
        return f"{self.name}://{validate_key(key)}"

    def key_for_url(self, url: str) -> str:
        """The key a URL from :meth:`url` names; ValueError when the URL is not in this store."""
        root = self.url("x")[:-1]
        if not url.startswith(root):
            raise ValueError(f"{url!r} is not an object URL of this {self.name} store ({root}...)")
        return validate_key(url[len(root) :])

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections/threads. Idempotent."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    @abstractmethod
    def capabilities(self) -> Capabilities:
        """What this backend promises beyond the base contract."""

    # -- public API -----------------------------------------------------------------------------

    def put(self, key: str, data: Data, *, if_absent: bool = False) -> ObjectInfo:
        """Store ``data`` (bytes or a binary stream read to EOF) under ``key``, atomically.

        With ``if_absent=True`` raise :class:`~rlm.errors.ObjectExistsError` if ``key`` exists
        (atomic iff ``capabilities.conditional_create``). Returns the stored object's info.
        """
        may_wait("a store request")
        return self._put(validate_key(key), as_stream(data), if_absent)

    def upload_file(self, key: str, path: str | os.PathLike[str], *, if_absent: bool = False) -> ObjectInfo:
        """Upload the local file ``path`` to ``key`` (multipart when large); see :meth:`put`. The
        file is sent as a :class:`~rlm.storage.filestream.FileStream` (a backend uploading parts
        may read it by regions; a file shrinking meanwhile fails the upload)."""
        validate_key(key)
        may_wait("a store request")
        with FileStream(path) as f:
            return self._put(key, cast(BinaryIO, f), if_absent)

    def read(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Return bytes ``[start, end)`` of ``key`` (half-open, clipped to the object's size)."""
        check_range(start, end)
        may_wait("a store request")
        return self._read(validate_key(key), start, end)

    def read_at_most(self, key: str, limit: int, *, what: str = "the object") -> bytes:
        """The whole object ``key``, read as ``[0, limit + 1)``: one larger than ``limit`` bytes is a
        :class:`~rlm.errors.FormatError` naming ``what`` and the key, never buffered whole (a
        hostile bucket may serve anything under a key rlm reads)."""
        data = self.read(key, 0, limit + 1)
        if len(data) > limit:
            from rlm.errors import FormatError

            raise FormatError(f"{what} is larger than {limit} bytes: not what rlm wrote", file=key)
        return data

    def head(self, key: str) -> ObjectInfo:
        """Return the object's info or raise :class:`~rlm.errors.ObjectNotFoundError`."""
        may_wait("a store request")
        return self._head(validate_key(key))

    def exists(self, key: str) -> bool:
        """True iff ``key`` exists."""
        from rlm.errors import ObjectNotFoundError

        try:
            self.head(key)
        except ObjectNotFoundError:
            return False
        return True

    def list_page(
        self, prefix: str = "", *, token: str | None = None, limit: int = MAX_LIST_LIMIT
    ) -> ListPage:
        """One page (at most ``limit`` objects) of keys starting with ``prefix``, in key order.

        ``token`` is the ``next_token`` of the previous page (it is the last key returned, so a
        listing can also be resumed after any known key).
        """
        validate_prefix(prefix)
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise ValueError(f"limit must be between 1 and {MAX_LIST_LIMIT}, got {limit}")
        may_wait("a store request")
        return self._list_page(prefix, token, limit)

    def list(self, prefix: str = "", *, page_size: int = MAX_LIST_LIMIT) -> Iterator[ObjectInfo]:
        """Iterate every object whose key starts with ``prefix``, in key order, page by page."""
        token: str | None = None
        while True:
            page = self.list_page(prefix, token=token, limit=page_size)
            yield from page.objects
            if page.next_token is None:
                return
            token = page.next_token

    def delete(self, key: str) -> None:
        """Delete ``key``; a missing key is not an error (idempotent)."""
        may_wait("a store request")
        self._delete(validate_key(key))

    def delete_many(self, keys: Iterable[str]) -> None:
        """Delete every key (idempotent); backends may batch."""
        for key in keys:
            self.delete(key)

    # -- to implement ---------------------------------------------------------------------------

    @abstractmethod
    def _put(self, key: str, stream: BinaryIO, if_absent: bool) -> ObjectInfo: ...

    @abstractmethod
    def _read(self, key: str, start: int, end: int | None) -> bytes: ...

    @abstractmethod
    def _head(self, key: str) -> ObjectInfo: ...

    @abstractmethod
    def _list_page(self, prefix: str, start_after: str | None, limit: int) -> ListPage: ...

    @abstractmethod
    def _delete(self, key: str) -> None: ...


def page_from_sorted(infos: Iterable[ObjectInfo], limit: int) -> ListPage:
    """Build a page from infos already filtered and sorted, holding at most ``limit + 1`` items."""
    items = list(infos)
    if len(items) > limit:
        items = items[:limit]
        return ListPage(tuple(items), items[-1].key)
    return ListPage(tuple(items), None)
