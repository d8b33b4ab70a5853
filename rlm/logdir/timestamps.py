"""A local segment's largest timestamp as the broker's time retention sees it
(docs/topic-policy.md §8).

Kafka's ``LogSegment.largestTimestamp`` is the segment's max timestamp so far, loaded from the last
entry of its ``.timeindex`` (a roll appends the final max timestamp there), or the ``.log`` file's
last-modified time when the segment has no timestamp (no entry, or ``-1``). The active segment's
time index is preallocated (trailing zero entries) and lags its log by up to
``index.interval.bytes``: its value here can be lower than the broker's in-memory one, which only
makes a deadline earlier (on the safe side).
"""

from __future__ import annotations

import os

from rlm.errors import RlmError
from rlm.formats.indexes.time_index import NO_TIMESTAMP, TimeIndex
from rlm.logdir.discovery import SegmentFiles

__all__ = ["largest_timestamp"]

_ENTRY = TimeIndex.ENTRY_SIZE


def largest_timestamp(segment: SegmentFiles, *, active: bool = False) -> int | None:
    """The segment's largest timestamp (epoch ms) by Kafka's rule above; None when neither its
    time index nor its ``.log`` can be read (the broker deleted it meanwhile). ``active``: the
    log's last segment, whose index is preallocated; a rolled one's is trimmed, so its last 12
    bytes are its last entry even when they are zero (timestamp 0 at the base offset)."""
    found = _from_time_index(segment, active) if segment.time_index is not None else None
    if found is not None and found != NO_TIMESTAMP:
        return found
    try:
        return int(os.stat(segment.log).st_mtime * 1000)
    except OSError:
        return None


def _from_time_index(segment: SegmentFiles, active: bool) -> int | None:
    """The last entry's timestamp: the file's last 12 bytes for a rolled segment (Kafka trims its
    index on roll) or when they are not zero; else the whole file parsed (a preallocated index)."""
    assert segment.time_index is not None
    try:
        with open(segment.time_index, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size < _ENTRY:
                return None
            f.seek(size - size % _ENTRY - _ENTRY)
            tail = f.read(_ENTRY)
            trimmed = any(tail) or not active
            if trimmed:
                data = tail
            else:
                f.seek(0)
                data = f.read()
    except OSError:
        return None
    try:  # the one parser of the format (rlm.formats.indexes.time_index), on the tail or the whole file
        return TimeIndex(segment.base_offset, data, preallocated=not trimmed).last_entry.timestamp
    except RlmError:  # a damaged index: Kafka would rebuild it; the log's mtime is the estimate
        return None
