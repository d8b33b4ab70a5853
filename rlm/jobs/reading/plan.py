"""Driver-side planning of tiered reads: which bytes of which object/file each Spark task reads.

Pure Python (no pyspark): a plan is a list of :class:`ReadTask`, each a half-open byte range of one
remote object or one local segment file, cut at batch boundaries, so every task can be read with
ONE ranged request and decoded on its own.

Tiers never overlap in a plan, and only visible offsets ``[log start, visible end)`` are planned
(docs/visibility.md: nothing at or above the high watermark, nothing below a DeleteRecords point).
Per partition, with ``H`` = the last offset of the last remote manifest (-1 when nothing is remote):

* **remote** — every manifest (committed segment), records ``base_offset ≤ o ≤ last_offset``
  clamped to the visible range;
  the byte ranges come from the segment's ``.remotelogindex`` entries, taken from the local index
  sets when they hold the segment's entries and else from the segment's uploaded entries object
  (``manifest.ENTRIES_OBJECT``). Entries are packed into tasks of consecutive entries of one object
  up to ``target_bytes``;
* **local** — records ``max(H + 1, log start offset) ≤ o < visible end`` (the high watermark, or
  what docs/visibility.md assumes without one), from the local segments by byte ranges cut
  at ``.index`` positions. Local tasks read files on the sidecar host: run them with executors on
  that host (``local[*]``), or export only what is tiered.

Pruning by time ``[start, end)`` (ms, half-open on record timestamps) is exact: a segment whose
manifest ``max_timestamp < start`` and an entry whose ``last_timestamp`` (the max batch max
timestamp of the entry) ``< start`` cannot hold a record in range. ``end`` prunes only with
``ordered_timestamps=True`` (entries whose first batch base timestamp is ``≥ end`` are skipped —
exact only when no record is older than the first batch of its entry). Readers filter every record
against the range, so pruning only ever saves I/O.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from rlm.config import Settings
from rlm.config.protection_settings import read_key_file
from rlm.errors import InvalidArgumentError
from rlm.formats import naming
from rlm.formats.indexes.remote_index import RemoteLogIndexEntry
from rlm.formats.indexes.segment_index import DEFAULT_INDEX_INTERVAL_BYTES
from rlm.jobs.reading.byte_ranges import local_ranges, pack_entries
from rlm.jobs.reading.ship import check_build, rlm_build
from rlm.logdir.discovery import (
    EligibilityPolicy,
    PartitionDir,
    SegmentFiles,
    discover_partitions,
    list_segments,
)
from rlm.logdir.index_sets import read_local_entries
from rlm.logdir.segment import log_end_offset
from rlm.storage.api import StorageBackend
from rlm.storage.registry import backend_class, open_backend
from rlm.tiering.converge import log_end_conflict, persisted_progress
from rlm.tiering.local import Progress, RemoteView, remote_view
from rlm.tiering.read import Isolation, PartitionTxns, chain_visibility
from rlm.tiering.store import KeyRing, Link, RemoteState, SegmentManifest, StoreProtection

__all__ = [
    "DEFAULT_TARGET_BYTES",
    "MAX_OFFSET",
    "BackendSpec",
    "PartitionPlan",
    "ReadPlan",
    "ReadTask",
    "check_time_range",
    "plan_partition",
    "plan_read",
    "select_partitions",
]

MAX_OFFSET = 2**63 - 1
DEFAULT_TARGET_BYTES = 32 * 1024 * 1024
_PLAN_THREADS = 8


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """A backend as plain data (entry-point name + options): what is shipped to executors.

    :meth:`create` builds it once per Python process (Spark reuses its Python workers), so tasks
    of one worker share one client/connection pool.
    """

    name: str
    options: dict[str, Any]
    #: The driver's :func:`~rlm.jobs.reading.ship.rlm_build`, checked where the backend is created
    #: ("" = none).
    build: str = ""
    #: ``[remote] prefix_spread`` (docs/key-spread.md): executors map keys as the driver does.
    prefix_spread: int = 0
    #: ``[remote.encryption] key_files`` as ``(id, absolute path)``: executors read the key files
    #: themselves (key material is never shipped in a task; docs/protection.md).
    key_files: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> BackendSpec:
        """The configured store as the driver sees it: options that name paths are made absolute
        here, since executors run in other working directories (docs/spark-cluster.md)."""
        name = settings.remote.backend
        files = tuple((k, str(v)) for k, v in sorted(settings.remote.encryption.key_files.items()))
        return cls(
            name,
            backend_class(name).portable_options(settings.remote.options),
            rlm_build(),
            settings.remote.prefix_spread,
            files,
        )

    def protection(self) -> StoreProtection:
        """Opens protected segments with the key files named (read once per process)."""
        found = _PROTECTIONS.get(self.key_files)
        if found is None:
            ring = None
            if self.key_files:
                ring = KeyRing({k: read_key_file(k, Path(p)) for k, p in self.key_files})
            found = _PROTECTIONS[self.key_files] = StoreProtection(ring=ring)
        return found

    def create(self) -> StorageBackend:
        """The backend, once per process; first checks this process runs the driver's rlm."""
        check_build(self.build)
        cache_key = (self.name, json.dumps(self.options, sort_keys=True, default=str), self.prefix_spread)
        backend = _BACKENDS.get(cache_key)
        if backend is None:  # the key layout checked once per process too (one GET)
            backend = _BACKENDS[cache_key] = open_backend(self.name, self.options, self.prefix_spread)
        return backend


