"""Bring one partition to a consistent state after any crash (docs/architecture.md §5).

Runs before a partition's first pass (and again after a pass that failed midway):

0. resolve the incarnation's root in the store — adopt or retire an undecided name-only root —
   and mark the partition's old incarnations retired (docs/topic-identity.md);
1. open the local remote-index family — a torn or corrupt tail of the active set is truncated at
   the last good entry and its derived files rewritten;
2. list the remote manifests: they, and only they, say what is committed (resolved into the chain
   of served offsets with the lineage markers, docs/cluster.md);
3. resolve open journal attempts: a COPY_STARTED whose attempt owns the manifest is finished; any
   other is aborted and its objects deleted at once (it can never become visible); an unfinished
   DELETE_STARTED is carried out again (deletes are idempotent);
4. drop stale pins;
5. check the lineage (single broker): a local log that ends at or below what was tiered, or whose
   batch differs from the tiered one at the same offset, fails recovery with
   :class:`IdentityConflictError` (persisted for readers, shown in status) before anything is
   rebuilt into the partition dir. In cluster mode leader epochs decide instead (docs/cluster.md);
6. bring the local index to the chain (:func:`rlm.tiering.converge.sync.settle`): local entries are checked
   against the chain's segments, what differs is rewound and every committed segment above is
   appended from its own uploaded entries object (a crash between the manifest and the local
   append, or a replaced disk). Local entries above anything the store holds cannot come from
   rlm's protocol — that is a wrong bucket or prefix and is refused rather than "repaired".
"""

from __future__ import annotations

import logging
import shutil

from rlm.errors import FormatError, IdentityConflictError, StorageError
from rlm.tiering.converge.identity import check_lineage, mark_dir, resolve_root
from rlm.tiering.converge.incarnations import find_old_incarnations, remember_identity
from rlm.tiering.converge.sync import (
    SyncResult,
    local_divergence,
    note_divergence,
    note_log_start,
    refresh,
    resolve,
    settle,
)
from rlm.tiering.local import PartitionContext, Progress, Quarantine, manifest_snapshot, of_context
from rlm.tiering.store import Chain, SegmentManifest

__all__ = ["observe", "progress_after", "rebuild_local_index", "recover"]

log = logging.getLogger(__name__)


def _resolve_journal(ctx: PartitionContext, committed: dict[int, SegmentManifest]) -> None:
    remote = of_context(ctx)
    for ev in ctx.journal.open_attempts():
        manifest = committed.get(ev.base_offset)
        if ev.type == "COPY_STARTED":
            if manifest is not None and manifest.attempt_id == ev.attempt_id:
                ctx.journal.append("COPY_FINISHED", ev.base_offset, ev.attempt_id)
                continue
            deleted = remote.delete_attempt(ev.base_offset, ev.attempt_id)
            log.info(
                "%s-%d: aborted copy attempt %s of segment %d (%d objects deleted)",
                ctx.topic,
                ctx.partition,
                ev.attempt_id,
                ev.base_offset,
                len(deleted),
            )
            ctx.journal.append("COPY_ABORTED", ev.base_offset, ev.attempt_id)
        elif ev.type == "LOG_START_STARTED":  # the marker is in the store or was never written
            ctx.journal.append("LOG_START_FINISHED", ev.base_offset, ev.attempt_id)
        else:  # DELETE_STARTED: finish it
            if manifest is not None and manifest.attempt_id == ev.attempt_id:
                remote.delete_manifest(ev.base_offset)
                committed.pop(ev.base_offset, None)
            remote.delete_attempt(ev.base_offset, ev.attempt_id)
            ctx.journal.append("DELETE_FINISHED", ev.base_offset, ev.attempt_id)


def _start_view(ctx: PartitionContext, *, from_store_alone: bool) -> None:
    """A process that read nothing of the store yet starts from the manifest snapshot's rows whose
    listing stamp is known: the listing then reads only the manifests it does not describe (one
    LIST and no GET when nothing changed; docs/remote-state.md). Never trusted beyond the listing:
    a key it does not show, or shows with another stamp, is dropped or read again.
    ``from_store_alone`` (rebuild-index): the view starts empty, so every manifest is read from the
    store and verified, none taken from this process or its snapshot."""
    if from_store_alone:
        ctx.store.manifests, ctx.store.markers = {}, {}
        return
    if ctx.store.manifests:
        return
    try:
        rows = manifest_snapshot.load(ctx.manifest_snapshot_path)
    except FormatError:
        return  # missing or damaged: read everything, as always
    ctx.store.manifests = {
        key: (stamp, m) for key, stamp, m in rows if key and stamp != manifest_snapshot.UNKNOWN_STAMP
    }


