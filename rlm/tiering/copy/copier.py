"""The copy protocol for one segment (docs/architecture.md §3): pin, checksum, journal, upload, manifest,
index.

Order is what makes it crash-safe:

1. **pin** — hard-link the segment's files into a private staging dir, so the log store's
   retention (or its rename to ``.deleted``) cannot pull them away mid-copy;
2. **checksum** — CRC-verify every batch of the pinned ``.log``; a corrupt segment is quarantined and
   never committed (steps 1–2: :mod:`rlm.tiering.copy.prepare`); build the segment's
   ``.remotelogindex`` entries. Done ahead for the next segment during the current copy; for a
   segment nothing prepared (the first of a pass), while its ``.log`` already uploads (step 3
   for the ``.log`` alone, :func:`_copy_overlapped`): a failed walk deletes what was uploaded;
3. **journal** COPY_STARTED, then upload the data objects under attempt-unique keys, then the
   segment's entries object, then the **manifest last** with "create only if absent" — the commit;
4. append the entries to the local active index set (fsynced), journal COPY_FINISHED, unpin.

Steps 1–3 up to the uploads are :func:`stage_segment` (:func:`start_staging` for a segment whose
upload overlaps the commit of the one before it: a pipelined copy, at most two attempts open),
the manifest and step 4 :func:`commit_staged`; a pipelined attempt whose predecessor did not
commit is discarded by :func:`drop_staged` (docs/architecture.md §3 "Pipelined copies").

A crash anywhere converges on restart (:mod:`rlm.tiering.converge.recovery`). Crash points
(:mod:`rlm.tiering.local.crash`) mark each step for the crash tests.

A segment that straddles the highest tiered offset (a replica that rolled elsewhere than the one
whose sidecar tiered so far) is copied *partially*: step 2 cuts the pinned ``.log`` at the first
batch above it and rebuilds the indexes for that tail; the copy is then named by that batch's
base offset (docs/cluster-copy.md).
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlm.errors import FormatError, ObjectExistsError, StorageError
from rlm.formats.checkpoint import parse_leader_epoch_checkpoint
from rlm.formats.indexes.remote_index import RemoteLogIndexEntry
from rlm.logdir.discovery import SegmentFiles
from rlm.storage.api import ObjectInfo
from rlm.tiering.copy.prepare import PinnedSegment, PreparedSegment, data_key, pin_segment, verify_pinned
from rlm.tiering.copy.seal import Uploaded, upload_attempt
from rlm.tiering.copy.txn_capture import state_before_copy
from rlm.tiering.copy.upload import UploadControl, upload_file
from rlm.tiering.local import PartitionContext, crash_point, of_context
from rlm.tiering.store import SegmentManifest, StoredObject, object_keys

__all__ = [
    "CopyResult",
    "StagedCopy",
    "commit_staged",
    "copy_segment",
    "drop_staged",
    "stage_segment",
    "start_staging",
]

log = logging.getLogger(__name__)

#: How long a pipelined copy's start waits for the next ``.log``'s first requests (seconds): its
#: upload may wait for a slot other partitions hold, and the commit must not wait long for it.
SENDING_WAIT_S = 0.05


@dataclass(frozen=True, slots=True)
class CopyResult:
    manifest: SegmentManifest
    entries: list[RemoteLogIndexEntry]
    already_committed: bool  # an earlier attempt had committed this segment: its manifest is kept
    #: the manifest as the store acknowledged this attempt's create (None: already committed), so
    #: the next listing knows it without reading it back (rlm.tiering.converge.sync.note_committed)
    stored: ObjectInfo | None = None


def _leader_epochs(path: Path | None, first: int, last: int) -> tuple[tuple[int, int], ...]:
    """Leader-epoch entries that apply to offsets [first, last]: the one in force at ``first``
    and every later one starting at or before ``last``."""
    if path is None:
        return ()
    try:
        entries = parse_leader_epoch_checkpoint(path.read_text()).entries
    except (OSError, FormatError) as err:
        log.warning("ignoring unreadable %s: %s", path, err)
        return ()
    in_force = [e for e in entries if e.start_offset <= first][-1:]
    later = [e for e in entries if first < e.start_offset <= last]
    return tuple((e.epoch, e.start_offset) for e in in_force + later)


def _describe(m: SegmentManifest) -> str:
    """What a conflict message compares: offsets, size, checksum and leader epochs of a segment."""
    epochs = ", ".join(f"{e}@{o}" for e, o in m.leader_epochs) or "none"
    return (
        f"offsets {m.base_offset}-{m.last_offset}, {m.size_bytes} bytes, log CRC-32C "
        f"{m.log.crc32c:#010x}, leader epochs [{epochs}], attempt {m.attempt_id}"
    )


def _commit(
    ctx: PartitionContext,
    manifest: SegmentManifest,
    objects: dict[str, StoredObject],
    entries: list[RemoteLogIndexEntry],
) -> tuple[SegmentManifest, list[RemoteLogIndexEntry], ObjectInfo | None]:
    """Create the manifest only if absent (the commit); ``(manifest, entries, stored)``: ``stored``
    the created object's info, None when an earlier attempt had committed the segment.

    When another attempt (e.g. the sidecar of another replica) committed the same bytes first, its
    manifest is kept and this attempt's objects deleted; a different segment at that base is a
    :class:`StorageError` saying what differs.
    """
    shared = ctx.shared
    manifest_key = object_keys.manifest_key(ctx.topic, ctx.partition, manifest.base_offset, ctx.key_id)
    manifest = shared.protection.seal_manifest(manifest, manifest_key)
    try:
        # A retried create that finds its own lost-ack manifest succeeds (rlm.storage.retry).
        stored = shared.backend.put(manifest_key, manifest.to_json(), if_absent=True)
        return manifest, entries, stored
    except ObjectExistsError:
        remote = of_context(ctx)
        existing = remote.read_manifest(manifest_key)
    if not existing.same_segment_as(manifest):
        raise StorageError(
            f"remote already holds a different segment at base offset {manifest.base_offset} "
            f"(remote: {_describe(existing)}; local: {_describe(manifest)})",
            file=manifest_key,
        )
    shared.backend.delete_many(o.key for o in objects.values())
    log.info(
        "%s-%d: segment %d-%d was already tiered by another sidecar (attempt %s); dropped this "
        "node's duplicate upload (attempt %s, %d bytes)",
        ctx.topic,
        ctx.partition,
        existing.base_offset,
        existing.last_offset,
        existing.attempt_id,
        manifest.attempt_id,
        sum(o.size for o in objects.values()),
    )
    return existing, remote.segment_entries(existing), None


def _manifest_of(
    ctx: PartitionContext, segment: SegmentFiles, prep: PreparedSegment, uploaded: Uploaded
) -> SegmentManifest:
    """The manifest committing ``prep``'s uploaded attempt (docs/formats.md §6.3): offsets and
    timestamps of its batches, its objects and entries, the leader epochs in force over its
    offsets, its aborted transactions and protection."""
    checksummed, pinned, base = prep.checksummed, prep.pinned, prep.base_offset
    first, last = checksummed.batches[0], checksummed.batches[-1]
    partial = prep.source_position is not None
    return SegmentManifest(
        topic=ctx.topic,
        partition=ctx.partition,
        base_offset=base,
        last_offset=last.last_offset,
        first_timestamp=first.base_timestamp if first.magic >= 2 else -1,
        max_timestamp=max(b.max_timestamp for b in checksummed.batches),
        size_bytes=checksummed.size,
        record_batches=len(checksummed.batches),
        index_entries=len(uploaded.entries),
        attempt_id=prep.attempt,
        created_ms=ctx.shared.clock_ms(),
        objects=uploaded.objects,
        leader_epochs=_leader_epochs(
            pinned.get(object_keys.LEADER_EPOCHS), first.base_offset, last.last_offset
        ),
        source_base_offset=segment.base_offset if partial else None,
        source_position=prep.source_position,
        txn_index=prep.txn.manifest_field(state_before_copy(segment, pinned, base, partial, ctx.manifests))
        if prep.txn is not None
        else None,
        protection=uploaded.protection,
    )


def _journal_start(ctx: PartitionContext, base: int, attempt: str) -> None:
    """Journal COPY_STARTED (fsynced, before any upload) and mark the attempt in flight (GC
    leaves its objects alone)."""
    ctx.journal.append("COPY_STARTED", base, attempt)
    ctx.in_flight.add(attempt)
    crash_point("after_journal_start")


def _upload(
    ctx: PartitionContext,
    prep: PreparedSegment,
    log_upload: Callable[[], StoredObject] | None = None,
    control: UploadControl | None = None,
) -> Uploaded:
    """Upload the attempt's objects under its attempt-unique keys (steps 3–5 of
    docs/architecture.md §3); COPY_STARTED is journaled already. ``log_upload``: the ``.log``'s
    upload, already running (:func:`_copy_overlapped`); ``control``: signals to and from the ``.log``'s."""
    # The segment's base (its file name) for a whole segment, not its first batch's: they differ
    # after compaction, and keys, journal, retention and GC all name a segment by this base. A
    # partial copy is named by its first batch (docs/cluster-copy.md).
    base, attempt = prep.base_offset, prep.attempt
    # Plaintext or sealed (compressed/encrypted, docs/protection.md): rlm/tiering/copy/seal.py.
    return upload_attempt(
        ctx,
        prep.pinned,
        prep.txn.path if prep.txn is not None else None,
        prep.entries,
        prep.checksummed.batches,
        base,
        attempt,
        functools.partial(data_key, ctx, base, attempt),
        prep.checksummed.crc32c,
        log_upload,
        control,
    )


