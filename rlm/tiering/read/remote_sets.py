"""Walks over a partition's local remote-index sets as lookups read them (docs/formats.md §8): the
store's chain across sets (:func:`chain_from`), the remote objects they index
(:func:`object_ranges`) and the max timestamp of a range. The sets
themselves are read by rlm/logdir/index_sets.py (``SetCache`` → ``SetView``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from rlm.formats.indexes.remote_index import DecodedEntry
from rlm.formats.records import Buffer, RecordBatch
from rlm.logdir.index_sets import SetView
from rlm.tiering.read.max_timestamp import batches_max_timestamp


def chain_from(views: Sequence[SetView], offset: int) -> Iterator[DecodedEntry]:
    """The remote entries from the one holding ``offset`` (or the first after it) on, in the local
    sets' order — the store's chain (docs/cluster.md) — across entries, objects and sets; an entry
    whose offsets all lie below what was already yielded is skipped (never read twice)."""
    floor = offset
    for view in views:
        if view.last is None or view.last.entry.last_offset < floor:
            continue
        begin = view.find_entry(floor) or view.first
        if begin is None:
            continue
        for entry in view.entries_from(begin):
            if entry.entry.last_offset < floor:
                continue
            yield entry
            floor = entry.entry.last_offset + 1


def remote_max_timestamp(
    views: Sequence[SetView],
    start: int,
    end: int,
    entry_batches: Callable[[DecodedEntry], tuple[Buffer, list[RecordBatch]]],
) -> int | None:
    """The max record timestamp (ms) among the remote offsets in ``[start, end)``: a set wholly
    inside answers from its time index's running max, entries wholly inside from their
    ``last_timestamp``, boundary entries are read (``entry_batches``) and decoded record by record."""
    best: int | None = None
    for view in views:
        if view.first is None or view.last is None or view.last.entry.last_offset < start:
            continue
        if view.first.entry.first_offset >= end:
            break
        candidates: list[int | None] = []
        if view.first.entry.first_offset >= start and view.last.entry.last_offset < end and view.times:
            candidates.append(view.times[len(view.times) - 1].timestamp)  # the set's running max
        else:  # a boundary set: entries wholly inside by their max, boundary ones decoded
            for current in view.entries_from(view.first):
                e = current.entry
                if e.first_offset >= end:
                    break
                if e.last_offset < start:
                    continue
                if e.first_offset >= start and e.last_offset < end:
                    candidates.append(e.last_timestamp)
                    continue
                data, batches = entry_batches(current)
                candidates.append(batches_max_timestamp(data, batches, start, end))
        for ts in candidates:
            if ts is not None:
                best = ts if best is None else max(best, ts)
    return best


def object_ranges(views: Sequence[SetView]) -> list[tuple[str, int, int]]:
    """``(object url, first offset, last offset)`` of every remote log object the sets index, in
    their order (consecutive entries of one object merged)."""
    out: list[tuple[str, int, int]] = []
    for view in views:
        current = view.first
        while current is not None:
            e = current.entry
            if out and out[-1][0] == e.rdi.url:
                out[-1] = (e.rdi.url, out[-1][1], e.last_offset)
            else:
                out.append((e.rdi.url, e.first_offset, e.last_offset))
            current = view.entry_after(current)
    return out


__all__ = ["chain_from", "object_ranges", "remote_max_timestamp"]