def recover(ctx: PartitionContext, *, leader: bool = True, forget_tiered: bool = False) -> SyncResult:
    """Make local and remote agree; see the module doc. Idempotent. A ``leader=False`` recovery
    (a follower in cluster mode, docs/cluster.md) writes nothing to the store but its own
    journal's clean-up: no adoption decision, no retired markers, no marker or uncommit.
    ``forget_tiered`` (``rlm rebuild-index``): the saved progress counts for nothing but its
    DeleteRecords point; the file keeps it until the recovered progress replaces it, so readers
    meanwhile still claim what was tiered and answer it from the store (docs/read-path.md); no
    manifest is taken from the snapshot, every one is read from the store."""
    resolve_root(ctx, decide=leader)
    ctx.old_incarnations = find_old_incarnations(ctx, mark=leader)
    if leader and not ctx.shared.cluster:  # what a trusted restart reuses (resume.py)
        remember_identity(ctx)
    ctx.family.open()
    ctx.store.held = None  # what the local index holds is checked against its files again
    _start_view(ctx, from_store_alone=forget_tiered)
    # Recovery changes the store (journal attempts finished or aborted) before it saves progress:
    # until it does, no restart may trust the local state (resume.py) — it writes a new manifest snapshot.
    ctx.manifest_snapshot_path.unlink(missing_ok=True)
    read = refresh(ctx)
    committed = {m.base_offset: m for _s, m in ctx.store.manifests.values()}
    _resolve_journal(ctx, committed)
    ctx.store.manifests = {
        k: sm for k, sm in ctx.store.manifests.items() if committed.get(sm[1].base_offset) is sm[1]
    }
    manifests = sorted(committed.values(), key=lambda m: m.base_offset)
    shutil.rmtree(ctx.staging_dir, ignore_errors=True)

    saved = Progress.load(ctx.progress_path)
    if forget_tiered:
        saved = saved.keeping(-1, -1)
    remote_highest = manifests[-1].last_offset if manifests else -1
    if not ctx.shared.cluster:  # in a cluster, leader epochs decide (docs/cluster.md)
        try:
            check_lineage(ctx, manifests, max(remote_highest, saved.highest_tiered_offset))
        except IdentityConflictError:
            ctx.manifests = []  # not this log's: never counted, served or retained as its own
            ctx.progress = saved.keeping(saved.highest_tiered_offset, saved.remote_log_start_offset)
            ctx.save_progress()
            raise
    local_highest = ctx.family.last_offset
    if local_highest > max(remote_highest, saved.highest_tiered_offset) and not ctx.store.markers:
        raise StorageError(
            f"the local remote index of {ctx.topic}-{ctx.partition} covers offsets up to "
            f"{local_highest} but the remote store has nothing above {remote_highest}: is "
            f"[remote] pointing at the right bucket/prefix? (`rlm rebuild-index` rebuilds the "
            "local index from the store)",
            file=ctx.part.path,
        )
    # Staged: a rebuilt family is published whole, never one link at a time (docs/read-path.md).
    result = settle(ctx, leader=leader, read=read, staged=True)
    ctx.progress = saved.keeping(*progress_after(result.chain, saved))
    note_divergence(ctx, result.local_diverged_from)
    note_log_start(ctx)  # the store keeps rlm's DeleteRecords point: a lost state dir learns it here
    mark_dir(ctx)
    ctx.save_progress()
    ctx.recovered = True
    ctx.publish_gauges()
    return result


def rebuild_local_index(ctx: PartitionContext, *, leader: bool) -> int:
    """``rlm rebuild-index``: the local remote-index family rebuilt from the store alone; returns
    the entries indexed. Forgets what was tiered, never the DeleteRecords point or the recorded
    gaps (the store cannot tell them)."""
    ctx.family.open()
    ctx.family.delete_all()
    ctx.recovered = False
    recover(ctx, leader=leader, forget_tiered=True)
    return sum(m.index_entries for m in ctx.manifests)


def progress_after(chain: Chain, saved: Progress) -> tuple[int, int]:
    """``(highest tiered, remote log start)`` once the store's chain is known: the chain's when it
    serves anything; else what was saved (retention may have deleted everything), but never above
    an offset the lineage found diverged."""
    if chain.links:
        return chain.highest, chain.start
    highest = saved.highest_tiered_offset
    cut = chain.first_diverged
    if cut is not None:
        highest = min(highest, cut - 1)
    return highest, highest + 1 if highest >= 0 else -1


def observe(ctx: PartitionContext) -> None:
    """Load the partition's state read-only (``rlm status`` beside a running daemon): unlike
    :func:`recover` it resolves no journal attempt, repairs no file, writes no marker and deletes
    nothing."""
    if ctx.part.identity_error is not None:
        ctx.last_error = ctx.part.identity_error
        return
    resolve_root(ctx, decide=False)
    ctx.old_incarnations = find_old_incarnations(ctx, mark=False)
    refresh(ctx)
    chain = resolve(ctx)
    ctx.manifests = chain.manifests
    saved = Progress.load(ctx.progress_path)
    ctx.progress = saved.keeping(*progress_after(chain, saved))
    diverged = local_divergence(ctx)
    ctx.progress.local_diverged_from = -1 if diverged is None else diverged
    note_log_start(ctx)
    ctx.quarantined = Quarantine.load_all(ctx.quarantine_path)
    if not ctx.shared.cluster:
        check_lineage(ctx, ctx.manifests, ctx.progress.highest_tiered_offset)