@dataclass(frozen=True, slots=True)
class StagedCopy:
    """An attempt whose objects are all stored and whose manifest is not written yet (steps 1–5
    done, COPY_STARTED open): :func:`commit_staged` commits it, :func:`drop_staged` discards it.
    ``started``: ``time.monotonic()`` when its copy began."""

    segment: SegmentFiles
    prep: PreparedSegment
    uploaded: Uploaded
    started: float


def _finish(ctx: PartitionContext, staged: StagedCopy) -> CopyResult:
    """Commit the uploaded attempt (the manifest), then record it locally (steps 6–8)."""
    shared, prep, uploaded = ctx.shared, staged.prep, staged.uploaded
    base, attempt = prep.base_offset, prep.attempt
    crash_point("after_data")
    manifest = _manifest_of(ctx, staged.segment, prep, uploaded)
    manifest, entries, stored = _commit(ctx, manifest, uploaded.objects, uploaded.entries)
    shared.protection.remember(manifest)  # the daemon's readers open it without a manifest GET
    crash_point("after_manifest")

    ctx.family.append_segment(entries)
    crash_point("before_journal_finish")
    ctx.journal.append("COPY_FINISHED", base, attempt)
    ctx.in_flight.discard(attempt)
    ctx.series(shared.metrics.copy_requests).inc()
    ctx.series(shared.metrics.copy_seconds).observe(time.monotonic() - staged.started)
    return CopyResult(manifest, entries, stored is None, stored)


