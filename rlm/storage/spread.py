"""Key prefix spread: logical keys ↔ physical keys under a hash prefix (docs/key-spread.md).

Stores that throttle per key prefix (S3 scales request rate per prefix) serve a sidecar better
when keys do not all start alike. With ``[remote] prefix_spread = N`` (N hex digits, 1–4) every
key is stored under ``<bucket>/`` where ``<bucket>`` is the first N hex digits of
``sha256(<name>)`` and ``<name>`` is the key's first path component up to its first ``=``::

    logical   orders-3=AAAAAAAAAAAAAAAAAAAAAA/manifests/00000000000000001000.json
    physical  9f/orders-3=AAAAAAAAAAAAAAAAAAAAAA/manifests/00000000000000001000.json

For rlm's keys the name is ``<topic>-<partition>`` — the partition's name, not its topic id — so
every incarnation of a partition (``t-0/`` and ``t-0=<id>/`` roots, docs/topic-identity.md) shares
one bucket and one listing still finds them all. :class:`SpreadBackend` maps transparently, so
every caller above it (rlm/tiering/store/object_keys.py, remote_state, metering, the jobs) keeps using logical
keys; ``url`` gives the physical object's URL (what RDIs record) and ``key_for_url`` maps it back.

Listings: a prefix that names the partition (it contains ``/`` or ``=``, as every listing rlm makes
does) is one listing of one bucket. Any other prefix (``""``, ``"orders"``) merges the listings of
all 16^N buckets in key order, at least 16^N LIST requests per page — correct, but for tools, not
for hot paths.

The layout is a property of the store: :func:`check_layout` reads the root object
``rlm-layout.json`` (docs/formats.md §6.7) — ``{"format": "rlm-layout", "version": 1,
"prefix_spread": N, "hash": "sha256"}`` — and refuses a config that disagrees
(:class:`~rlm.errors.StoreLayoutError`). A store with objects but no layout object was written with
spread 0. Spread 0 never writes the object (stores stay as they were); N > 0 creates it, create-only,
on an empty store.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import logging
import os
import threading
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any, BinaryIO, ClassVar

from rlm.errors import (
    FormatError,
    ObjectExistsError,
    ObjectNotFoundError,
    RlmError,
    StorageError,
    StoreLayoutError,
)
from rlm.storage.api import MAX_LIST_LIMIT, ListPage, ObjectInfo, StorageBackend, validate_prefix
from rlm.storage.wrapper import WrappingBackend

__all__ = [
    "HASH",
    "LAYOUT_FORMAT",
    "LAYOUT_KEY",
    "LAYOUT_VERSION",
    "MAX_SPREAD",
    "MERGE_BUDGET",
    "PARKED_MERGES",
    "SpreadBackend",
    "all_buckets",
    "bucket",
    "check_layout",
    "layout_doc",
    "names_partition",
    "open_spread",
    "parse_layout",
    "spread_name",
]

log = logging.getLogger(__name__)

#: The root object recording the store's key layout (physical key: never spread).
LAYOUT_KEY = "rlm-layout.json"
LAYOUT_FORMAT = "rlm-layout"
LAYOUT_VERSION = 1
HASH = "sha256"
#: ``[remote] prefix_spread`` bounds: 0 = off; 4 hex digits = 65 536 buckets.
MAX_SPREAD = 4
#: Keys held in memory at once by a merged listing across all buckets (per-bucket page size =
#: this divided by the number of buckets, at least 1).
MERGE_BUDGET = 4096
#: Merged listings kept in progress between pages (:meth:`SpreadBackend._park`).
PARKED_MERGES = 8


def spread_name(key: str) -> str:
    """The part of ``key`` its bucket is derived from: the first component up to its first ``=``
    (for rlm's keys, ``<topic>-<partition>``)."""
    return key.split("/", 1)[0].partition("=")[0]


def bucket(name: str, digits: int) -> str:
    """The first ``digits`` lower-case hex digits of SHA-256 over ``name``'s UTF-8 bytes."""
    return hashlib.sha256(name.encode("utf-8")).hexdigest()[:digits]


def all_buckets(digits: int) -> list[str]:
    """Every bucket of a spread of ``digits`` hex digits, in key order."""
    return [f"{i:0{digits}x}" for i in range(16**digits)]


def names_partition(prefix: str) -> bool:
    """True when every key starting with ``prefix`` has the same :func:`spread_name`."""
    return "/" in prefix or "=" in prefix.split("/", 1)[0]


def layout_doc(digits: int) -> bytes:
    """The bytes of ``rlm-layout.json`` for a spread of ``digits``: UTF-8 JSON, keys sorted."""
    doc = {"format": LAYOUT_FORMAT, "version": LAYOUT_VERSION, "prefix_spread": digits, "hash": HASH}
    return json.dumps(doc, sort_keys=True).encode()


def parse_layout(data: bytes, where: str) -> int:
    """The ``prefix_spread`` a layout object records; FormatError names ``where`` when malformed."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as err:
        raise FormatError(f"{where}: malformed layout object: {err}") from None
    if not isinstance(doc, dict) or doc.get("format") != LAYOUT_FORMAT:
        raise FormatError(f"{where}: not an rlm layout object (field 'format' != {LAYOUT_FORMAT!r})")
    if doc.get("version") != LAYOUT_VERSION or doc.get("hash") != HASH:
        raise FormatError(
            f"{where}: layout version {doc.get('version')!r} / hash {doc.get('hash')!r} "
            f"is not supported by this rlm (version {LAYOUT_VERSION}, hash {HASH!r})"
        )
    spread = doc.get("prefix_spread")
    if not isinstance(spread, int) or isinstance(spread, bool) or not 0 <= spread <= MAX_SPREAD:
        raise FormatError(f"{where}: field 'prefix_spread' = {spread!r} is not an integer 0-{MAX_SPREAD}")
    return spread


def _refuse(store: StorageBackend, configured: int, recorded: int, why: str) -> StoreLayoutError:
    return StoreLayoutError(
        f"config key remote.prefix_spread = {configured} does not match the store: {why} "
        f"prefix_spread = {recorded} ({store.url(LAYOUT_KEY)}); set remote.prefix_spread = {recorded} "
        "(docs/key-spread.md)"
    )


def check_layout(store: StorageBackend, digits: int) -> None:
    """Check that ``store`` (the physical, unwrapped backend) was written with ``digits``; record
    it on an empty store when ``digits`` > 0. Raises StoreLayoutError on a mismatch; store errors
    (TransientStorageError included) propagate. Requests: one GET; with N > 0 on a store without
    the object, one LIST and one conditional PUT more."""
    try:
        recorded = parse_layout(store.read(LAYOUT_KEY), store.url(LAYOUT_KEY))
    except ObjectNotFoundError:
        recorded = None
    if recorded is not None:
        if recorded != digits:
            raise _refuse(store, digits, recorded, "its layout object records")
        return
    if digits == 0:
        return
    first = store.list_page("", limit=1).objects
    if first:
        raise _refuse(store, digits, 0, f"it holds objects ({first[0].key}) but no {LAYOUT_KEY}, i.e.")
    try:
        store.put(LAYOUT_KEY, layout_doc(digits), if_absent=True)
    except ObjectExistsError:  # another sidecar initialised it first: agree with it or refuse
        check_layout(store, digits)


class SpreadBackend(WrappingBackend):
    """``inner`` with every key under its hash bucket (module doc); ``digits`` 0 maps nothing but
    still checks the layout. Until :meth:`verify` has succeeded, every call first runs it (a
    store unreachable at start is checked on its first answer)."""

    name: ClassVar[str] = "spread"

    def __init__(self, inner: StorageBackend, digits: int, *, verified: bool = False) -> None:
        if not 0 <= digits <= MAX_SPREAD:
            raise ValueError(f"prefix_spread must be 0-{MAX_SPREAD}, got {digits}")
        self.inner = inner
        self.digits = digits
        self.options = {}
        self._verified = verified
        self._refused: RlmError | None = None  # a mismatch or malformed layout: permanent
        self._lock = threading.Lock()
        self._parked: OrderedDict[tuple[str, str], Iterator[ObjectInfo]] = OrderedDict()

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt on executors from a driver that checked the layout already.
        return (_rebuild_spread, (self.inner, self.digits))

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "options": {"prefix_spread": self.digits},
            "inner": self.inner.describe(),
        }

    def __repr__(self) -> str:
        return f"SpreadBackend({self.inner!r}, prefix_spread={self.digits})"

    def verify(self) -> None:
        """Run :func:`check_layout` once (thread-safe); later calls return at once."""
        if self._verified:
            return
        with self._lock:
            if self._refused is not None:
                raise self._refused
            if not self._verified:
                try:
                    check_layout(self.inner, self.digits)
                except (StoreLayoutError, FormatError) as err:
                    self._refused = err
                    raise
                self._verified = True

    # -- key mapping -----------------------------------------------------------------------------

    def physical(self, key: str) -> str:
        """The stored key of logical ``key``."""
        return f"{bucket(spread_name(key), self.digits)}/{key}" if self.digits else key

    def logical(self, key: str) -> str:
        """The logical key of stored ``key``; ValueError when it is not under its own bucket."""
        if not self.digits:
            return key
        if not self.owns(key):
            raise ValueError(
                f"stored key {key!r} is not under its prefix_spread = {self.digits} "
                "hash prefix (docs/key-spread.md)"
            )
        return key.partition("/")[2]

    def owns(self, key: str) -> bool:
        """True when stored ``key`` lies under its own hash prefix (:meth:`logical` accepts it)."""
        head, slash, rest = key.partition("/")
        return not self.digits or (bool(slash) and head == bucket(spread_name(rest), self.digits))

    def _info(self, info: ObjectInfo) -> ObjectInfo:
        return replace(info, key=self.logical(info.key))

    def url(self, key: str) -> str:
        return self.inner.url(self.physical(key))

    def key_for_url(self, url: str) -> str:
        return self.logical(self.inner.key_for_url(url))

    # -- operations ------------------------------------------------------------------------------

    def _put(self, key: str, stream: BinaryIO, if_absent: bool) -> ObjectInfo:
        self.verify()
        return self._info(self.inner.put(self.physical(key), stream, if_absent=if_absent))

    def upload_file(self, key: str, path: str | os.PathLike[str], *, if_absent: bool = False) -> ObjectInfo:
        self.verify()
        return self._info(self.inner.upload_file(self.physical(key), path, if_absent=if_absent))

    def _read(self, key: str, start: int, end: int | None) -> bytes:
        self.verify()
        return self.inner.read(self.physical(key), start, end)

    def _head(self, key: str) -> ObjectInfo:
        self.verify()
        return self._info(self.inner.head(self.physical(key)))

    def _delete(self, key: str) -> None:
        self.verify()
        self.inner.delete(self.physical(key))

    def delete_many(self, keys: Iterable[str]) -> None:
        self.verify()
        self.inner.delete_many([self.physical(k) for k in keys])

    def _list_page(self, prefix: str, start_after: str | None, limit: int) -> ListPage:
        self.verify()
        if not self.digits:
            return self.inner.list_page(prefix, token=start_after, limit=limit)
        if names_partition(prefix):
            # One bucket; resuming after a key of another bucket still means "keys > start_after".
            head = bucket(spread_name(prefix), self.digits)
            page = self.inner.list_page(
                f"{head}/{prefix}",
                limit=limit,
                token=None if start_after is None else f"{head}/{start_after}",
            )
            objects = tuple(self._info(o) for o in page.objects)
            token = None if page.next_token is None else self.logical(page.next_token)
            return ListPage(objects, token)
        merged = self._resume(prefix, start_after) or self._merged(prefix, start_after, limit)
        items = list(itertools.islice(merged, limit + 1))
        if len(items) > limit:
            token = items[limit - 1].key
            self._park(prefix, token, itertools.chain([items[limit]], merged))
            return ListPage(tuple(items[:limit]), token)
        return ListPage(tuple(items), None)

    def _park(self, prefix: str, token: str, merge: Iterator[ObjectInfo]) -> None:
        """Keep a merge in progress for the page that will ask for ``token``: a caller paging
        through ``list_page`` (every wrapper above this one does) then costs one merge, not one
        merge of 16^N listings per page. At most :data:`PARKED_MERGES` are kept."""
        with self._lock:
            self._parked[(prefix, token)] = merge
            while len(self._parked) > PARKED_MERGES:
                self._parked.popitem(last=False)

    def _resume(self, prefix: str, start_after: str | None) -> Iterator[ObjectInfo] | None:
        if start_after is None:
            return None
        with self._lock:
            return self._parked.pop((prefix, start_after), None)

    def list(self, prefix: str = "", *, page_size: int = MAX_LIST_LIMIT) -> Iterator[ObjectInfo]:
        """As the contract; a prefix that does not name a partition is one merge over all buckets
        (not restarted per page)."""
        if not self.digits or names_partition(prefix):
            return super().list(prefix, page_size=page_size)
        validate_prefix(prefix)
        if not 1 <= page_size <= MAX_LIST_LIMIT:
            raise ValueError(f"page_size must be between 1 and {MAX_LIST_LIMIT}, got {page_size}")
        self.verify()
        return self._merged(prefix, None, page_size)

    def _merged(self, prefix: str, start_after: str | None, limit: int) -> Iterator[ObjectInfo]:
        """Every object under logical ``prefix`` after ``start_after``, in key order: a heap merge
        of one lazily paged listing per bucket."""
        buckets = all_buckets(self.digits)
        per = max(1, min(limit, MERGE_BUDGET // len(buckets)))
        cursors = [_Cursor(self, b, prefix, start_after, per) for b in buckets]
        heap: list[tuple[str, int]] = []
        for i, cursor in enumerate(cursors):
            if cursor.peek() is not None:
                heap.append((cursor.key(), i))
        heapq.heapify(heap)
        while heap:
            _, i = heapq.heappop(heap)
            info = cursors[i].pop()
            yield info
            if cursors[i].peek() is not None:
                heapq.heappush(heap, (cursors[i].key(), i))


class _Cursor:
    """One bucket's listing under a logical prefix, fetched a page of ``per`` objects at a time."""

    def __init__(
        self, spread: SpreadBackend, bucket_name: str, prefix: str, start_after: str | None, per: int
    ) -> None:
        self.spread, self.per = spread, per
        self.prefix = f"{bucket_name}/{prefix}"
        self.token: str | None = None if start_after is None else f"{bucket_name}/{start_after}"
        self.page: deque[ObjectInfo] = deque()
        self.done = False

    def peek(self) -> ObjectInfo | None:
        while not self.page and not self.done:
            page = self.spread.inner.list_page(self.prefix, token=self.token, limit=self.per)
            # A stored key under the wrong hash prefix names no logical key of this store (only a
            # foreign writer leaves one): left out, as the tiering layer ignores foreign keys.
            self.page.extend(self.spread._info(o) for o in page.objects if self.spread.owns(o.key))
            self.token = page.next_token
            self.done = page.next_token is None
        return self.page[0] if self.page else None

    def key(self) -> str:
        return self.page[0].key

    def pop(self) -> ObjectInfo:
        return self.page.popleft()


def _rebuild_spread(inner: StorageBackend, digits: int) -> SpreadBackend:
    return SpreadBackend(inner, digits, verified=True)


def open_spread(inner: StorageBackend, digits: int, *, wait_s: float | None = None) -> StorageBackend:
    """``inner`` as ``[remote] prefix_spread = digits`` configures it, its layout checked now.

    A mismatch raises StoreLayoutError (a malformed layout object FormatError). A store that does
    not answer (any StorageError) or has not answered within ``wait_s`` seconds (None = wait; the
    CLI passes ``remote.unreachable_after_ms``) does not stop the process: the check finishes in
    the background or runs again before the first store call, and a mismatch found then fails
    every call. Spread 0 on a checked store returns ``inner`` itself (no wrapper, no cost)."""
    spread = SpreadBackend(inner, digits)
    outcome: list[BaseException] = []
    done = threading.Event()

    def check() -> None:
        try:
            spread.verify()
        except BaseException as err:  # handed to the opening thread, which decides
            outcome.append(err)
        finally:
            done.set()

    threading.Thread(target=check, name="rlm-layout-check", daemon=True).start()
    if not done.wait(wait_s):
        log.info(
            "store layout (remote.prefix_spread) not checked yet: no answer within %.1f s; "
            "checked before the first store call",
            wait_s or 0.0,
        )
        return spread
    if outcome:
        err = outcome[0]
        if isinstance(err, StoreLayoutError) or not isinstance(err, StorageError):
            raise err
        log.info(
            "store layout (remote.prefix_spread) not checked yet, the store did not answer: "
            "%s; checked before the first store call",
            err,
        )
        return spread
    return spread if digits else inner