_BACKENDS: dict[tuple[str, str, int], StorageBackend] = {}
_PROTECTIONS: dict[tuple[tuple[str, str], ...], StoreProtection] = {}
# A forked child (the local export engine's process workers) must not share the parent's clients
# and connection pools: it builds its own.
os.register_at_fork(after_in_child=_BACKENDS.clear)


@dataclass(frozen=True, slots=True)
class ReadTask:
    """One Spark task: bytes ``[start, end)`` of a remote object (``source="remote"``, ``location`` =
    key) or a local ``.log`` file (``location`` = path), starting at a batch boundary.

    Only records with ``min_offset ≤ offset ≤ max_offset`` and ``start_ts ≤ timestamp < end_ts``
    (None = unbounded) are produced; control batches never are.
    """

    topic: str
    partition: int
    source: Literal["remote", "local"]
    location: str
    start: int
    end: int
    min_offset: int
    max_offset: int
    start_ts: int | None = None
    end_ts: int | None = None
    base_offset: int = -1  # the segment's base offset (for error messages)
    #: read_committed (docs/transactions.md): the aborted transactions overlapping the task's
    #: offsets as ``(producer id, first offset, last offset)``; the reader filters with them.
    isolation: str = "read_uncommitted"
    aborted: tuple[tuple[int, int, int], ...] = ()
    #: The segment is stored compressed/encrypted (docs/protection.md): its manifest (JSON) and the
    #: task's entries (encoded), so the executor opens each entry of the range. None: plaintext.
    sealed: tuple[bytes, bytes] | None = None

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass
class PartitionPlan:
    """What the planner found for one partition (for summaries and tests)."""

    topic: str
    partition: int
    topic_id: str | None = None  # the incarnation planned (partition.metadata; docs/topic-identity.md)
    manifests: list[SegmentManifest] = field(default_factory=list)
    highest_tiered_offset: int = -1
    local_min_offset: int = 0
    local_max_offset: int = MAX_OFFSET
    tasks: list[ReadTask] = field(default_factory=list)
    pruned_segments: int = 0
    pruned_entries: int = 0


@dataclass
class ReadPlan:
    partitions: list[PartitionPlan]

    @property
    def tasks(self) -> list[ReadTask]:
        return [t for p in self.partitions for t in p.tasks]


def check_time_range(start: int | None, end: int | None) -> None:
    if start is not None and start < 0:
        raise InvalidArgumentError(f"start timestamp {start} must be >= 0 (ms since the epoch)")
    if end is not None and end < 0:
        raise InvalidArgumentError(f"end timestamp {end} must be >= 0 (ms since the epoch)")
    if start is not None and end is not None and end < start:
        raise InvalidArgumentError(f"time range [{start}, {end}) is empty: end is before start")


def select_partitions(
    settings: Settings,
    topics: Sequence[str] | None,
    partitions: Sequence[int] | None = None,
    *,
    served: bool = False,
) -> list[PartitionDir]:
    """The discovered partitions of ``topics`` (all when None), optionally only ``partitions``;
    ``served``: only those whose records may be served to users (jobs that hand records or offsets
    out, not the store's checks; docs/visibility.md, "Internal topics")."""
    wanted = {naming.validate_topic(t) for t in topics} if topics else None
    internal = settings.server.serve_internal_topics
    return [
        p
        for p in discover_partitions(settings.log.dirs)
        if (wanted is None or p.topic in wanted)
        and (partitions is None or p.partition in set(partitions))
        and (not served or naming.is_served_topic(p.topic, internal=internal))
    ]


def _group_by_object(
    backend: StorageBackend, entries: Iterable[RemoteLogIndexEntry]
) -> dict[str, list[RemoteLogIndexEntry]]:
    out: dict[str, list[RemoteLogIndexEntry]] = {}
    for e in entries:
        try:
            key = backend.key_for_url(e.rdi.url)
        except ValueError:
            continue  # written through another store's URL form: use the uploaded entries instead
        out.setdefault(key, []).append(e)
    return out


