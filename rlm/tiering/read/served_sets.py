"""The remote tier's index sets a reader may trust (docs/read-path.md "When the local remote index
is missing").

Readers walk a partition's local remote-index sets (rlm/logdir/index_sets.py). They are derived
files: lost with a disk, removed by hand, or being rebuilt by recovery, they may hold less than the
progress says was tiered — ``[remote log start, highest tiered]``, the ``remote`` range of
``valid_ranges``. The store is the shared truth: a reader whose local sets do not cover that range
answers from the store's chain instead (:class:`~rlm.tiering.store.remote_state.RemoteState`: the
manifests and each segment's uploaded entries, the sets the daemon would rebuild), so an offset the
store holds is never "out of range" and an answer is never silently shortened. When the store
cannot be read either, the error says why the local index could not answer.
"""

from __future__ import annotations

import copy
import itertools
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence

from rlm.errors import RlmError
from rlm.formats.indexes.remote_index import RemoteLogIndexEntry
from rlm.logdir.discovery import PartitionDir
from rlm.logdir.index_sets import SetView, views_of_entries
from rlm.nowait import may_wait
from rlm.storage.api import StorageBackend
from rlm.tiering.converge import lineage_in
from rlm.tiering.local import Progress, view_of
from rlm.tiering.store import Chain, RemoteState, StoreProtection, object_keys

__all__ = ["Claim", "StoreSets", "claim_of"]

log = logging.getLogger(__name__)

#: ``(remote log start, highest tiered offset)``, inclusive: what a progress says is remote.
Claim = tuple[int, int]

#: Legit gaps between two local sets remembered (a bound, not an LRU).
_MAX_GAPS = 4096

#: Partitions whose local sets were last found whole, remembered (a bound, not an LRU).
_MAX_WHOLE = 4096

#: Which claim of which partition's root: ``(partition directory, key id, claim)``.
_WholeKey = tuple[str, str | None, Claim]


def claim_of(progress: Progress) -> Claim | None:
    """The remote range ``progress`` claims, None when it claims nothing."""
    highest, start = progress.highest_tiered_offset, progress.remote_log_start_offset
    if highest < 0 or not 0 <= start <= highest:
        return None
    return start, highest


