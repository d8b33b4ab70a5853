"""``rlm restore``: Kafka partition directories from the remote tier (docs/restore.md).

For each partition of the topic in ``log.dirs`` (the directory may have lost every segment; its
``partition.metadata`` names the incarnation to restore, docs/topic-identity.md):

1. **Plan** (:func:`plan_restore`) — the store's chain (``RemoteState.chain``, what every
   reader serves, docs/cluster.md) of the incarnation's root (``remote_view``, as the export
   planner uses), clamped to what a consumer may see (``chain_visibility``: from the log start,
   DeleteRecords point included, up to the high watermark, docs/visibility.md), and started at the
   segment holding ``--from-offset`` or the first one with a record at or after
   ``--from-timestamp`` (whole segments).
2. **Stage** — every target ``OUT/<topic>-<partition>`` is checked first (an existing non-empty
   one is refused unless ``overwrite``), then each partition is written into a locked staging dir
   beside it (:class:`~rlm.jobs.staging.StagedDir`): its segments by
   :func:`rlm.jobs.restore.files.restore_segment`, ``parallelism`` at once, every object checked
   against its manifest's CRC-32C; then its own files by :func:`~rlm.jobs.restore.files.finish_partition`.
3. **Commit** — only when every partition is staged: each staging dir is fsynced and renamed into
   place, then the log dir's offset checkpoints get the restored partitions' entries (atomic
   replace; other partitions' entries kept). A failure before leaves nothing in ``OUT``; a killed
   restore leaves only a hidden staging dir, removed by the next restore to the same target.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rlm.cluster.leadership import metadata_log_dir, resolve_node_id
from rlm.config import Settings
from rlm.errors import (
    FormatError,
    IdentityConflictError,
    InvalidArgumentError,
    PartitionNotFoundError,
    RlmError,
)
from rlm.formats.checkpoint import format_offset_checkpoint, parse_offset_checkpoint
from rlm.fsutil import atomic_write
from rlm.jobs.restore.files import (
    OnBytes,
    RestoredSegment,
    RestorePlan,
    finish_partition,
    restore_segment,
)
from rlm.jobs.staging import StagedDir
from rlm.logdir.discovery import (
    LOG_START_OFFSET_CHECKPOINT,
    PARTITION_METADATA,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    PartitionDir,
    discover_partitions,
    list_segments,
    read_topic_id,
)
from rlm.logdir.kraft import KraftMetadataLog
from rlm.logdir.segment import log_end_offset
from rlm.storage.api import StorageBackend
from rlm.tiering.converge import log_end_conflict, persisted_progress
from rlm.tiering.local import crash_point, remote_view
from rlm.tiering.read import chain_visibility, check_topic_name
from rlm.tiering.store import Link, RemoteState, StoreProtection, object_keys

__all__ = ["PartitionRestore", "RestoreResult", "StartAt", "plan_restore", "restore"]

#: Segments restored at once by default: the work is store reads and file writes (threads).
DEFAULT_PARALLELISM = 4

#: The log dir's checkpoint files a restore writes entries into (docs/formats.md §2.2).
CHECKPOINTS = (RECOVERY_POINT_CHECKPOINT, REPLICATION_OFFSET_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT)


@dataclass(frozen=True, slots=True)
class StartAt:
    """Where the restored log starts: the segment holding ``offset``, or the first segment with a
    record at or after ``timestamp`` (ms since the epoch); neither = the log start."""

    offset: int | None = None
    timestamp: int | None = None


@dataclass(slots=True)
class PartitionRestore:
    """One partition's outcome: the segments written, the offsets its checkpoints got
    (``log_end_offset`` = high watermark = recovery point), or why nothing was restored."""

    topic: str
    partition: int
    topic_id: str | None
    directory: str | None = None
    segments: list[RestoredSegment] = field(default_factory=list)
    log_start_offset: int | None = None
    log_end_offset: int | None = None
    skipped: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "topic_id": self.topic_id,
            "dir": self.directory,
            "segments": len(self.segments),
            "bytes": sum(s.size for s in self.segments),
            "indexes_rebuilt": sum(1 for s in self.segments if s.rebuilt_indexes),
            "cut_segments": sum(1 for s in self.segments if s.cut),
            "log_start_offset": self.log_start_offset,
            "log_end_offset": self.log_end_offset,
            "high_watermark": self.log_end_offset,
            "skipped": self.skipped,
        }


@dataclass(frozen=True, slots=True)
class RestoreResult:
    out: str
    partitions: list[PartitionRestore]

    def to_json(self) -> dict[str, Any]:
        done = [p for p in self.partitions if p.skipped is None]
        return {
            "out": self.out,
            "partitions": [p.to_json() for p in self.partitions],
            "restored_partitions": len(done),
            "segments": sum(len(p.segments) for p in done),
            "bytes": sum(s.size for p in done for s in p.segments),
        }


def _select(links: Sequence[Link], log_start: int, visible_end: int, start: StartAt) -> list[Link]:
    """The chain's links to restore, each clamped below ``visible_end`` (module doc, step 1): a
    link's batches starting below its first offset are an earlier link's (an overlap), those
    ending above its last offset diverged or at/above the high watermark — both are cut away, at
    batch boundaries (restore/files.py)."""
    lowest = max(log_start, start.offset or 0)
    chosen = [lk for lk in links if lk.last_offset >= lowest and lk.first_offset < visible_end]
    if start.timestamp is not None:
        at = next(
            (i for i, lk in enumerate(chosen) if lk.manifest.max_timestamp >= start.timestamp), len(chosen)
        )
        chosen = chosen[at:]
    return [replace(lk, last_offset=min(lk.last_offset, visible_end - 1)) for lk in chosen]


def plan_restore(
    settings: Settings,
    backend: StorageBackend,
    part: PartitionDir,
    start: StartAt,
    protection: StoreProtection | None = None,
) -> tuple[RestorePlan, str | None]:
    """What to restore of ``part`` and, when it is nothing, why; ``protection`` opens protected
    segments (docs/protection.md). Raises :class:`IdentityConflictError` when the tiered data is not
    this incarnation's."""
    view = remote_view(settings.tiering, part)
    if not view.servable:
        raise IdentityConflictError(
            part.identity_error
            or "a lineage conflict is recorded for it: the "
            "tiered data is not this log's (docs/topic-identity.md)",
            file=part.path,
        )
    state = view.state(backend, part, protection=protection)
    links = state.chain().links  # what the store serves (docs/cluster.md), as the export planner
    segments = list_segments(part)
    if links and part.topic_id is None:
        conflict = log_end_conflict(log_end_offset(segments), links[-1].last_offset)
        if conflict is not None:
            raise IdentityConflictError(conflict, file=part.path)
    deleted = persisted_progress(settings.tiering, part).delete_records_offset
    highest, remote_start = (links[-1].last_offset, links[0].first_offset) if links else (-1, -1)
    ranges = chain_visibility(
        part, links, segments, backend, state.protection, policy=settings.log.eligibility, deleted=deleted
    ).offsets
    plan = RestorePlan(part.topic, part.partition, part.topic_id, state, (), 0)
    if not links:
        root = object_keys.root(part.topic, part.partition, state.key_id)
        return plan, f"nothing of it is tiered under {root}" + _other_incarnations(state, part)
    if ranges.log_start_offset is None or ranges.visible_end_offset is None:
        return plan, "nothing tiered is visible"
    chosen = _select(links, ranges.log_start_offset, ranges.visible_end_offset, start)
    if not chosen:
        what = (
            f"offset {start.offset}"
            if start.offset is not None
            else f"timestamp {start.timestamp}"
            if start.timestamp is not None
            else "its log start"
        )
        return plan, (
            f"no tiered segment below the high watermark {ranges.visible_end_offset} holds "
            f"records at or after {what} (tiered: {remote_start}-{highest})"
        )
    return RestorePlan(
        part.topic, part.partition, part.topic_id, state, tuple(chosen), ranges.log_start_offset
    ), None