def plan_partition(
    part: PartitionDir,
    backend: StorageBackend,
    *,
    start: int | None = None,
    end: int | None = None,
    target_bytes: int = DEFAULT_TARGET_BYTES,
    include_local: bool = True,
    ordered_timestamps: bool = False,
    index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
    policy: EligibilityPolicy = "high-watermark",
    progress: Progress | None = None,
    view: RemoteView | None = None,
    isolation: Isolation = "read_uncommitted",
    min_offset: int = 0,
    protection: StoreProtection | None = None,
) -> PartitionPlan:
    """Plan one partition (see the module doc for the tier split and the pruning rules);
    ``index_interval_bytes`` rebuilds a broken local ``.index`` (docs/broker-files.md).

    Only visible offsets are planned (docs/visibility.md): ``policy`` (``log.eligibility``) says
    what is visible without a high watermark; ``progress`` (what the daemon persisted) brings the
    DeleteRecords point the broker may have forgotten. ``view`` says which remote data is this
    incarnation's (docs/topic-identity.md; default: its own root); remote data is left out when it
    is not servable or the local log ends at or below it. ``read_committed`` plans only offsets
    below the last stable offset and gives each task its aborted transactions (docs/transactions.md).
    ``min_offset`` plans only offsets ≥ it (an incremental export resuming a partition,
    docs/iceberg.md); it only ever narrows the visible range.
    """
    plan = PartitionPlan(part.topic, part.partition, part.topic_id)
    view = view or RemoteView(part.identity_error is None, part.topic_id)
    remote = view.state(backend, part, protection)
    links = remote.chain().links if view.servable else ()  # what the store serves (docs/cluster.md)
    segments = list_segments(part)  # one listing: the conflict check and the ranges agree
    if links and part.topic_id is None and log_end_conflict(log_end_offset(segments), links[-1].last_offset):
        links = ()  # a re-created partition without an id: the tiered records are not this log's
    plan.manifests = [lk.manifest for lk in links]
    highest = plan.highest_tiered_offset = links[-1].last_offset if links else -1
    deleted = progress.delete_records_offset if progress is not None else -1
    # where this replica's own log left the store's lineage, as the daemon found (docs/cluster.md)
    diverged = progress.local_diverged_from if progress is not None else -1
    vis = chain_visibility(
        part, links, segments, backend, remote.protection, policy=policy, deleted=deleted, diverged=diverged
    )
    ranges = vis.offsets
    lowest = ranges.log_start_offset if ranges.log_start_offset is not None else MAX_OFFSET
    highest_visible = vis.end(isolation) - 1 if ranges.visible_end_offset is not None else -1
    window = _Window(max(lowest, min_offset), highest_visible, start, end, ordered_timestamps)
    plan.tasks += _remote_tasks(part, remote, links, window, plan, target_bytes)
    plan.local_min_offset = max(highest + 1, window.lowest)
    plan.local_max_offset = highest_visible
    if include_local and plan.local_max_offset >= plan.local_min_offset:
        plan.tasks += _local_tasks(part, segments, plan, start, end, target_bytes, index_interval_bytes)
    if isolation == "read_committed" and highest_visible >= 0:
        plan.tasks = [_with_aborted(t, vis.txns()) for t in plan.tasks]
    return plan


@dataclass(frozen=True, slots=True)
class _Window:
    """What a partition's plan reads: offsets ``[lowest, highest]`` (none when ``lowest >
    highest``) and, for pruning, record timestamps ``[start, end)`` (ms; None = unbounded; ``end``
    prunes only with ``ordered_timestamps``, see the module doc)."""

    lowest: int
    highest: int
    start: int | None
    end: int | None
    ordered_timestamps: bool

    def keeps(self, e: RemoteLogIndexEntry) -> bool:
        """Whether entry ``e`` may hold a record of the window."""
        # An empty range (an incremental export already at the visible end) keeps nothing, even
        # an entry that straddles it.
        if e.last_offset < self.lowest or e.first_offset > self.highest or self.lowest > self.highest:
            return False
        if self.start is not None and e.last_timestamp < self.start:
            return False
        return not (self.ordered_timestamps and self.end is not None and e.first_timestamp >= self.end)

    def prunes(self, link: Link) -> bool:
        """Whether no record the store serves of ``link`` can be in the window."""
        m = link.manifest
        return (
            (self.start is not None and m.max_timestamp < self.start)
            or (self.ordered_timestamps and self.end is not None and m.first_timestamp >= self.end)
            or (
                link.last_offset < self.lowest
                or link.first_offset > self.highest
                or self.lowest > self.highest
            )
        )


