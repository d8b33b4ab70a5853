"""A restart that trusts the local state: no store request for a partition whose local files are
whole and agree with each other (docs/remote-state.md, "What a restart reads").

Single broker (no ``[cluster]``), only this sidecar writes the partition's root, and every change it
makes is journaled and fsynced before and after (the copy and delete protocols). So when, after a
restart,

* ``progress.json`` is this incarnation's (topic id, the directory token left in the partition
  directory — a re-created directory lacks it), records no lineage conflict and names its root;
* the journal has no open attempt (nothing was in flight at the crash);
* the active remote index set opens without repair and the index ends where the progress says
  tiering ended;
* the manifest snapshot (:mod:`rlm.tiering.local.manifest_snapshot`) is whole and was written for that
  progress,

the store can hold nothing this node does not know, and recovery's listing, manifest reads,
first-batch probe, adoption and old-incarnation lookups would only confirm it. Any other case goes
through :func:`rlm.tiering.converge.recovery.recover` (the full recovery from the store) for that partition
alone. Full reconciliation of a trusted partition stays with ``rlm verify`` / ``rlm rebuild-index``.
A partition with a topic id whose data is under its own id root needs what recovery asks the
store about identity (the name-only root's ``owner.json``/``retired.json``, a listing of other
roots): it reuses the answers persisted in its state dir (``identity.json``,
:func:`rlm.tiering.converge.incarnations.recall_identity`) and asks (2-4 requests, independent of how much
was tiered) only when there are none for this topic id and root.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from rlm.tiering.converge import (
    OldIncarnation,
    find_old_incarnations,
    read_dir_token,
    recall_identity,
    recover,
    remember_identity,
    resolve_root,
)
from rlm.tiering.idle import forget_mark, load_mark
from rlm.tiering.local import (
    ManifestSnapshotHeader,
    PartitionContext,
    PendingManifests,
    Progress,
    manifest_snapshot,
)
from rlm.tiering.roles import Roles
from rlm.tiering.store import SegmentManifest, StoreView, object_keys, resolve_chain

__all__ = ["clear_staging", "load_state", "part_has_id_root", "resume"]

log = logging.getLogger(__name__)


def _root_key_id(ctx: PartitionContext, saved: Progress) -> tuple[bool, str | None]:
    """(usable, key id) of the root the progress names: this partition's own root or, for a
    partition with a topic id, the name-only root it adopted."""
    root = object_keys.parse_root(saved.remote_root) if saved.remote_root else None
    if root is None or (root.topic, root.partition) != (ctx.topic, ctx.partition):
        return False, None
    if root.topic_id is not None and root.topic_id != ctx.part.topic_id:
        return False, None
    return True, root.topic_id


def _why_not(ctx: PartitionContext, saved: Progress) -> str | None:
    """Why the local state cannot be trusted, None when it can (reads local files only)."""
    part = ctx.part
    if ctx.shared.cluster:
        return "cluster mode (other sidecars write the store)"
    if saved.lineage_conflict is not None or saved.topic_id != part.topic_id:
        return "progress is another incarnation's or records a conflict"
    if saved.dir_token is None or read_dir_token(part.path) != saved.dir_token:
        return "the partition directory is not the one the progress was written for"
    if not ctx.journal.quiescent():
        return "the journal has open attempts"
    return None


@dataclass(frozen=True, slots=True)
class _Trusted:
    """What the local files say, once they were found whole and in agreement."""

    saved: Progress
    header: ManifestSnapshotHeader
    key_id: str | None
    known: list[OldIncarnation] | None  # the identity lookups' record; None = ask the store


def clear_staging(staging: Path) -> None:
    """Remove what is in the partition's staging dir (pins of attempts that cannot be in flight
    at a restart), keeping the directory: every copy leaves it empty, and removing an empty
    directory costs a journaled metadata write (~0.1 ms per partition at every restart)."""
    try:
        with os.scandir(staging) as it:
            stale = [Path(e.path) for e in it]
    except (FileNotFoundError, NotADirectoryError):
        return
    for path in stale:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _read_local(ctx: PartitionContext) -> _Trusted | None:
    """The local half of :func:`resume`: local files only (reads, and stale pins removed from the
    staging dir once the state is trusted); None when recovery must run."""
    saved = Progress.load(ctx.progress_path)
    usable, key_id = _root_key_id(ctx, saved)
    why = "progress names no usable root" if not usable else _why_not(ctx, saved)
    header = manifest_snapshot.read_header(ctx.manifest_snapshot_path) if why is None else None
    if why is None and (
        header is None
        or (header.highest, header.start) != (saved.highest_tiered_offset, saved.remote_log_start_offset)
    ):
        why = "no manifest snapshot written for this progress"
    if why is None and header is not None:
        expected_last = header.highest if header.count else -1
        if not ctx.family.open_trusted() or ctx.family.last_offset != expected_last:
            why = "the local remote index was repaired or does not end at the highest tiered offset"
    if why is not None or header is None:
        log.debug("%s: recovering from the store: %s", ctx.part.name, why)
        return None
    clear_staging(ctx.staging_dir)
    known = recall_identity(ctx, key_id) if part_has_id_root(ctx, key_id) else None
    return _Trusted(saved, header, key_id, known)


def resume(ctx: PartitionContext) -> bool:
    """Take the partition's state from its local files; False when recovery must run instead.

    Sets what :func:`~rlm.tiering.converge.recovery.recover` sets (root, progress, directory token, the
    manifests — pending until first use) and marks the context recovered. The local reads run one
    partition at a time (``SharedResources.local_load``); store requests never hold that lock.
    """
    if not ctx.shared.settings.trust_local_state:
        return False
    with ctx.shared.local_load:
        found = _read_local(ctx)
    if found is None:
        return False
    key_id = found.key_id
    if found.known is not None:
        # Decided by the lookups of an earlier pass: only this sidecar writes the partition's
        # roots (single broker), and a re-created topic fails the checks above.
        ctx.old_incarnations = found.known
    elif part_has_id_root(ctx, key_id):
        # Which incarnation owns the name-only root is decided as recovery decides it, and old
        # incarnations found: a few requests, whatever the history, remembered for the next
        # restart. A decision that moves the root recovers in full.
        resolve_root(ctx, decide=True)
        if ctx.key_id != key_id:
            return False
        ctx.old_incarnations = find_old_incarnations(ctx, mark=True)
        remember_identity(ctx)
    ctx.key_id = key_id
    ctx.progress = found.saved
    ctx.dir_token = found.saved.dir_token
    ctx.store = StoreView()  # held=None: checked against the local files if a sync ever needs it
    ctx.pending_manifests = PendingManifests(found.header, lambda: _load(ctx))
    ctx.recovered = True
    ctx.publish_gauges()
    return True


def _load(ctx: PartitionContext) -> list[SegmentManifest]:
    """The manifest snapshot's manifests, also as the store view (what sync and status read)."""
    rows = manifest_snapshot.load(ctx.manifest_snapshot_path)
    view = ctx.store
    found = {
        key or object_keys.manifest_key(ctx.topic, ctx.partition, m.base_offset, ctx.key_id): (stamp, m)
        for key, stamp, m in rows
    }
    view.manifests = {**view.manifests, **found}  # replaced, never mutated: status may be iterating it
    manifests = [m for _k, _s, m in rows]
    view.chain = resolve_chain(manifests)
    return manifests


def part_has_id_root(ctx: PartitionContext, key_id: str | None) -> bool:
    """True for a partition with a topic id whose data lives under its own id root: the name-only
    root's owner may still be undecided."""
    return ctx.part.topic_id is not None and key_id == ctx.part.topic_id


def load_state(ctx: PartitionContext, *, leader: bool, roles: Roles) -> None:
    """Before a partition's first pass (and after a failed one): :func:`resume` with its persisted
    idle mark (rlm.tiering.idle) when the local state is whole, else the full recovery."""
    if resume(ctx):
        ctx.shared.metrics.recoveries.labels(source="local").inc()
        load_mark(ctx)
    else:
        ctx.shared.metrics.recoveries.labels(source="store").inc()
        forget_mark(ctx)
        roles.note(ctx, recover(ctx, leader=leader))
