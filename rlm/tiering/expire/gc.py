"""Garbage collection of abandoned copy attempts (docs/formats.md §6.2, §6.6).

An attempt's objects are garbage when no manifest names the attempt, no copy of it is in flight in
this process, and it is older than the grace period (``gc_grace_ms``; the age rule is
:func:`rlm.tiering.store.remote_state.attempt_age_ms`, docs/remote-state.md). Recovery already deletes
the attempts its own journal knows; GC catches the rest (a journal lost with a disk, another
sidecar's crash, a retention delete interrupted before it was journaled).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from rlm.errors import FormatError, ProtectionError
from rlm.storage.api import ObjectInfo
from rlm.tiering.converge import OldIncarnation, collect_old_incarnations, identity, refresh
from rlm.tiering.local import PartitionContext, of_context
from rlm.tiering.store import Orphan, SegmentManifest

__all__ = ["collect_garbage", "collect_partition", "find_orphans"]

log = logging.getLogger(__name__)


def find_orphans(
    ctx: PartitionContext, *, save_stamps: bool = False, listing: Sequence[ObjectInfo] | None = None
) -> list[Orphan]:
    """Abandoned attempts of the partition past the grace period (manifests re-listed first).

    A partition this process recovered lists its manifests into its store view: a manifest is
    read only when the listing shows a stamp the view (or the restart's snapshot) does not know, so
    a GC run lists the attempts and the manifests, not a read of every manifest. A manifest this node
    uploaded is in the snapshot under the stamp its create was answered; where a listing shows
    another (a store whose create answers neither ETag nor the listing's mtime) the first GC after a
    restart reads it; ``save_stamps`` (the caller owns the state dir) then saves the stamps it
    learned into the snapshot, and the next process's GC reads none of them again."""
    read = 0

    def listed() -> Iterable[SegmentManifest]:
        nonlocal read
        ctx.manifests  # noqa: B018 — a trusted restart's snapshot becomes the view (resume.py)
        read = refresh(ctx)
        return [m for _s, m in ctx.store.manifests.values()]

    orphans = of_context(ctx).orphans(
        ctx.shared.clock_ms(),
        ctx.shared.settings.gc_grace_ms,
        ctx.in_flight,
        listed if ctx.recovered else None,
        listing,
    )
    if read and save_stamps:
        ctx.save_progress()  # the same progress and manifests, now with the listing's stamps
    return orphans


def collect_garbage(
    ctx: PartitionContext,
    *,
    dry_run: bool = False,
    save_stamps: bool = False,
    listing: Sequence[ObjectInfo] | None = None,
) -> list[Orphan]:
    """Delete (or with ``dry_run`` only list) the partition's orphans (``save_stamps``,
    ``listing``: :func:`find_orphans`)."""
    orphans = find_orphans(ctx, save_stamps=save_stamps and not dry_run, listing=listing)
    if dry_run:
        return orphans
    remote = of_context(ctx)
    for orphan in orphans:
        for key in orphan.keys:
            remote.delete(key)
        ctx.series(ctx.shared.metrics.orphans_deleted).inc(len(orphan.keys))
    return orphans


def collect_partition(
    ctx: PartitionContext, *, dry_run: bool, old: list[OldIncarnation] | None, save_stamps: bool = False
) -> list[Orphan]:
    """GC of one partition this node leads, its pass lock held: its orphans (deleted unless
    ``dry_run``, returned) and its old incarnations past their grace (into ``old``). A partition
    with a manifest it cannot parse or trust deletes nothing (logged); a store outage raises."""
    try:
        if not ctx.recovered:  # recovery decided the root of a recovered partition
            identity.resolve_root(ctx, decide=False)
        # One listing of the partition's id roots holds this root's attempts and every other
        # incarnation's objects: GC lists it once for both (its manifests are listed after it).
        own_id = ctx.part.topic_id is not None and ctx.key_id == ctx.part.topic_id
        ids = of_context(ctx).list_id_roots() if own_id else None
        orphans = collect_garbage(ctx, dry_run=dry_run, save_stamps=save_stamps, listing=ids)
        found = collect_old_incarnations(ctx, dry_run=dry_run, listing=ids)
        if old is not None:
            old.extend(found)
    except (FormatError, ProtectionError) as err:
        log.warning("gc: %s: skipped, nothing deleted: %s", ctx.part.name, err)
        return []
    return orphans
