"""The segments a partition's transaction knowledge is read from (docs/transactions.md): one
:class:`TxnSource` per segment of either tier, and the per-process cache of facts about their
immutable bytes. :mod:`rlm.tiering.read.isolation` reads them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from rlm.logdir.scan import SegmentFiles
from rlm.tiering.store import TXN_INDEX_OBJECT, Link, SegmentManifest, open_at_end, snapshot_key

__all__ = ["FACTS", "TxnSource", "local_sources", "plan_sources"]

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


def plan_sources(
    links: Sequence[Link], segments: Sequence[SegmentFiles], visible_end: int, local_start: int | None
) -> list[TxnSource]:
    """The sources of a read plan (rlm.jobs.plan): the chain's links below the local log start
    (their manifests say what was captured), then the local segments — the same split as a
    reader's, so the last stable offset is replayed over the same local batches."""
    sources: list[TxnSource] = []
    below = min(visible_end, local_start if local_start is not None else visible_end)
    for link in links:
        m = link.manifest
        if link.first_offset >= below:
            continue
        stored = m.objects.get(TXN_INDEX_OBJECT)
        last = min(link.last_offset, below - 1)
        sources.append(
            TxnSource(
                link.first_offset,
                last,
                "remote",
                m.log.key,
                stored.key if stored is not None else None,
                m.txn_index is not None,
                (m.log.key,),
                m if m.protection is not None else None,
                snapshot_key(m, link.first_offset),
                open_at_end(m) if last == m.last_offset else None,
            )
        )
    return sources + local_sources(segments, visible_end, local_start or 0)