def _other_incarnations(state: RemoteState, part: PartitionDir) -> str:
    """When the directory's incarnation has nothing tiered: the topic ids the store holds data of
    for the partition (one listing), so a directory re-made after a lost disk can name one."""
    found = sorted(state.other_id_roots(state.key_id))
    if not found:
        return ""
    return (
        f"; the store holds the incarnation(s) with topic id {', '.join(found)}: to restore one, "
        f"put its {PARTITION_METADATA} into {part.path} (docs/restore.md)"
    )


def _partitions(settings: Settings, topic: str, partitions: Sequence[int] | None) -> list[PartitionDir]:
    """The partitions to restore: their directories in ``log.dirs``, and those the cluster's KRaft
    metadata log assigns to this broker that have none (a lost disk, docs/restore.md)."""
    check_topic_name(topic)
    found = [
        p
        for p in discover_partitions(settings.log.dirs)
        if p.topic == topic and (not partitions or p.partition in partitions)
    ]
    found += _from_metadata(settings, topic, partitions, {p.partition for p in found})
    found.sort(key=lambda p: p.partition)
    missing = sorted(set(partitions or ()) - {p.partition for p in found})
    if missing or not found:
        which = ", ".join(f"{topic}-{n}" for n in missing) if missing else f"topic {topic}"
        dirs = ", ".join(map(str, settings.log.dirs))
        source = metadata_log_dir(settings)
        raise PartitionNotFoundError(
            f"{which} is not in log.dirs ({dirs})"
            + (f" nor in the metadata log {source}" if source is not None else ", and no KRaft metadata log")
            + ": restore reads the incarnation from a partition directory or the cluster's "
            "metadata (docs/restore.md)"
        )
    return found


