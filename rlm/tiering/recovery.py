"""Bring one partition to a consistent state after any crash (DESIGN §2).

Runs before a partition's first pass (and again after a pass that failed midway):

0. resolve the incarnation's root in the store — adopt or retire an undecided name-only root —
   and mark the partition's old incarnations retired (docs/topic-identity.md);
1. open the local remote-index family — a torn or corrupt tail of the active set is truncated at
   the last good entry and its derived files rewritten;
2. list the remote manifests: they, and only they, say what is committed;
3. resolve open journal attempts: a COPY_STARTED whose attempt owns the manifest is finished; any
   other is aborted and its objects deleted at once (it can never become visible); an unfinished
   DELETE_STARTED is carried out again (deletes are idempotent);
4. drop stale pins;
5. catch the local index up with the remote: every committed segment above the local index's last
   offset gets its entries appended from its own uploaded entries object (a crash between the
   manifest and the local append, or a replaced disk). Local entries with no manifest above the
   remote's highest offset cannot come from rlm's protocol — that is a wrong bucket or prefix and
   is refused rather than "repaired";
6. check the lineage: a local log that ends at or below what was tiered, or whose batch differs
   from the tiered one at the same offset, fails recovery with :class:`IdentityConflictError`
   (persisted for readers, shown in status) before anything is rebuilt into the partition dir.
"""

from __future__ import annotations

import logging
import shutil

from rlm.errors import FormatError, IdentityConflictError, RlmError, StorageError
from rlm.tiering.identity import check_lineage, mark_dir, resolve_root
from rlm.tiering.incarnations import find_old_incarnations
from rlm.tiering.manifest import SegmentManifest
from rlm.tiering.remote_state import of_context
from rlm.tiering.state import PartitionContext, Progress, Quarantine

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
            log.info("%s-%d: aborted copy attempt %s of segment %d (%d objects deleted)",
                     ctx.topic, ctx.partition, ev.attempt_id, ev.base_offset, len(deleted))
            ctx.journal.append("COPY_ABORTED", ev.base_offset, ev.attempt_id)
        else:  # DELETE_STARTED: finish it
            if manifest is not None and manifest.attempt_id == ev.attempt_id:
                remote.delete_manifest(ev.base_offset)
                committed.pop(ev.base_offset, None)
            remote.delete_attempt(ev.base_offset, ev.attempt_id)
            ctx.journal.append("DELETE_FINISHED", ev.base_offset, ev.attempt_id)


def recover(ctx: PartitionContext) -> None:
    """Make local and remote agree; see the module doc. Idempotent."""
    resolve_root(ctx, decide=True)
    ctx.old_incarnations = find_old_incarnations(ctx, mark=True)
    ctx.family.open()
    manifests = of_context(ctx).list_manifests()
    committed = {m.base_offset: m for m in manifests}
    _resolve_journal(ctx, committed)
    manifests = sorted(committed.values(), key=lambda m: m.base_offset)
    shutil.rmtree(ctx.staging_dir, ignore_errors=True)

    saved = Progress.load(ctx.progress_path)
    remote_highest = manifests[-1].last_offset if manifests else -1
    try:
        check_lineage(ctx, manifests, max(remote_highest, saved.highest_tiered_offset))
    except IdentityConflictError:
        ctx.manifests = []  # not this log's: never counted, served or retained as its own
        ctx.progress = Progress(saved.highest_tiered_offset, saved.remote_log_start_offset,
                                saved.delete_records_offset)
        ctx.save_progress()
        raise
    local_highest = ctx.family.last_offset
    if local_highest > max(remote_highest, saved.highest_tiered_offset):
        raise StorageError(
            f"the local remote index of {ctx.topic}-{ctx.partition} covers offsets up to "
            f"{local_highest} but the remote store has nothing above {remote_highest}: is "
            f"[remote] pointing at the right bucket/prefix? (`rlm rebuild-index` rebuilds the "
            "local index from the store)", file=ctx.part.path)
    for manifest in manifests:
        if manifest.last_offset <= ctx.family.last_offset:
            continue
        try:
            entries = of_context(ctx).segment_entries(manifest)
        except FormatError as err:
            raise RlmError(f"cannot rebuild the local index: {err}") from err
        floor = ctx.family.last_offset
        ctx.family.append_segment([e for e in entries if e.first_offset > floor])
    ctx.manifests = manifests
    highest = max(remote_highest, saved.highest_tiered_offset, ctx.family.last_offset)
    start = manifests[0].base_offset if manifests else (highest + 1 if highest >= 0 else -1)
    ctx.progress = Progress(highest, start, saved.delete_records_offset)
    if ctx.family.sets and start >= 0:  # also when retention had deleted every remote segment
        ctx.family.remove_below(start)
    mark_dir(ctx)
    ctx.save_progress()
    ctx.recovered = True
    ctx.publish_gauges()


def observe(ctx: PartitionContext) -> None:
    """Load the partition's state read-only (``rlm status`` beside a running daemon): unlike
    :func:`recover` it resolves no journal attempt, repairs no file, writes no marker and deletes
    nothing."""
    if ctx.part.identity_error is not None:
        ctx.last_error = ctx.part.identity_error
        return
    resolve_root(ctx, decide=False)
    ctx.old_incarnations = find_old_incarnations(ctx, mark=False)
    ctx.manifests = of_context(ctx).list_manifests()
    saved = Progress.load(ctx.progress_path)
    remote_highest = ctx.manifests[-1].last_offset if ctx.manifests else -1
    start = ctx.manifests[0].base_offset if ctx.manifests else saved.remote_log_start_offset
    ctx.progress = Progress(max(saved.highest_tiered_offset, remote_highest), start,
                            saved.delete_records_offset)
    ctx.quarantined = Quarantine.load_all(ctx.quarantine_path)
    check_lineage(ctx, ctx.manifests, ctx.progress.highest_tiered_offset)
