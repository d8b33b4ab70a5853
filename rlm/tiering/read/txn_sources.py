"""The segments a partition's transaction knowledge is read from (docs/transactions.md): one
:class:`TxnSource` per segment of either tier, and the per-process cache of facts about their
immutable bytes. :mod:`rlm.tiering.read.isolation` reads them.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from rlm.errors import ObjectNotFoundError
from rlm.logdir.discovery import SegmentFiles
from rlm.logdir.index_sets import SetView
from rlm.storage.api import StorageBackend
from rlm.tiering.read.remote_sets import object_ranges
from rlm.tiering.store import (
    TXN_INDEX_OBJECT,
    Link,
    RemoteState,
    SegmentManifest,
    StoreProtection,
    open_at_end,
    producer_snapshot_key,
)

__all__ = ["FACTS", "TxnSource", "local_sources", "plan_sources", "reader_sources", "remote_source"]

_CACHE_ENTRIES = 4096

_T = TypeVar("_T")


class _Lru:
    """A small thread-safe LRU of immutable facts about immutable bytes (keys say which bytes)."""

    def __init__(self, size: int) -> None:
        self._items: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._lock = threading.Lock()
        self.size = size

    def get(self, key: tuple[Any, ...], load: Callable[[], _T]) -> _T:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                hit: _T = self._items[key]
                return hit
        value = load()
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value


#: Facts about immutable bytes (keys say which bytes), shared by every partition of the process.
FACTS = _Lru(_CACHE_ENTRIES)


class _Newest:
    """One value per key — the newest version asked for — for at most ``size`` keys (LRU): a
    partition's remote sources, of which only the current version is asked for again."""

    def __init__(self, size: int) -> None:
        self._items: OrderedDict[str, tuple[Any, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.size = size

    def get(self, key: str, version: Any, load: Callable[[], _T]) -> _T:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None and hit[0] == version:
                self._items.move_to_end(key)
                found: _T = hit[1]
                return found
        value = load()
        with self._lock:
            self._items[key] = (version, value)
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value


#: Each partition's remote transaction sources (:func:`reader_sources`), by partition directory.
_REMOTE_SOURCES = _Newest(_CACHE_ENTRIES)


@dataclass(frozen=True, slots=True)
class TxnSource:
    """One segment's batches with offsets in ``[first_offset, last_offset]`` (inclusive).

    ``tier`` local: ``location`` is the ``.log`` path, ``txn_index`` the broker's ``.txnindex``
    path (None when absent). Remote: ``location`` is the log object's key; ``captured`` says its
    manifest has ``txn_index`` (then ``txn_index`` is the entries object's key, None for none).
    ``identity`` tells one version of the bytes from another (cache key).
    """

    first_offset: int
    last_offset: int
    tier: Literal["local", "remote"]
    location: str
    txn_index: str | None = None
    captured: bool = False
    identity: tuple[Any, ...] = ()
    #: Remote: the segment's manifest when it is protected (its objects are opened with it,
    #: docs/protection.md); None = stored as plaintext.
    manifest: SegmentManifest | None = None
    #: Kafka's producer-state snapshot of the state at ``first_offset`` (local: the ``.snapshot``
    #: path; remote: the ``producer_snapshot`` object key); None = none known.
    snapshot: str | None = None
    #: Remote: ``(producer id, first offset)`` of the transactions open after ``last_offset`` as
    #: the copy recorded them (manifest ``txn_index.open_at_end``); None = not recorded, or the
    #: source is cut before the segment's end.
    open_at_end: tuple[tuple[int, int], ...] | None = None

    @property
    def scanned(self) -> bool:
        """Whether its aborted transactions come from scanning its batches."""
        return self.txn_index is None and not (self.tier == "remote" and self.captured)


def local_sources(
    segments: Sequence[SegmentFiles], visible_end: int, from_offset: int = 0
) -> list[TxnSource]:
    """Sources for the local segments holding offsets in ``[from_offset, visible_end)``."""
    out: list[TxnSource] = []
    for n, seg in enumerate(segments):
        last = (segments[n + 1].base_offset if n + 1 < len(segments) else visible_end) - 1
        last = min(last, visible_end - 1)
        if seg.base_offset >= visible_end or last < from_offset or last < seg.base_offset:
            continue
        try:
            st = seg.log.stat()
        except FileNotFoundError:
            continue
        out.append(
            TxnSource(
                seg.base_offset,
                last,
                "local",
                str(seg.log),
                str(seg.txn_index) if seg.txn_index is not None else None,
                identity=(st.st_ino, st.st_size, st.st_mtime_ns),
                snapshot=str(seg.snapshot) if seg.snapshot is not None else None,
            )
        )
    return out


def remote_source(
    first: int,
    last: int,
    key: str,
    identity: tuple[Any, ...],
    manifest: SegmentManifest | None,
    committed: bool = True,
) -> TxnSource:
    """The source of the remote log object ``key`` with offsets ``[first, last]``, from the
    segment's manifest (None: gone). ``committed`` False: the manifest commits another attempt,
    so nothing is known of this object but its bytes (scanned; opened with the manifest when
    it is protected)."""
    if manifest is None or not committed:
        protected = manifest if manifest is not None and manifest.protection is not None else None
        return TxnSource(first, last, "remote", key, identity=identity, manifest=protected)
    stored = manifest.objects.get(TXN_INDEX_OBJECT)
    return TxnSource(
        first,
        last,
        "remote",
        key,
        stored.key if stored is not None else None,
        manifest.txn_index is not None,
        identity,
        manifest if manifest.protection is not None else None,
        producer_snapshot_key(manifest, first),
        open_at_end(manifest) if last == manifest.last_offset else None,
    )


def plan_sources(
    links: Sequence[Link], segments: Sequence[SegmentFiles], visible_end: int, local_start: int | None
) -> list[TxnSource]:
    """The sources of a read plan (rlm.jobs.reading.plan): the chain's links below the local log start
    (their manifests say what was captured), then the local segments — the same split as a
    reader's (:func:`reader_sources`), so the last stable offset is replayed over the same batches."""
    below = min(visible_end, local_start if local_start is not None else visible_end)
    sources = [
        remote_source(
            lk.first_offset,
            min(lk.last_offset, below - 1),
            lk.manifest.log.key,
            (lk.manifest.log.key,),
            lk.manifest,
        )
        for lk in links
        if lk.first_offset < below
    ]
    return sources + local_sources(segments, visible_end, local_start or 0)


def reader_sources(
    where: str,
    views: Sequence[SetView],
    segments: Sequence[SegmentFiles],
    end: int,
    local_start: int | None,
    backend: StorageBackend,
    protection: StoreProtection,
) -> list[TxnSource]:
    """The sources a partition reader serves up to the visible ``end``: the remote objects of its
    index sets below the local log start ``local_start`` (each with the segment's manifest, read
    once per process), then the local ``segments`` (the listing its offsets came from). ``where``:
    the partition directory, naming its sets in the per-process cache of their walks.

    The remote part is remembered per partition for the current version of its sets and
    ``below`` (only that one is asked for again): every Fetch of a read_uncommitted consumer asks
    for the last stable offset, and building one source per tiered segment each time made a
    catch-up's fetches cost O(tiered segments) (0.9 of 2 ms per 1 MiB fetch over 48 segments);
    each source's manifest was remembered already (``("manifest", url)``), so a version's list is
    what those facts build, once."""
    below = min(end, local_start if local_start is not None else end)
    version = (tuple(_version(where, view) for view in views), below)
    remote: list[TxnSource] = _REMOTE_SOURCES.get(
        where, version, functools.partial(_remote_sources, where, views, below, backend, protection)
    )
    return remote + local_sources(segments, end, local_start or 0)


def _remote_sources(
    where: str, views: Sequence[SetView], below: int, backend: StorageBackend, protection: StoreProtection
) -> list[TxnSource]:
    sources: list[TxnSource] = []
    for url, first, last in _objects(where, views):
        if first >= below:
            continue
        key = backend.key_for_url(url)
        manifest, committed = FACTS.get(
            ("manifest", url), functools.partial(_manifest_of, backend, protection, key)
        )
        sources.append(remote_source(first, min(last, below - 1), key, (url,), manifest, committed))
    return sources


def _manifest_of(
    backend: StorageBackend, protection: StoreProtection, key: str
) -> tuple[SegmentManifest | None, bool]:
    """The manifest of the segment holding the log object ``key``, read through the store's one
    reader (None when gone: deleted by retention meanwhile, what is still readable is scanned),
    and whether it commits that object's attempt. A manifest not to be trusted raises
    (docs/protection.md §9)."""
    found = RemoteState.of_data_key(backend, key, protection)
    if found is None:
        return None, False
    state, ref = found
    try:
        manifest = state.manifest_at(ref.base_offset)
    except ObjectNotFoundError:
        return None, False
    return manifest, manifest.attempt_id == ref.attempt_id


def _objects(where: str, views: Sequence[SetView]) -> list[tuple[str, int, int]]:
    """:func:`object_ranges` of ``views``, each set's walk remembered while it is unchanged (its
    entries only grow: the entry count and the last object tell a version)."""
    out: list[tuple[str, int, int]] = []
    for view in views:
        out += FACTS.get(_version(where, view), functools.partial(object_ranges, [view]))
    return out


def _version(where: str, view: SetView) -> tuple[str, str, int, int, str]:
    """Which version of a set ``view`` is: its entries only grow, so the entry count and the last
    object tell one from another."""
    last = view.last.entry.rdi.url if view.last is not None else ""
    return ("objects", where, view.base_offset, len(view.log_index), last)
