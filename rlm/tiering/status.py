"""Small derived status values of a partition (``rlm status``, ``GET /v1/partitions``)."""

from __future__ import annotations

from collections.abc import Sequence

from rlm.logdir.scan import SegmentFiles

__all__ = ["eligible_end", "lag_age_ms"]


def eligible_end(highest_tiered: int, local_start: int | None,
                 pending: Sequence[tuple[SegmentFiles, int, int]]) -> int | None:
    """Exclusive end of the offsets eligible for tiering: the next base after the newest pending
    segment; with nothing pending, everything eligible is already remote (highest tiered + 1)."""
    if pending:
        return pending[-1][1]
    if highest_tiered >= 0:
        return highest_tiered + 1
    return local_start


def lag_age_ms(pending: Sequence[tuple[SegmentFiles, int, int]], now_ms: int) -> int:
    """How long the oldest pending segment has waited (ms): now − its ``.log`` mtime; 0 when none."""
    if not pending:
        return 0
    try:
        mtime_ms = int(pending[0][0].log.stat().st_mtime * 1000)
    except OSError:
        return 0
    return max(0, now_ms - mtime_ms)