def commit_staged(ctx: PartitionContext, staged: StagedCopy) -> CopyResult:
    """Commit ``staged`` (steps 6–8) and drop its pin, whether the commit succeeds or raises (a
    failed commit leaves its attempt open: recovery resolves it by the store, as after a crash)."""
    try:
        return _finish(ctx, staged)
    finally:
        ctx.in_flight.discard(staged.prep.attempt)
        staged.prep.discard()


def _drop_attempt(ctx: PartitionContext, base: int, attempt: str) -> None:
    """Delete what an attempt that must not commit uploaded, and journal it aborted; when the
    store refuses, the attempt stays open for recovery (and its objects for GC) to remove."""
    try:
        deleted = of_context(ctx).delete_attempt(base, attempt)
    except StorageError as err:
        log.warning("%s-%d: could not delete attempt %s yet: %s", ctx.topic, ctx.partition, attempt, err)
        return
    ctx.journal.append("COPY_ABORTED", base, attempt)
    log.info(
        "%s-%d: dropped attempt %s (%d objects deleted)", ctx.topic, ctx.partition, attempt, len(deleted)
    )


def _copy_overlapped(
    ctx: PartitionContext, pin: PinnedSegment, started: float, on_started: Callable[[], object] | None
) -> StagedCopy:
    """Copy a pinned whole plaintext segment whose checksum walk was not done ahead: its ``.log``
    uploads (on a helper thread) while this thread CRC-verifies it, so the walk and the upload
    read the file at the same time instead of one after the other.

    Verification still decides: a walk that fails cancels the upload, deletes what it stored
    (an attempt key nothing names) and raises, before any manifest — the segment is quarantined
    as when it was checked first. The companions and entries object follow the walk."""
    base, attempt = pin.segment.base_offset, pin.attempt
    control = UploadControl()
    _journal_start(ctx, base, attempt)
    with (
        ctx.shared.upload_slots,
        concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rlm-copy-log") as pool,
    ):
        log_up = pool.submit(
            upload_file,
            ctx,
            data_key(ctx, base, attempt, object_keys.LOG),
            pin.pinned[object_keys.LOG],
            watch_half=True,
            control=control,
        )
        try:
            prep = verify_pinned(ctx, pin)
            if on_started is not None:  # after the walk: two walks at once starved the part threads
                on_started()
        except BaseException:
            control.cancel.set()
            concurrent.futures.wait([log_up])
            _drop_attempt(ctx, base, attempt)
            raise
        uploaded = _upload(ctx, prep, log_up.result)
    return StagedCopy(pin.segment, prep, uploaded, started)


