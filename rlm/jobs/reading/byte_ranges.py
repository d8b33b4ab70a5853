"""Where a read task's bytes start and end: ranges of one remote object or local segment file cut
at batch boundaries, each read with one ranged request and decoded on its own (docs/export.md).

Remote ranges are runs of consecutive ``.remotelogindex`` entries; local ones are cut at the
segment's ``.index`` positions (batch starts), checked before use (docs/broker-files.md).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from rlm.errors import RlmError
from rlm.formats.indexes.remote_index import RemoteLogIndexEntry
from rlm.logdir.discovery import SegmentFiles
from rlm.logdir.segment import LogSegment

__all__ = ["local_ranges", "pack_entries"]


def pack_entries(
    entries: Sequence[RemoteLogIndexEntry], target_bytes: int, keep: Callable[[RemoteLogIndexEntry], bool]
) -> list[tuple[int, int]]:
    """Byte ranges of runs of consecutive kept entries, each ≤ ``target_bytes`` (or one entry)."""
    ranges: list[tuple[int, int]] = []
    run_start: int | None = None
    run_end = 0
    for e in entries:
        s, t = e.byte_range
        if not keep(e):
            if run_start is not None:
                ranges.append((run_start, run_end))
                run_start = None
            continue
        if run_start is not None and (s != run_end or t - run_start > target_bytes):
            ranges.append((run_start, run_end))
            run_start = None
        if run_start is None:
            run_start = s
        run_end = t
    if run_start is not None:
        ranges.append((run_start, run_end))
    return ranges


def local_ranges(
    seg: SegmentFiles, min_offset: int, target_bytes: int, index_interval_bytes: int
) -> list[tuple[int, int]]:
    """Byte ranges of ``seg``'s ``.log`` from the batch holding ``min_offset`` (its ``.index``
    floor) to the end, each about ``target_bytes`` (a range ends at a batch start)."""
    first = _local_first_position(seg, min_offset)
    return _local_cuts(seg, first, seg.size, target_bytes, index_interval_bytes)


def _local_cuts(
    seg: SegmentFiles, first_pos: int, size: int, target_bytes: int, index_interval_bytes: int
) -> list[tuple[int, int]]:
    """Split ``[first_pos, size)`` of a local segment at ``.index`` positions (batch starts)."""
    cuts = [first_pos]
    if size - first_pos > target_bytes and seg.index is not None:
        try:  # broker indexes are checked before use (docs/broker-files.md)
            with LogSegment.open(seg, index_interval_bytes=index_interval_bytes) as local:
                index = local.verified_offset_index()
        except (OSError, RlmError):
            index = None
        if index is not None:
            for entry in index:
                if (
                    entry.position > cuts[-1]
                    and entry.position - cuts[-1] >= target_bytes
                    and entry.position < size
                ):
                    cuts.append(entry.position)
    cuts.append(size)
    return [(a, b) for a, b in itertools.pairwise(cuts) if b > a]


def _local_first_position(seg: SegmentFiles, min_offset: int) -> int:
    if seg.index is None or min_offset <= seg.base_offset:
        return 0
    try:
        with LogSegment.open(seg) as local:
            return local.floor_position(min_offset)
    except (OSError, RlmError):
        return 0