def _from_metadata(
    settings: Settings, topic: str, wanted: Sequence[int] | None, present: set[int]
) -> list[PartitionDir]:
    """Partitions of ``topic`` without a directory in ``log.dirs`` that the KRaft metadata log
    (``[topics] metadata_log_dir`` or ``__cluster_metadata-0`` in a log dir) knows: those named
    in ``wanted``, else those whose replicas include this broker (every one when its node id is
    unknown). Each gets the topic id the cluster holds and a path in the first log dir."""
    directory = metadata_log_dir(settings)
    if directory is None or not settings.log.dirs or not directory.is_dir():
        return []
    known = KraftMetadataLog(directory).poll().topic(topic)
    if known is None:
        return []
    node = resolve_node_id(settings, required=False)
    log_dir = Path(settings.log.dirs[0])
    return [
        PartitionDir(log_dir, topic, n, log_dir / f"{topic}-{n}", known.topic_id)
        for n, part in sorted(known.partitions.items())
        if n not in present and (n in wanted if wanted else node is None or node in part.replicas)
    ]


def _target(out: Path, plan: RestorePlan, overwrite: bool) -> StagedDir:
    """The staging dir of ``out/<partition>``. An existing empty directory counts as absent (it is
    replaced at the commit, so a failed restore leaves it as it was), and so does one holding only
    the ``partition.metadata`` of the incarnation restored: the stub docs/restore.md has an
    operator make after a lost disk, which is the target itself when ``out`` is that log dir."""
    target = out / plan.name
    replaceable = target.is_dir() and not target.is_symlink()
    if replaceable:
        names = [p.name for p in target.iterdir()]
        stub = names == [PARTITION_METADATA] and plan.topic_id is not None
        replaceable = not names or (stub and _topic_id_of(target) == plan.topic_id)
    return StagedDir.begin(target, overwrite or replaceable)


def _topic_id_of(directory: Path) -> str | None:
    try:
        return read_topic_id(directory)
    except RlmError:  # a malformed file is not the stub restore would write: refuse the target
        return None


def _read_checkpoints(out: Path) -> dict[str, dict[tuple[str, int], int]]:
    """The log dir's current checkpoint entries (a malformed file fails here, before any write)."""
    found = {}
    for name in CHECKPOINTS:
        path = out / name
        try:
            entries = parse_offset_checkpoint(path.read_bytes()).entries
        except FileNotFoundError:
            entries = {}
        except FormatError as err:
            raise err.in_file(path) from err
        found[name] = dict(entries)
    return found


def _write_checkpoints(
    out: Path, current: dict[str, dict[tuple[str, int], int]], done: Sequence[PartitionRestore]
) -> None:
    """Entries for the restored partitions (docs/restore.md "What comes back"): recovery point and
    high watermark = the restored log end; a log start entry only when it is above the first
    segment's base, as Kafka writes it (otherwise an old entry is removed)."""
    for p in done:
        key = (p.topic, p.partition)
        assert p.log_end_offset is not None and p.log_start_offset is not None
        current[RECOVERY_POINT_CHECKPOINT][key] = p.log_end_offset
        current[REPLICATION_OFFSET_CHECKPOINT][key] = p.log_end_offset
        if p.log_start_offset > p.segments[0].base_offset:
            current[LOG_START_OFFSET_CHECKPOINT][key] = p.log_start_offset
        else:
            current[LOG_START_OFFSET_CHECKPOINT].pop(key, None)
    for name in CHECKPOINTS:
        atomic_write(out / name, format_offset_checkpoint(current[name]).encode("ascii"))


