"""What the engine knows about one partition, and the few facts it persists across restarts.

Remote truth is the set of manifests in the store; local truth is the remote index family in the
partition directory. Only two numbers cannot be derived from either after retention has deleted
everything remote: the highest offset ever tiered (copying must not restart from the oldest local
segment) and the remote log start. They live in ``<state dir>/<topic>-<partition>/progress.json``
(``<topic>-<partition>=<topic id>/`` for a partition with a topic id: one state dir per incarnation,
docs/topic-identity.md), with the DeleteRecords point (docs/visibility.md): the broker's checkpoint
forgets it once its own retention passes it, but remote data below it must stay unserved and
deleted; and with the identity they belong to, so readers can refuse a stale one.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client.metrics import MetricWrapperBase

from rlm.cluster.log_starts import BrokerHighWatermarks
from rlm.config import TieringSettings
from rlm.formats.indexes.segment_index import DEFAULT_INDEX_INTERVAL_BYTES
from rlm.fsutil import atomic_write
from rlm.logdir.discovery import PartitionDir
from rlm.storage.api import StorageBackend
from rlm.tiering.local import manifest_snapshot
from rlm.tiering.local.gaps import Gap
from rlm.tiering.local.index_family import RemoteIndexFamily
from rlm.tiering.local.journal import Journal
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.local.pin_files import PINS_DIR
from rlm.tiering.local.pin_ledger import PinLedger
from rlm.tiering.local.statefiles import int_field, loads_or_none, str_field
from rlm.tiering.local.throttle import TokenBucket
from rlm.tiering.store import SegmentManifest, StoreProtection, StoreView, object_keys

#: Companion objects of one segment (indexes, snapshot, leader epochs, entries) uploaded at once
#: beside its ``.log`` (rlm.tiering.copy.upload.upload_together).
COMPANION_THREADS = 4

__all__ = [
    "PROGRESS_FILE",
    "PartitionContext",
    "PendingManifests",
    "Progress",
    "Quarantine",
    "SharedResources",
    "default_state_dir",
    "state_dir",
    "state_dir_name",
    "state_root",
    "state_root_of",
]

M = TypeVar("M", bound=MetricWrapperBase)


def default_state_dir(log_dir: Path) -> Path:
    """``<parent>/<log dir name>.rlm-state``: beside the log dir, so on the same file system
    (pins are hard links) but outside it (Kafka refuses unknown directories inside a log dir)."""
    return log_dir.parent / f"{log_dir.name}.rlm-state"


def state_dir_name(part: PartitionDir) -> str:
    """``<topic>-<partition>`` without a topic id, ``<topic>-<partition>=<id>`` with one."""
    return part.name if part.topic_id is None else f"{part.name}{object_keys.ID_SEPARATOR}{part.topic_id}"


def state_root(settings: TieringSettings, part: PartitionDir) -> Path:
    return state_root_of(settings, part.log_dir)


def state_root_of(settings: TieringSettings, log_dir: Path) -> Path:
    """The state root of every partition of ``log_dir``: ``tiering.state_dir``, else beside it."""
    return settings.state_dir or default_state_dir(log_dir)


def state_dir(settings: TieringSettings, part: PartitionDir) -> Path:
    """Where the incarnation of ``part`` keeps progress, journal and index-set metadata."""
    return state_root(settings, part) / state_dir_name(part)


#: A partition's persisted progress, in its state dir.
PROGRESS_FILE = "progress.json"


def _none_seen(offset: int | None) -> int:
    """An optional persisted offset: -1 when absent."""
    return -1 if offset is None else offset


@dataclass
class Progress:
    """Persisted per partition. -1 = nothing tiered yet / no DeleteRecords point seen.

    ``delete_records_offset``: the highest DeleteRecords log start offset seen (offsets below it
    are never served, remote segments wholly below it are deleted); it never moves backwards.
    Identity (docs/topic-identity.md): ``topic_id`` of the incarnation, ``remote_root`` the store
    prefix holding its data, ``lineage_conflict`` why the tiered data is not this log's (None: no
    conflict) — readers then serve nothing from the remote tier. ``gaps``: offsets the broker
    deleted before they were tiered (docs/visibility.md, "Gaps"), oldest first.
    ``local_diverged_from``: the first offset of this replica's own log that the store's lineage
    markers say an unclean election threw away (-1 = none); readers serve nothing at or above it
    (docs/cluster.md).
    """

    highest_tiered_offset: int = -1
    remote_log_start_offset: int = -1
    delete_records_offset: int = -1
    topic_id: str | None = None
    remote_root: str | None = None
    lineage_conflict: str | None = None
    #: The token of the partition directory it was written for (identity.DIR_MARKER).
    dir_token: str | None = None
    gaps: list[Gap] = field(default_factory=list)
    local_diverged_from: int = -1

    @classmethod
    def load(cls, path: Path) -> Progress:
        """The saved progress; a missing or unreadable file (statefiles) is "nothing tiered yet":
        recovery then derives the offsets from the manifests in the store."""
        try:
            doc = loads_or_none(path.read_bytes())
        except FileNotFoundError:
            return cls()
        highest, start = int_field(doc, "highest_tiered_offset"), int_field(doc, "remote_log_start_offset")
        # Absent in files written before DeleteRecords support: none seen yet.
        absent = not isinstance(doc, dict) or "delete_records_offset" not in doc
        deleted = -1 if absent else int_field(doc, "delete_records_offset")
        if highest is None or start is None or deleted is None:
            return cls()
        return cls(
            highest,
            start,
            deleted,
            str_field(doc, "topic_id"),
            str_field(doc, "remote_root"),
            str_field(doc, "lineage_conflict"),
            str_field(doc, "dir_token"),
            _gaps_of(doc),
            _none_seen(int_field(doc, "local_diverged_from")),  # absent in older files: none known
        )

    def keeping(self, highest: int, remote_start: int) -> Progress:
        """A fresh progress with new offsets that keeps what the store cannot tell again: the
        DeleteRecords point and the recorded gaps (recovery)."""
        return Progress(highest, remote_start, self.delete_records_offset, gaps=list(self.gaps))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(
            path,
            json.dumps(
                {
                    "highest_tiered_offset": self.highest_tiered_offset,
                    "remote_log_start_offset": self.remote_log_start_offset,
                    "delete_records_offset": self.delete_records_offset,
                    "topic_id": self.topic_id,
                    "remote_root": self.remote_root,
                    "lineage_conflict": self.lineage_conflict,
                    "dir_token": self.dir_token,
                    "gaps": [g.to_json() for g in self.gaps],
                    "local_diverged_from": self.local_diverged_from,
                }
            ).encode(),
        )


def _gaps_of(doc: Any) -> list[Gap]:
    """The recorded gaps; absent (older files) or unreadable entries are none."""
    listed = doc.get("gaps") if isinstance(doc, dict) else None
    found = (Gap.from_json(g) for g in listed) if isinstance(listed, list) else iter(())
    return sorted((g for g in found if g is not None), key=lambda g: g.first_offset)


@dataclass
class SharedResources:
    """Resources every partition shares: the store, the upload budget, shutdown, metrics."""

    backend: StorageBackend
    settings: TieringSettings
    metrics: TieringMetrics
    bucket: TokenBucket
    upload_slots: threading.Semaphore
    stop: threading.Event
    clock_ms: Callable[[], int]
    index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES  # [log] index_interval_bytes: rebuilds
    #: This broker's node id (``[cluster] node_id``), recorded in lineage markers; None = unknown.
    node_id: int | None = None
    #: Several sidecars share the store (docs/cluster.md): every pass syncs from it, and the
    #: single-broker lineage checks (log end, first-batch probe) give way to leader epochs.
    cluster: bool = False
    #: ``[remote.compression]`` / ``[remote.encryption]``: how new segments are stored and how
    #: protected ones are opened (docs/protection.md). Default: plaintext.
    protection: StoreProtection = field(default_factory=StoreProtection)
    #: Held while a partition's local state is loaded at its first pass (rlm.tiering.resume): ~12
    #: small file reads and a little parsing each, local only. Several pass threads doing that at
    #: once mostly wait for the GIL after every read (at 4 000 partitions the daemon's restart took
    #: 3.9 s with 6 pass threads, 2.2 s with one), so those loads run one at a time.
    local_load: threading.Lock = field(default_factory=threading.Lock)
    #: What every pass holds of the broker's files and its bound (``tiering.max_pinned_bytes``;
    #: rlm.tiering.local.pin_ledger). Default: unbounded, no pin on disk known.
    pins: PinLedger = field(default_factory=PinLedger)
    #: Where a leader's copy asks the broker's live high watermark when the checkpoint's holds a
    #: rolled segment back (rlm.cluster.log_starts; ``[cluster] bootstrap_servers``); None: never.
    high_watermarks: BrokerHighWatermarks | None = None
    _companions: concurrent.futures.Executor | None = field(init=False, default=None)
    _companions_decided: bool = field(init=False, default=False)
    _companions_lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def companion_pool(self) -> concurrent.futures.Executor | None:
        """The threads a segment's companion objects upload on beside its ``.log``
        (rlm.tiering.copy.upload.upload_together): :data:`COMPANION_THREADS` per concurrent upload,
        kept for the process (a pool per segment started and ended ~5 threads for every segment
        copied); its idle threads end with it. None for a store without round trips
        (``Capabilities.local_io``): the companions go on the ``.log``'s thread after it.

        Decided at the first upload, not when the resources are made: an ``s3`` store's
        capabilities probe the store (two conditional PUTs), which a process that copies nothing
        must not pay, and which must not stop ``rlm run`` from starting while the store is down."""
        with self._companions_lock:
            if not self._companions_decided:
                if not self.backend.capabilities.local_io:
                    threads = COMPANION_THREADS * self.settings.max_concurrent_uploads
                    self._companions = concurrent.futures.ThreadPoolExecutor(
                        threads, thread_name_prefix="rlm-upload"
                    )
                self._companions_decided = True
            return self._companions


@dataclass(frozen=True, slots=True)
class Quarantine:
    """A rolled segment rlm refuses to tier (docs/broker-files.md): its ``.log`` ``file``, the byte
    ``position`` of the damage, ``cause`` (``empty``/``torn_tail``/``corrupt``), the full ``message``,
    when it was found (``since_ms``) and the ``.log``'s version (device, inode, size, mtime) then:
    the quarantine is re-examined as soon as that version changes or the file is gone."""

    base_offset: int
    file: str
    position: int | None
    cause: str
    message: str
    since_ms: int
    version: tuple[int, int, int, int] | None

    def to_json(self) -> dict[str, object]:
        return {
            "base_offset": self.base_offset,
            "file": self.file,
            "position": self.position,
            "cause": self.cause,
            "reason": self.message,
            "since_ms": self.since_ms,
        }

    @staticmethod
    def save_all(path: Path, quarantined: dict[int, Quarantine]) -> None:
        """Persist (``rlm status`` in another process shows what the daemon found)."""
        docs = [{**q.to_json(), "version": q.version} for _, q in sorted(quarantined.items())]
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(docs).encode())

    @classmethod
    def load_all(cls, path: Path) -> dict[int, Quarantine]:
        """What :meth:`save_all` wrote; an absent or unreadable file is no quarantine (the next
        pass scans the segment again and finds the damage again)."""
        try:
            docs = json.loads(path.read_text())
            found = {}
            for d in docs:
                version = d["version"]
                q = cls(
                    int(d["base_offset"]),
                    str(d["file"]),
                    d["position"],
                    str(d["cause"]),
                    str(d["reason"]),
                    int(d["since_ms"]),
                    None
                    if version is None
                    else (int(version[0]), int(version[1]), int(version[2]), int(version[3])),
                )
                found[q.base_offset] = q
            return found
        except (FileNotFoundError, ValueError, KeyError, TypeError, IndexError):
            return {}


@dataclass(frozen=True, slots=True)
class PendingManifests:
    """Manifests known from the local manifest snapshot but not parsed yet (a restart that trusted the
    local state, rlm.tiering.resume): their count and bytes, and how to load them."""

    header: manifest_snapshot.ManifestSnapshotHeader
    load: Callable[[], list[SegmentManifest]]


@dataclass
class PartitionContext:
    """Everything the copy/recovery/retention/GC steps of one partition work on."""

    part: PartitionDir
    state_dir: Path
    shared: SharedResources
    family: RemoteIndexFamily
    journal: Journal
    progress: Progress = field(default_factory=Progress)
    #: The committed manifests in offset order: read through :attr:`manifests`.
    _manifests: list[SegmentManifest] = field(default_factory=list, repr=False)
    #: Set while the manifests are only known from the snapshot's header (loaded on first use).
    pending_manifests: PendingManifests | None = None
    quarantined: dict[int, Quarantine] = field(default_factory=dict)  # by segment base offset
    in_flight: set[str] = field(default_factory=set)
    last_error: str | None = None
    recovered: bool = False
    #: The topic id in this incarnation's keys; None = the name-only root (no id, or adopted it).
    #: Resolved against the store before use (rlm.tiering.converge.identity.resolve_root).
    key_id: str | None = None
    #: Why the tiered data is not this log's (docs/topic-identity.md), None when consistent.
    identity_conflict: str | None = None
    #: The partition's old incarnations as last seen (rlm.tiering.converge.incarnations.OldIncarnation).
    old_incarnations: list[Any] = field(default_factory=list)
    #: The token rlm left in this partition directory at recovery (a re-created dir has none).
    dir_token: str | None = None
    #: What was last read from the store's manifests prefix and what the local index holds (sync).
    store: StoreView = field(default_factory=StoreView)
    #: This node's role for the partition as last asked (rlm.cluster.leadership.Leadership).
    leadership: Any = None
    #: The last pass found nothing to do (rlm.tiering.idle.IdleMark); None = pass it fully.
    idle: Any = None
    #: Whether that mark is persisted in the state dir; None = not known yet (delete any file).
    idle_saved: bool | None = None
    #: The broker's deadline of the oldest untiered segment it still has, as last estimated
    #: (rlm.tiering.expire.deadline_watch); None = none known. Orders the passes (docs/topic-policy.md §8).
    deadline: Any = None
    #: The margin below ``tiering.deadline_warn_ms`` was logged, not yet risen above it since.
    deadline_warned: bool = False
    #: The partition's labelled child of each metric it updates, by metric: prometheus' ``labels()``
    #: checks and hashes its arguments on every call (~10 µs), and a restart pass makes ~15 calls.
    _series: dict[MetricWrapperBase, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.key_id = self.part.topic_id

    @property
    def manifests(self) -> list[SegmentManifest]:
        """The committed manifests, parsed from the local manifest snapshot on first use after a restart
        that trusted it (a damaged snapshot raises FormatError and stays pending)."""
        if self.pending_manifests is not None:
            self._manifests = self.pending_manifests.load()
            self.pending_manifests = None
        return self._manifests

    @manifests.setter
    def manifests(self, value: list[SegmentManifest]) -> None:
        self.pending_manifests = None
        self._manifests = value

    def oldest_manifest(self) -> tuple[int, int, int, int] | None:
        """The oldest committed segment's (base, last, max timestamp, size), without parsing a
        pending snapshot."""
        if self.pending_manifests is not None:
            return self.pending_manifests.header.oldest
        return manifest_snapshot.oldest_of(self._manifests)

    @property
    def topic(self) -> str:
        return self.part.topic

    @property
    def partition(self) -> int:
        return self.part.partition

    @property
    def labels(self) -> dict[str, str]:
        return {"topic": self.topic, "partition": str(self.partition)}

    def series(self, metric: M) -> M:
        """``metric.labels(**self.labels)``, remembered (a partition's series are never removed
        while its context lives; prometheus returns the same child for the same labels anyway)."""
        child = self._series.get(metric)
        if child is None:
            child = self._series[metric] = metric.labels(**self.labels)
        if metric in self.shared.metrics.totalled:  # the totals may change (history.py)
            self.shared.metrics.totals_version += 1
        return child

    @property
    def staging_dir(self) -> Path:
        return self.state_dir / "staging"

    @property
    def pins_dir(self) -> Path:
        """The partition's sight pins (rlm.tiering.copy.sight), one ``<base>/`` dir each."""
        return self.state_dir / PINS_DIR

    @property
    def progress_path(self) -> Path:
        return self.state_dir / PROGRESS_FILE

    def save_progress(self) -> None:
        self.progress.topic_id = self.part.topic_id
        self.progress.remote_root = object_keys.root(self.topic, self.partition, self.key_id)
        self.progress.lineage_conflict = self.identity_conflict
        self.progress.dir_token = self.dir_token
        if self.pending_manifests is None:  # before the progress: a crash between is a mismatch
            stamps = manifest_snapshot.stamps_of(self.store.manifests.items())
            manifest_snapshot.save(
                self.manifest_snapshot_path,
                self._manifests,
                stamps,
                self.progress.highest_tiered_offset,
                self.progress.remote_log_start_offset,
            )
        self.progress.save(self.progress_path)

    @property
    def manifest_snapshot_path(self) -> Path:
        return self.state_dir / manifest_snapshot.MANIFEST_SNAPSHOT_FILE

    @property
    def quarantine_path(self) -> Path:
        return self.state_dir / "quarantine.json"

    @property
    def remote_bytes(self) -> int:
        if self.pending_manifests is not None:
            return self.pending_manifests.header.bytes
        return sum(m.size_bytes for m in self._manifests)

    @property
    def remote_segments(self) -> int:
        if self.pending_manifests is not None:
            return self.pending_manifests.header.count
        return len(self._manifests)

    def publish_gauges(self) -> None:
        m = self.shared.metrics
        self.series(m.remote_log_size).set(self.remote_bytes)
        self.series(m.remote_segments).set(self.remote_segments)
        self.series(m.highest_tiered).set(self.progress.highest_tiered_offset)
        self.series(m.quarantined).set(len(self.quarantined))
        self.series(m.gap_offsets).set(sum(g.size for g in self.progress.gaps))
