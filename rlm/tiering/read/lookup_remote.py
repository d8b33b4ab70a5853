"""The remote tier's answers (docs/architecture.md §4, step 4): the first record at or after an
offset or a timestamp, walked along the partition's local remote-index sets (``SetView``s,
docs/formats.md §5.2, §5.3) with each entry's bytes from an :class:`EntrySource` (memo,
read-ahead, range cache or one ranged read of the store, docs/read-path.md).

Only offsets at or above the remote log start are answered: a set may still list entries
retention deleted. Offsets are Kafka's, timestamps ms since the epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rlm.formats.indexes.remote_index import DecodedEntry
from rlm.formats.indexes.remote_index_derived import find_entry_for_offset, find_entry_for_timestamp
from rlm.formats.records import RecordBatch, decode_records
from rlm.logdir.index_sets import SetView
from rlm.tiering.read.answers import Located, RemoteLocation, first_offset_at_least
from rlm.tiering.read.cache import RangeBytes
from rlm.tiering.read.remote_fetch import EntrySource
from rlm.tiering.read.remote_sets import chain_from

#: One entry's bytes and CRC-checked batches (:meth:`EntrySource.batches`).
EntryBatches = Callable[[DecodedEntry], tuple[RangeBytes, list[RecordBatch]]]


def remote_offset(
    views: Sequence[SetView], offset: int, start: int, source: EntrySource, timestamp: bool = True
) -> Located | None:
    """The first remote record with offset ≥ ``max(offset, start)`` (``start``: the remote log
    start), along the store's chain of entries from the one holding it. ``timestamp=False``: a
    batch with no offset gaps answers from its header (:func:`first_offset_at_least`)."""
    for current in chain_from(views, max(offset, start)):
        data, batches = source.batches(current)
        where = RemoteLocation(str(current.entry.rdi), current.entry.data_length)
        for batch in batches:
            if batch.last_offset < offset:
                continue
            first = None if timestamp else first_offset_at_least(batch, offset)
            if first is not None:
                return Located("remote", first, None, batch, where)
            for record in decode_records(data, batch):
                if record.offset >= offset:
                    return Located("remote", record.offset, record.timestamp, batch, where)
    return None


def remote_timestamp(
    views: Sequence[SetView], ts: int, start: int, entry_batches: EntryBatches
) -> Located | None:
    """The first remote record at or above offset ``start`` (the remote log start) whose
    timestamp is ≥ ``ts``: each set's ``.remotetimeindex`` names the first entry whose running
    max reaches ``ts``; entries from there are read until a record qualifies."""
    for view in views:
        if view.last is None or view.last.entry.last_offset < start:
            continue
        first_hit = find_entry_for_timestamp(view.times, view.offsets, view.log_index, ts)
        if first_hit is None:
            continue  # the set's running max never reaches ts
        begin = first_hit
        if first_hit.entry.last_offset < start:  # below the remote log start: walk from there
            begin = find_entry_for_offset(view.offsets, view.log_index, start) or first_hit
        for current in view.entries_from(begin):
            if current.entry.last_timestamp < ts or current.entry.last_offset < start:
                continue
            data, batches = entry_batches(current)
            for batch in batches:
                if batch.max_timestamp < ts or batch.last_offset < start:
                    continue
                for record in decode_records(data, batch):
                    if record.timestamp >= ts and record.offset >= start:
                        where = RemoteLocation(str(current.entry.rdi), current.entry.data_length)
                        return Located("remote", record.offset, record.timestamp, batch, where)
    return None


__all__ = ["EntryBatches", "remote_offset", "remote_timestamp"]