class StoreSets:
    """Shared by a process's readers: checks a partition's local sets against its progress and,
    when they fall short, builds the sets of the store's chain (one listing of the manifests, one
    read per manifest and per segment's entries), kept for the last ``max_partitions`` claims."""

    def __init__(
        self, backend: StorageBackend, protection: StoreProtection, *, max_partitions: int = 16
    ) -> None:
        self.backend = backend
        self.protection = protection
        self.max_partitions = max_partitions
        self._views: OrderedDict[tuple[str, str | None, Claim], list[SetView]] = OrderedDict()
        self._building: dict[tuple[str, str | None, Claim], threading.Lock] = {}
        self._gaps: set[tuple[str, str | None, int, int]] = set()
        # the local sets last found whole per claim: weak, so a set the SetCache dropped is not kept
        self._whole: dict[_WholeKey, tuple[weakref.ref[SetView], ...]] = {}
        self._lock = threading.Lock()

    def served(self, part: PartitionDir, progress: Progress, local: list[SetView]) -> list[SetView]:
        """``local`` when it covers what ``progress`` claims is remote, else the store's sets."""
        claim = claim_of(progress)
        root = view_of(part, progress)
        if claim is None or not root.servable:
            return local
        whole_key = (str(part.path), root.key_id, claim)
        if _same_views(self._whole.get(whole_key), local):
            return local  # the very views found whole for this claim (a catch-up's every Fetch)
        remote = RemoteState(self.backend, part.topic, part.partition, root.key_id, self.protection)
        why = self._shortfall(remote, local, claim)
        if why is not None:
            return self._from_store(remote, part, claim, why)
        with self._lock:
            if len(self._whole) >= _MAX_WHOLE:
                self._whole.clear()
            self._whole[whole_key] = tuple(weakref.ref(view) for view in local)
        return local

    # -- is the local index whole? --------------------------------------------------------------

    def _shortfall(self, remote: RemoteState, views: Sequence[SetView], claim: Claim) -> str | None:
        """Why ``views`` do not serve every offset of ``claim`` (None: they do)."""
        start, highest = claim
        if not views:
            return "has no set"
        first, last = views[0].first, views[-1].last
        if first is None or last is None:
            return "has a set without entries"
        if last.entry.last_offset < highest:
            return f"ends at offset {last.entry.last_offset}, below the highest tiered offset {highest}"
        base = self._segment_base(remote, first.entry)
        if first.entry.first_offset > start and (base is None or base > start):
            return f"starts at offset {first.entry.first_offset}, above the remote log start {start}"
        for prev, nxt in itertools.pairwise(views):
            if prev.last is None or nxt.first is None:
                return "has a set without entries"
            a, b = prev.last.entry, nxt.first.entry
            if b.first_offset > a.last_offset + 1 and not self._no_segment_between(remote, a, b):
                return f"lacks offsets {a.last_offset + 1}-{b.first_offset - 1} between two of its sets"
        return None

    def _segment_base(self, remote: RemoteState, entry: RemoteLogIndexEntry) -> int | None:
        """The base offset of the segment whose object ``entry`` reads (None: not this root's)."""
        try:
            key = self.backend.key_for_url(entry.rdi.url)
        except RlmError:
            return None
        ref = object_keys.parse_data_key(remote.topic, remote.partition, key, remote.key_id)
        return None if ref is None else ref.base_offset

    def _no_segment_between(
        self, remote: RemoteState, a: RemoteLogIndexEntry, b: RemoteLogIndexEntry
    ) -> bool:
        """Whether the offsets between two sets (``a`` ends one, ``b`` starts the next) are a
        compaction gap rather than missing segments: the same segment, a next segment starting
        right after ``a``, or no manifest based between them (one listing; remembered)."""
        base_a, base_b = self._segment_base(remote, a), self._segment_base(remote, b)
        if base_b is None:
            return False
        if base_a == base_b or base_b <= a.last_offset + 1:
            return True
        gap = (
            object_keys.partition_prefix(remote.topic, remote.partition, remote.key_id),
            remote.key_id,
            a.last_offset,
            base_b,
        )
        if gap in self._gaps:
            return True
        may_wait("a listing of the store's manifests")
        bases = [base for base, _key in remote.manifest_keys(remote.list_manifests_prefix())]
        if any(a.last_offset < base < base_b for base in bases):
            return False
        with self._lock:
            if len(self._gaps) >= _MAX_GAPS:
                self._gaps.clear()
            self._gaps.add(gap)
        return True

    # -- the store's sets -----------------------------------------------------------------------

    def _from_store(self, remote: RemoteState, part: PartitionDir, claim: Claim, why: str) -> list[SetView]:
        key = (str(part.path), remote.key_id, claim)
        with self._lock:
            hit = self._views.get(key)
            if hit is not None:
                self._views.move_to_end(key)
                return hit
            building = self._building.setdefault(key, threading.Lock())
        may_wait("the store's index sets")
        with building:  # concurrent readers of one partition build its sets once
            with self._lock:
                hit = self._views.get(key)
            if hit is not None:
                return hit
            try:
                chain = remote.chain(lineage_in(part.path))
                views = views_of_entries(_chain_entries(remote, chain))
            except RlmError as err:
                raise _explained(err, part, why) from err
            log.warning(
                "%s: the local remote index %s (tiered: [%d, %d]): answering from the store's %d "
                "segments until it is rebuilt (docs/read-path.md)",
                part.name,
                why,
                *claim,
                len(chain.links),
            )
            with self._lock:
                self._views[key] = views
                while len(self._views) > self.max_partitions:
                    self._views.popitem(last=False)
                self._building.pop(key, None)
        return views


def _same_views(known: tuple[weakref.ref[SetView], ...] | None, views: Sequence[SetView]) -> bool:
    """Whether ``views`` are the very (unchanged: a changed set is a new view) objects ``known``
    refers to. :meth:`StoreSets._shortfall` depends only on them, the claim and the root — and on
    the store only through gaps it remembers for good — so their verdict stands."""
    return (
        known is not None
        and len(known) == len(views)
        and all(ref() is view for ref, view in zip(known, views, strict=True))
    )


def _chain_entries(remote: RemoteState, chain: Chain) -> list[RemoteLogIndexEntry]:
    """Every link's entries in chain order, each above the last (as recovery indexes them,
    rlm.tiering.converge.sync.index_links)."""
    out: list[RemoteLogIndexEntry] = []
    floor = -1
    for link in chain.links:
        for entry in remote.link_entries(link):
            if entry.first_offset > floor:
                out.append(entry)
                floor = entry.last_offset
    return out


def _explained(err: RlmError, part: PartitionDir, why: str) -> RlmError:
    """``err`` (same class: same HTTP status, exit code, Kafka error) saying what it interrupted."""
    clone = copy.copy(err)
    clone.reason = (
        f"{part.name}: the local remote index {why}, and the store could not answer instead "
        f"(`rlm rebuild-index` rebuilds it): {err.reason}"
    )
    return clone
