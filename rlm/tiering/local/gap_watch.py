"""Recording gaps during a pass (docs/visibility.md, "Gaps"; what a gap is: rlm.tiering.local.gaps).

Runs on every sidecar's pass, leader or not, before anything is copied: once the copy resumes
above a gap, the highest tiered offset has passed it and only the hole in the store still shows it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rlm.logdir.discovery import SegmentFiles
from rlm.tiering.local.gaps import find_gaps, merge_gaps
from rlm.tiering.local.state import PartitionContext

__all__ = ["note_gaps"]

log = logging.getLogger(__name__)


def note_gaps(
    ctx: PartitionContext, segments: Sequence[SegmentFiles], *, compacted: bool, leader: bool
) -> None:
    """Record the gaps the partition shows now (``segments``: the pass's local listing) in its
    progress, persisted when they changed; a new gap is logged as a warning once.

    Only the leader judges its local log against the highest tiered offset: a follower's replica
    may have deleted segments the leader still holds and is about to tier. A follower learns the
    gap from the store's hole once the leader copied past it."""
    progress = ctx.progress
    # Manifests still only in the snapshot (a restart that trusted it) are not parsed for this:
    # the store's holes are found once a copy or a sync loads them.
    manifests = [] if ctx.pending_manifests is not None else ctx.manifests
    found = find_gaps(
        manifests,
        progress.highest_tiered_offset,
        _local_start(ctx, segments) if leader else None,
        progress.delete_records_offset,
        compacted=compacted,
    )
    floor = max(progress.delete_records_offset, progress.remote_log_start_offset, 0)
    gaps = merge_gaps(progress.gaps, found, manifests, floor, ctx.shared.clock_ms())
    if gaps == progress.gaps:
        return
    known = {(g.first_offset, g.last_offset) for g in progress.gaps}
    for g in gaps:
        if (g.first_offset, g.last_offset) not in known:
            log.warning("%s: gap: %s", ctx.part.name, g.describe())
    progress.gaps = gaps
    ctx.save_progress()
    ctx.series(ctx.shared.metrics.gap_offsets).set(sum(g.size for g in gaps))


def _local_start(ctx: PartitionContext, segments: Sequence[SegmentFiles]) -> int | None:
    """Where this broker's copy of the log starts for rlm: its first segment, or lower, the first
    segment a sight pin still holds after the broker deleted it (docs/operations.md "Pins and the
    broker's retention") — pinned offsets are waiting to be tiered, not lost."""
    starts = [segments[0].base_offset] if segments else []
    starts += ctx.shared.pins.pins_of(ctx.state_dir).keys()
    return min(starts) if starts else None
