"""A partition directory's listing, listed again only when the directory changed (docs/read-path.md).

Every Fetch, lookup and ListOffsets asks which segments a partition has. Listing the directory
and ``stat``-ing every ``.log`` in it made that cost grow with the local segments *and* with the
files the broker's retention has renamed to ``.deleted`` and not yet removed (one minute by
default): a catch-up beside a broker that had just cut 48 segments spent a sixth of the Kafka
listener's time per Fetch in ``listdir`` (BENCHMARKS.md, 2026-12-01).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from rlm.fsutil import FileMemo
from rlm.logdir.discovery import SegmentFiles, list_names, list_segments

__all__ = ["Listing", "ListingCache"]


class Listing(NamedTuple):
    """One listing of a partition directory: its names (what the remote-index sets are found
    from) and its segments in base-offset order, the last one active. Shared: never mutated."""

    names: list[str]
    segments: Sequence[SegmentFiles]


class ListingCache:
    """Partition directories' listings, each kept while the directory's ``stat`` signature
    (inode, size, mtime in ns) is unchanged: a :class:`~rlm.fsutil.FileMemo` of the directory.

    A directory's mtime moves with every entry created, removed or renamed in it — a roll, a
    retention or compaction rename, a truncation's deletions, rlm's own index files — and with
    nothing else. So on a hit only the last segment, the one the broker appends to, is
    ``stat``-ed again for its size: every other segment's ``.log`` changes size only together with
    a change of the entries (Kafka truncates a rolled segment only after deleting the segments
    above it, which makes it the last). As for every signature the memo trusts, a listing is kept
    only when the directory had settled (:func:`~rlm.fsutil.settled`) before it was listed: a
    change in the same timestamp tick cannot hide behind an unchanged mtime. At most
    ``max_entries`` directories are kept (then it starts over). Thread-safe.
    """

    def __init__(self, max_entries: int = 65_536) -> None:
        self._memo: FileMemo[Listing] = FileMemo(_listing, max_entries)

    def get(self, directory: Path) -> Listing:
        """The listing of ``directory`` as it is now."""
        current = _with_active_size(self._memo.get(directory))
        return current if current is not None else _listing(directory)


def _listing(directory: Path) -> Listing:
    """One listing: the names, and the segments derived from them."""
    names = list_names(directory)
    return Listing(names, list_segments(directory, names=names))


def _with_active_size(kept: Listing) -> Listing | None:
    """``kept`` with its last segment's size as it is now; None when that ``.log`` is gone (the
    caller lists again)."""
    if not kept.segments:
        return kept
    active = kept.segments[-1]
    try:
        size = os.stat(active.log).st_size
    except FileNotFoundError:
        return None
    if size == active.size:
        return kept
    return Listing(kept.names, [*kept.segments[:-1], dataclasses.replace(active, size=size)])