def _remote_tasks(
    part: PartitionDir,
    remote: RemoteState,
    links: Sequence[Link],
    window: _Window,
    plan: PartitionPlan,
    target_bytes: int,
) -> list[ReadTask]:
    """The tasks reading the window from the served ``links``; counts what it prunes in ``plan``.
    A segment's entries come from the local index sets when they hold all of them, else from the
    store (its uploaded entries, clipped to the link)."""
    local_by_key = _group_by_object(remote.backend, read_local_entries(part.path)) if links else {}
    tasks: list[ReadTask] = []
    for link in links:
        m = link.manifest
        if window.prunes(link):
            plan.pruned_segments += 1
            continue
        entries = local_by_key.get(m.log.key, [])
        if not link.whole or len(entries) != m.index_entries:
            entries = remote.link_entries(link)
        plan.pruned_entries += sum(1 for e in entries if not window.keeps(e))
        tasks += [
            ReadTask(
                part.topic,
                part.partition,
                "remote",
                m.log.key,
                s,
                t,
                max(link.first_offset, window.lowest),
                min(link.last_offset, window.highest),
                window.start,
                window.end,
                m.base_offset,
                sealed=_sealed(m, entries, s, t),
            )
            for s, t in pack_entries(entries, target_bytes, window.keeps)
        ]
    return tasks


def _sealed(
    m: SegmentManifest, entries: Sequence[RemoteLogIndexEntry], start: int, end: int
) -> tuple[bytes, bytes] | None:
    """:attr:`ReadTask.sealed` of the task reading ``[start, end)`` of ``m``'s log object."""
    if m.protection is None:
        return None
    inside = [e for e in entries if start <= e.rdi.position and e.byte_range[1] <= end]
    return m.to_json(), b"".join(e.encode() for e in inside)


def _local_tasks(
    part: PartitionDir,
    segments: Sequence[SegmentFiles],
    plan: PartitionPlan,
    start: int | None,
    end: int | None,
    target_bytes: int,
    index_interval_bytes: int,
) -> list[ReadTask]:
    tasks: list[ReadTask] = []
    for i, seg in enumerate(segments):
        seg_last = segments[i + 1].base_offset - 1 if i + 1 < len(segments) else MAX_OFFSET
        if seg.size == 0 or seg_last < plan.local_min_offset or seg.base_offset > plan.local_max_offset:
            continue
        for s, t in local_ranges(seg, plan.local_min_offset, target_bytes, index_interval_bytes):
            tasks.append(
                ReadTask(
                    part.topic,
                    part.partition,
                    "local",
                    str(seg.log),
                    s,
                    t,
                    plan.local_min_offset,
                    plan.local_max_offset,
                    start,
                    end,
                    seg.base_offset,
                )
            )
    return tasks


def _with_aborted(task: ReadTask, txns: PartitionTxns) -> ReadTask:
    found = txns.aborted(task.min_offset, task.max_offset + 1).entries
    return replace(
        task,
        isolation="read_committed",
        aborted=tuple((a.producer_id, a.first_offset, a.last_offset) for a in found),
    )


def plan_read(
    settings: Settings,
    topics: Sequence[str] | None,
    partitions: Sequence[int] | None = None,
    *,
    start: int | None = None,
    end: int | None = None,
    target_bytes: int = DEFAULT_TARGET_BYTES,
    include_local: bool = True,
    ordered_timestamps: bool = False,
    backend: StorageBackend | None = None,
    isolation: Isolation = "read_uncommitted",
    start_offsets: Mapping[tuple[str, int], int] | None = None,
) -> ReadPlan:
    """Plan every selected partition (manifests and entries fetched with a few threads).

    ``start_offsets``: ``(topic, partition) → first offset`` to plan (partitions not in it start
    at their log start); offsets below it are left out, as if deleted. Used by incremental exports.
    """
    check_time_range(start, end)
    if target_bytes < 1:
        raise InvalidArgumentError(f"target_bytes {target_bytes} must be positive")
    backend = backend or BackendSpec.from_settings(settings).create()
    parts = select_partitions(settings, topics, partitions, served=True)  # what an export serves users
    policy = settings.log.eligibility
    protection = StoreProtection.from_settings(settings.remote)  # docs/protection.md

    with ThreadPoolExecutor(_PLAN_THREADS, "rlm-plan") as pool:
        plans = list(
            pool.map(
                lambda p: plan_partition(
                    p,
                    backend,
                    start=start,
                    end=end,
                    target_bytes=target_bytes,
                    include_local=include_local,
                    ordered_timestamps=ordered_timestamps,
                    index_interval_bytes=settings.log.index_interval_bytes,
                    policy=policy,
                    progress=persisted_progress(settings.tiering, p),
                    view=remote_view(settings.tiering, p),
                    isolation=isolation,
                    min_offset=(start_offsets or {}).get((p.topic, p.partition), 0),
                    protection=protection,
                ),
                parts,
            )
        )
    return ReadPlan(plans)
