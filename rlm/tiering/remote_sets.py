"""The local remote-index sets of a partition as lookups read them (docs/formats.md §8), parsed once per
file version: readers never write, so a set being appended by the daemon is read up to its last
whole entry (a torn tail is simply not visible yet)."""

from __future__ import annotations

import mmap
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rlm.formats import naming
from rlm.formats.offset_index import OffsetIndex
from rlm.formats.records import Buffer, RecordBatch
from rlm.formats.remote_index import DecodedEntry, decode_entry
from rlm.formats.remote_index_derived import find_entry_for_offset
from rlm.formats.time_index import TimeIndex
from rlm.tiering.visibility import batches_max_timestamp


@dataclass
class SetView:
    base_offset: int
    offsets: OffsetIndex
    times: TimeIndex
    log_index: bytes | mmap.mmap
    first: DecodedEntry | None
    last: DecodedEntry | None

    def entry_after(self, entry: DecodedEntry) -> DecodedEntry | None:
        if entry.end_position >= len(self.log_index):
            return None
        return decode_entry(self.log_index, entry.end_position)

    def entries_from(self, entry: DecodedEntry) -> Iterator[DecodedEntry]:
        current: DecodedEntry | None = entry
        while current is not None:
            yield current
            current = self.entry_after(current)


def _read_or_empty(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def load_set(directory: Path, base: int) -> SetView | None:
    # Derived files first, then the entries: anything they reference was appended before them.
    offsets_raw = _read_or_empty(directory / naming.segment_file_name(base, naming.REMOTE_OFFSET_INDEX))
    times_raw = _read_or_empty(directory / naming.segment_file_name(base, naming.REMOTE_TIME_INDEX))
    log_raw = _read_or_empty(directory / naming.segment_file_name(base, naming.REMOTE_LOG_INDEX))
    # A concurrent append may have left partial trailing entries in any file: keep whole ones.
    offsets_raw = offsets_raw[: len(offsets_raw) - len(offsets_raw) % OffsetIndex.ENTRY_SIZE]
    times_raw = times_raw[: len(times_raw) - len(times_raw) % TimeIndex.ENTRY_SIZE]
    offsets = OffsetIndex(base, offsets_raw, preallocated=False)
    times = TimeIndex(base, times_raw, preallocated=False)
    if not offsets or not log_raw:
        return None
    first = decode_entry(log_raw, 0)
    last = decode_entry(log_raw, offsets[len(offsets) - 1].position)
    return SetView(base, offsets, times, log_raw, first, last)


class SetCache:
    """Parsed sets keyed by (path, size, mtime): a file that changed is parsed again."""

    def __init__(self, max_sets: int = 256) -> None:
        self._views: OrderedDict[tuple[str, int, int], SetView | None] = OrderedDict()
        self._lock = threading.Lock()
        self.max_sets = max_sets

    def get(self, directory: Path, base: int) -> SetView | None:
        path = directory / naming.segment_file_name(base, naming.REMOTE_OFFSET_INDEX)
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        key = (str(path), st.st_size, st.st_mtime_ns)
        with self._lock:
            if key in self._views:
                self._views.move_to_end(key)
                return self._views[key]
        view = load_set(directory, base)
        with self._lock:
            self._views[key] = view
            while len(self._views) > self.max_sets:
                self._views.popitem(last=False)
        return view


def chain_from(views: Sequence[SetView], offset: int) -> Iterator[DecodedEntry]:
    """The remote entries from the one holding ``offset`` (or the first after it) on, in the local
    sets' order — the store's chain (docs/cluster.md) — across entries, objects and sets; an entry
    whose offsets all lie below what was already yielded is skipped (never read twice)."""
    floor = offset
    for view in views:
        if view.last is None or view.last.entry.last_offset < floor:
            continue
        begin = find_entry_for_offset(view.offsets, view.log_index, floor) or view.first
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


__all__ = ["SetCache", "SetView", "chain_from", "load_set", "remote_max_timestamp"]
