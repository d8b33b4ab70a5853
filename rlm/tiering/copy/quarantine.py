"""Quarantine of a rolled segment whose ``.log`` is damaged, and its lifting (docs/broker-files.md).

A quarantined segment is never committed (nothing of it stays in the store) and stops its
partition's tiering there (tiering past it would leave a gap). The quarantine is recorded with the
``.log``'s version (device, inode, size, mtime) and persisted beside the partition's progress, so
``rlm status`` in another process shows it; every pass re-examines it and lifts it once the file
changed (the broker replaced it: it is checksummed again) or is gone (the broker removed it: the
later segments go on).
"""

from __future__ import annotations

import logging

from rlm.errors import SegmentQuarantined
from rlm.logdir.discovery import SegmentFiles
from rlm.logdir.indexcheck import file_version
from rlm.tiering.local import PartitionContext, Quarantine

__all__ = ["quarantine", "reexamine_quarantine"]

log = logging.getLogger(__name__)


def quarantine(ctx: PartitionContext, seg: SegmentFiles, err: SegmentQuarantined) -> None:
    """Record ``err`` as the quarantine of ``seg``: in memory, on disk, in the metrics and the log."""
    q = Quarantine(
        seg.base_offset,
        err.file or str(seg.log),
        err.position,
        err.cause,
        str(err),
        ctx.shared.clock_ms(),
        err.version,
    )
    ctx.quarantined[seg.base_offset] = q
    Quarantine.save_all(ctx.quarantine_path, ctx.quarantined)
    ctx.shared.metrics.quarantine_set(ctx.labels, q)
    log.error(
        "%s: segment %d quarantined, tiering of the partition waits until the broker fixes "
        "or removes the file: %s",
        ctx.part.name,
        seg.base_offset,
        err,
    )


def reexamine_quarantine(ctx: PartitionContext, segments: list[SegmentFiles]) -> None:
    """Lift each quarantine whose ``.log`` is gone from ``segments`` (the current listing) or is
    another version than when it was quarantined; keep (and re-publish) the others."""
    listed = {s.base_offset: s for s in segments}
    if not ctx.quarantined:  # found by an earlier process
        ctx.quarantined.update(Quarantine.load_all(ctx.quarantine_path))
    lifted = False
    for base, q in list(ctx.quarantined.items()):
        seg = listed.get(base)
        version = file_version(seg.log) if seg is not None else None
        if version is not None and version == q.version:
            ctx.shared.metrics.quarantine_set(ctx.labels, q)
            continue
        del ctx.quarantined[base]
        lifted = True
        ctx.shared.metrics.quarantine_clear(ctx.labels, q)
        log.warning(
            "%s: segment %d %s; lifting its quarantine",
            ctx.part.name,
            base,
            "was removed" if version is None else "changed on disk, examining it again",
        )
    if lifted:
        Quarantine.save_all(ctx.quarantine_path, ctx.quarantined)