def _write_all(
    todo: Sequence[tuple[RestorePlan, PartitionRestore]],
    staged: Sequence[StagedDir],
    interval: int,
    parallelism: int,
    on_bytes: OnBytes,
) -> None:
    """Every segment of every partition into its staging dir, ``parallelism`` at a time (threads:
    the work is store reads and file writes), then each partition's own files. The first failure
    cancels what has not started and waits for what runs, so nothing writes after it."""
    jobs = [(n, seg) for n, (plan, _res) in enumerate(todo) for seg in plan.segments]
    with ThreadPoolExecutor(max(1, min(parallelism, len(jobs))), "rlm-restore") as pool:
        futures = [
            pool.submit(restore_segment, todo[n][0].state, seg, staged[n].staging, interval, on_bytes)
            for n, seg in jobs
        ]
        try:
            done = [f.result() for f in futures]
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    by_partition: dict[int, list[tuple[Link, RestoredSegment | None]]] = {}
    for (n, seg), result in zip(jobs, done, strict=True):
        by_partition.setdefault(n, []).append((seg, result))
    for n, (plan, res) in enumerate(todo):
        res.segments = finish_partition(plan, staged[n].staging, by_partition.get(n, []))
        if not res.segments:  # every kept segment was cut to nothing
            res.skipped = "no whole batch below the high watermark"
            continue
        res.directory = str(staged[n].out)
        res.log_start_offset = max(plan.log_start, res.segments[0].base_offset)
        res.log_end_offset = res.segments[-1].last_offset + 1


def restore(
    settings: Settings,
    backend: StorageBackend,
    topic: str,
    out: Path,
    *,
    partitions: Sequence[int] | None = None,
    start: StartAt = StartAt(),
    overwrite: bool = False,
    parallelism: int = DEFAULT_PARALLELISM,
    on_bytes: OnBytes | None = None,
    on_plan: Callable[[int], None] | None = None,
) -> RestoreResult:
    """Restore ``topic``'s partitions (all in ``log.dirs``, or ``partitions``) into the log dir
    ``out`` (module doc), ``parallelism`` segments at a time. ``on_plan`` gets the total ``.log``
    bytes to read, ``on_bytes`` each chunk read (from the worker threads)."""
    if start.offset is not None and start.timestamp is not None:
        raise InvalidArgumentError("give --from-offset or --from-timestamp, not both")
    if parallelism < 1:
        raise InvalidArgumentError(f"parallelism {parallelism} must be at least 1")
    out = out.absolute()
    parts = _partitions(settings, topic, partitions)
    protection = StoreProtection.from_settings(settings.remote)  # reads the key files once
    planned = [plan_restore(settings, backend, part, start, protection) for part in parts]
    results = [PartitionRestore(p.topic, p.partition, p.topic_id, skipped=why) for p, why in planned]
    todo = [(plan, res) for (plan, why), res in zip(planned, results, strict=True) if why is None]
    if not todo:
        raise InvalidArgumentError(
            f"{topic}: nothing to restore: "
            + "; ".join(f"{r.topic}-{r.partition}: {r.skipped}" for r in results)
        )
    if on_plan is not None:
        on_plan(sum(s.manifest.log.size for plan, _ in todo for s in plan.segments))
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    staged: list[StagedDir] = []
    try:
        current = _read_checkpoints(out)
        for plan, _ in todo:
            staged.append(_target(out, plan, overwrite))
        _write_all(
            todo, staged, settings.log.index_interval_bytes, parallelism, on_bytes or (lambda _n: None)
        )
    except BaseException:
        for stage in staged:
            stage.abort(settle_s=0)
        if created:
            _remove_if_empty(out)
        raise
    for n, ((_plan, res), stage) in enumerate(zip(todo, staged, strict=True)):
        if n:
            crash_point("restore_mid_commit")
        if res.skipped is None:
            stage.commit()
        else:
            stage.abort(settle_s=0)
    done = [res for _plan, res in todo if res.skipped is None]
    _write_checkpoints(out, current, done)
    return RestoreResult(str(out), results)


def _remove_if_empty(path: Path) -> None:
    """A failed restore leaves no trace: the log dir it created goes too (only when empty)."""
    with contextlib.suppress(OSError):  # not empty (someone else wrote there) or already gone
        path.rmdir()