def copy_segment(
    ctx: PartitionContext,
    segment: SegmentFiles,
    prepared: PreparedSegment | None = None,
    from_offset: int | None = None,
    on_started: Callable[[], object] | None = None,
) -> CopyResult | None:
    """Copy one rolled segment: :func:`stage_segment`, then :func:`commit_staged`; None when it
    holds no batch to copy."""
    staged = stage_segment(ctx, segment, prepared, from_offset, on_started)
    return None if staged is None else commit_staged(ctx, staged)


def stage_segment(
    ctx: PartitionContext,
    segment: SegmentFiles,
    prepared: PreparedSegment | None = None,
    from_offset: int | None = None,
    on_started: Callable[[], object] | None = None,
) -> StagedCopy | None:
    """Steps 1–5 of one rolled segment's copy (from ``from_offset`` on, see
    :func:`prepare_segment`), on this thread: its objects stored, its manifest not written; None
    when it holds no batch to copy (an empty .log is quarantined by the checksum walk instead,
    docs/broker-files.md, so this is defensive).

    ``prepared`` is the segment's :func:`prepare_segment` result when it was done ahead; it is
    consumed either way (its pin dropped on failure, else by the commit). Without it the segment
    is pinned here and, for a whole plaintext segment, checksummed while its ``.log`` uploads
    (:func:`_copy_overlapped`). ``on_started`` is called once the segment is pinned and its upload
    is starting (in the overlapped copy, once its checksum walk is done): the caller may then
    prepare the next one (its pin comes after this one's, and its checksum walk, which holds the
    GIL, does not delay this copy's journal and first requests).
    Raises :class:`SegmentVanished`, :class:`SegmentQuarantined` or a storage error; in every case
    the attempt leaves nothing a reader can see and recovery/GC clean up after it.
    """
    started = time.monotonic()
    if prepared is None:
        pin = pin_segment(ctx, segment, from_offset)
        try:
            if pin.source_position is None and not ctx.shared.protection.writes_protected:
                try:  # its pin dir becomes the staged copy's, dropped by its commit
                    return _copy_overlapped(ctx, pin, started, on_started)
                except BaseException:
                    ctx.in_flight.discard(pin.attempt)
                    raise
            prepared = verify_pinned(ctx, pin)
        except BaseException:
            pin.discard()  # idempotent: the overlapped copy may have dropped it already
            raise
    prep = prepared
    try:
        if not prep.checksummed.batches:
            prep.discard()
            return None
        _journal_start(ctx, prep.base_offset, prep.attempt)
        if on_started is not None:
            on_started()
        return StagedCopy(segment, prep, _upload(ctx, prep), started)
    except BaseException:
        ctx.in_flight.discard(prep.attempt)
        prep.discard()
        raise


def start_staging(
    ctx: PartitionContext,
    segment: SegmentFiles,
    prep: PreparedSegment,
    pool: concurrent.futures.Executor,
    control: UploadControl,
) -> concurrent.futures.Future[StagedCopy]:
    """Steps 4–5 of a prepared segment (with batches) whose upload is to overlap the tail of the
    one before it and its commit (a pipelined copy, docs/architecture.md §3): COPY_STARTED journaled on this
    thread (the journal's one writer), its objects uploaded on ``pool``. At most this attempt and
    the one before it are open (``Journal.quiescent``); it is committed only after that one is.
    Returns once its ``.log``'s requests are under way (``control.sending``), or after
    :data:`SENDING_WAIT_S`: the commit that follows would otherwise hold the GIL while the upload
    starts. ``control.cancel`` set stops the upload; :func:`drop_staged` then discards it."""
    started = time.monotonic()
    _journal_start(ctx, prep.base_offset, prep.attempt)
    upload = pool.submit(lambda: StagedCopy(segment, prep, _upload(ctx, prep, control=control), started))
    upload.add_done_callback(lambda _: _over(control))
    control.sending.wait(SENDING_WAIT_S)
    return upload


def _over(control: UploadControl) -> None:
    """An upload that ended (or failed) before its signals: release whoever waits on them."""
    control.sending.set()
    control.dispatched.set()


def drop_staged(
    ctx: PartitionContext,
    prep: PreparedSegment,
    upload: concurrent.futures.Future[StagedCopy],
    control: UploadControl,
) -> None:
    """Discard a pipelined attempt that must not commit (the one before it did not): cancel and
    wait for its upload, delete what it stored and journal it aborted (:func:`_drop_attempt`:
    left open for recovery when the store refuses), drop its pin. Never raises but for a bug."""
    control.cancel.set()
    concurrent.futures.wait([upload])
    try:
        _drop_attempt(ctx, prep.base_offset, prep.attempt)
    finally:
        ctx.in_flight.discard(prep.attempt)
        prep.discard()
