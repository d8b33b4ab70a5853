"""Discover partitions, segments and committed state in Kafka log directories (docs/formats.md §2).

Contracts:

* A partition directory is ``<topic>-<partition>`` directly under a log dir; the partition number is
  the text after the **last** ``-`` (topic names may contain ``-``, ``.`` and ``_``). Everything else
  (files, ``*-delete`` / ``*-future`` / ``*-stray`` directories Kafka uses while deleting or moving
  a replica, names that are not valid topics) is skipped with a reason, never an exception.
* A segment is a ``<20-digit base>.log`` file; its companions are picked from the same listing.
  Transient files (``.deleted``, ``.cleaned``, ``.swap``) are ignored. The log store may rename a
  ``.log`` to ``.log.deleted`` at any moment, so a file that vanishes between ``listdir`` and
  ``stat`` drops its segment from the result instead of failing the listing.
* The **active** segment is the one with the highest base offset; it is never eligible. A rolled
  segment is eligible under policy ``"high-watermark"`` when the next segment's base offset is
  ≤ the partition's high watermark (from ``replication-offset-checkpoint``), and under ``"rolled"``
  always. A partition whose high watermark is unknown has nothing eligible under
  ``"high-watermark"``: not knowing that data is committed must never make it look committed.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeAlias

from rlm.errors import InvalidArgumentError, LogDirError, RlmError
from rlm.formats import naming
from rlm.formats.checkpoint import parse_offset_checkpoint
from rlm.formats.partition_metadata import MAX_FILE_BYTES, parse_partition_metadata
from rlm.fsutil import FileMemo, Signature, settled, stat_signature
from rlm.logdir.segment_layout import layout_of

__all__ = [
    "CLEANER_OFFSET_CHECKPOINT",
    "LEADER_EPOCH_CHECKPOINT",
    "LOG_START_OFFSET_CHECKPOINT",
    "PARTITION_METADATA",
    "RECOVERY_POINT_CHECKPOINT",
    "REPLICATION_OFFSET_CHECKPOINT",
    "EligibilityPolicy",
    "EntriesParser",
    "LogDirCheckpoints",
    "PartitionDir",
    "PartitionState",
    "SegmentFiles",
    "SkipCallback",
    "active_segment",
    "cleaned_partitions",
    "discover_partitions",
    "eligible_segments",
    "known_partition_dir",
    "list_segments",
    "offset_checkpoint_entries",
    "partition_dir",
    "partition_state",
    "read_checkpoints",
    "read_topic_id",
]

log = logging.getLogger(__name__)

REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
#: The topic id of a partition directory (brokers since 2.8): see docs/topic-identity.md.
PARTITION_METADATA = "partition.metadata"
#: Kafka's log cleaner records here how far it compacted each partition it cleans.
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"

#: Kafka renames a replica dir to ``<topic>-<partition>.<uuid>-<suffix>`` while deleting it,
#: moving it between log dirs (``-future``) or after finding it unassigned (``-stray``).
NON_PARTITION_DIR_SUFFIXES = ("-delete", "-future", "-stray")

EligibilityPolicy: TypeAlias = Literal["high-watermark", "rolled"]
#: Called with (path, reason) for every directory entry or segment that discovery skips.
SkipCallback: TypeAlias = Callable[[Path, str], None]

TopicPartition: TypeAlias = tuple[str, int]


def _log_skip(path: Path, reason: str) -> None:
    log.debug("skipping %s: %s", path, reason)


@dataclass(frozen=True, slots=True)
class PartitionDir:
    """One ``<topic>-<partition>`` directory inside ``log_dir`` (``path`` = log_dir / name).

    ``topic_id`` is the id in its ``partition.metadata`` when discovery read one (None: a broker
    before 2.8 or no file; the partition then has a name-only identity). ``identity_error`` is the
    one-line reason when that file exists but is malformed: the partition's identity is then
    unknown and nothing may be tiered or served for it (docs/topic-identity.md).
    """

    log_dir: Path
    topic: str
    partition: int
    path: Path
    topic_id: str | None = None
    identity_error: str | None = None

    @property
    def name(self) -> str:
        """The directory name, ``<topic>-<partition>``."""
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True, slots=True)
class SegmentFiles:
    """The files of one segment as seen by one listing.

    ``size`` is the ``.log`` size in bytes at ``stat`` time (the active segment may grow later).
    Companion paths are ``None`` when absent from the listing; they may still vanish afterwards,
    readers must treat a missing index as "no index".
    """

    base_offset: int
    log: Path
    size: int
    index: Path | None = None
    time_index: Path | None = None
    txn_index: Path | None = None
    snapshot: Path | None = None


@dataclass(frozen=True, slots=True)
class PartitionState:
    """Committed state of a partition from the log dir's checkpoint files; ``None`` = not recorded.

    ``high_watermark``: exclusive end of committed data (offsets < HW are committed).
    ``log_start_offset``: first offset still readable. ``recovery_point``: flushed-to-disk point.
    """

    high_watermark: int | None = None
    log_start_offset: int | None = None
    recovery_point: int | None = None
    #: ``replication-offset-checkpoint``'s mtime (ns since the epoch; 0 = no file) when it was read:
    #: a high watermark the broker answered later is newer (rlm/tiering/read/visibility.py). Not
    #: part of the state's value: two reads of the same offsets are the same state.
    high_watermark_written_ns: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class LogDirCheckpoints:
    """The three per-log-dir offset checkpoints, parsed once per discovery (``{(topic, partition): offset}``).

    A checkpoint file that is absent or empty yields an empty mapping (Kafka creates them empty).
    """

    high_watermarks: dict[TopicPartition, int] = field(default_factory=dict)
    recovery_points: dict[TopicPartition, int] = field(default_factory=dict)
    log_start_offsets: dict[TopicPartition, int] = field(default_factory=dict)
    high_watermarks_written_ns: int = field(default=0, compare=False)  # the file's mtime when read (0: none)

    def state_for(self, topic: str, partition: int) -> PartitionState:
        """The :class:`PartitionState` of one partition (fields ``None`` when not recorded)."""
        key = (topic, partition)
        return PartitionState(
            high_watermark=self.high_watermarks.get(key),
            log_start_offset=self.log_start_offsets.get(key),
            recovery_point=self.recovery_points.get(key),
            high_watermark_written_ns=self.high_watermarks_written_ns,
        )


@functools.lru_cache(maxsize=65_536)
def _classify_dir_name(name: str) -> tuple[str, int] | str:
    """Return (topic, partition) for a partition dir name, or the reason it is not one."""
    if name.startswith("."):
        return "hidden directory"
    for suffix in NON_PARTITION_DIR_SUFFIXES:
        if name.endswith(suffix):
            return f"Kafka {suffix[1:]} directory (not a live partition)"
    try:
        return naming.parse_partition_dir(name)
    except (RlmError, ValueError) as exc:
        return f"not a <topic>-<partition> directory: {exc}"


def read_topic_id(path: Path) -> str | None:
    """The topic id in ``path / partition.metadata``; None when the file does not exist.

    A malformed file raises :class:`~rlm.errors.PartitionMetadataError` naming the file. Parsed
    again only when the file changed (:class:`~rlm.fsutil.FileMemo`): the daemon discovers every
    partition every task interval.
    """
    return _TOPIC_IDS.get(path / PARTITION_METADATA)


def _parse_topic_id(meta: Path) -> str | None:
    try:
        with meta.open("rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise LogDirError(f"cannot read: {exc.strerror or exc}", file=meta) from exc
    try:
        return parse_partition_metadata(data).topic_id
    except RlmError as exc:
        raise exc.in_file(meta) from exc


_TOPIC_IDS: FileMemo[str | None] = FileMemo(_parse_topic_id)


def partition_dir(log_dir: Path, topic: str, partition: int, path: Path | None = None) -> PartitionDir:
    """A :class:`PartitionDir` with its identity read now from ``partition.metadata``."""
    path = path if path is not None else log_dir / f"{topic}-{partition}"
    try:
        return PartitionDir(log_dir, topic, partition, path, read_topic_id(path))
    except RlmError as exc:
        return PartitionDir(log_dir, topic, partition, path, None, str(exc))


#: log dir → partition dir name → (its ``partition.metadata`` signature, the PartitionDir read with
#: it), as the last discovery of that log dir found them: a daemon discovers every partition every
#: task interval, and an unchanged one is then one ``stat``, not a read and new paths.
_KNOWN: dict[str, dict[str, tuple[Signature, PartitionDir]]] = {}
_MAX_KNOWN_LOG_DIRS = 64


def discover_partitions(
    log_dirs: Sequence[Path | str], *, on_skip: SkipCallback | None = None
) -> list[PartitionDir]:
    """All partition directories in ``log_dirs``, sorted by (topic, partition, log dir order).

    Entries that are not partition dirs are reported through ``on_skip(path, reason)`` (default:
    a debug log line) and skipped. A missing log dir raises :class:`LogDirError`: that is a
    configuration problem, unlike a single odd entry. A partition present in two log dirs (only
    legal transiently in Kafka) is kept once, from the first log dir, the other is skipped.
    """
    skip = on_skip or _log_skip
    found: dict[TopicPartition, PartitionDir] = {}
    for raw_dir in log_dirs:
        log_dir = Path(raw_dir)
        try:
            entries = list(os.scandir(log_dir))
        except FileNotFoundError as exc:
            raise LogDirError("log dir does not exist", file=log_dir) from exc
        except NotADirectoryError as exc:
            raise LogDirError("log dir is not a directory", file=log_dir) from exc
        root = os.fspath(log_dir)
        known = _KNOWN.get(root, {})
        seen: dict[str, tuple[Signature, PartitionDir]] = {}
        for entry in sorted(entries, key=lambda e: e.name):
            try:
                is_dir = entry.is_dir()
            except OSError:  # vanished or unreadable between scandir and stat
                is_dir = False
            if not is_dir:
                continue  # checkpoint files, meta.properties, ... are expected here: not worth a report
            parsed = _classify_dir_name(entry.name)
            if isinstance(parsed, str):
                skip(log_dir / entry.name, parsed)
                continue
            if parsed in found:
                skip(log_dir / entry.name, f"duplicate of {found[parsed].path}")
                continue
            found[parsed] = _known_partition_dir(log_dir, entry, parsed, known, seen)
        if len(_KNOWN) >= _MAX_KNOWN_LOG_DIRS and root not in _KNOWN:
            _KNOWN.clear()  # a bound, not an LRU: a process names few log dirs
        _KNOWN[root] = seen  # vanished partitions are forgotten
    return [found[key] for key in sorted(found)]


def _known_partition_dir(
    log_dir: Path,
    entry: os.DirEntry[str],
    parsed: TopicPartition,
    known: dict[str, tuple[Signature, PartitionDir]],
    seen: dict[str, tuple[Signature, PartitionDir]],
) -> PartitionDir:
    """:func:`known_partition_dir` of a listed entry."""
    return known_partition_dir(log_dir, parsed, entry.path, known, seen)


def known_partition_dir(
    log_dir: Path | str,
    parsed: TopicPartition,
    path: str,
    known: dict[str, tuple[Signature, PartitionDir]],
    seen: dict[str, tuple[Signature, PartitionDir]],
) -> PartitionDir:
    """:func:`partition_dir` of the existing directory ``path`` (``log_dir`` / name); the one
    ``known`` has for it when its ``partition.metadata`` kept the signature it was read with (kept,
    in ``seen``, only when the file had settled before that read: :func:`~rlm.fsutil.settled`).
    A re-created topic's directory holds a new file: another one. For a daemon's discovery of every
    partition every task interval, and the readers' lookup of a partition on every request."""
    name = os.path.basename(path)
    meta = os.path.join(path, PARTITION_METADATA)
    started_ns = time.time_ns()
    sig = stat_signature(meta)
    hit = known.get(name)
    if hit is not None and hit[0] == sig:
        seen[name] = hit
        return hit[1]
    part = partition_dir(Path(log_dir), parsed[0], parsed[1], Path(path))
    if part.identity_error is None and settled((sig,), started_ns) and stat_signature(meta) == sig:
        seen[name] = (sig, part)
    return part


def list_names(partition: PartitionDir | Path, *, on_skip: SkipCallback | None = None) -> list[str]:
    """The names in one partition directory (one listing); a directory that vanished lists
    nothing, reported through ``on_skip``. What :func:`list_segments` and the remote-index sets
    (rlm/logdir/index_sets.py) are derived from, so one request lists the directory once."""
    directory = partition.path if isinstance(partition, PartitionDir) else Path(partition)
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        (on_skip or _log_skip)(directory, "partition directory vanished")
        return []


def list_segments(
    partition: PartitionDir | Path,
    *,
    on_skip: SkipCallback | None = None,
    names: list[str] | None = None,
) -> list[SegmentFiles]:
    """The segments of one partition directory in base-offset order (the last one is active).

    Files named ``<base>.log`` define segments; ``.index``/``.timeindex``/``.txnindex``/``.snapshot``
    with the same base name are attached when listed. Transient files are ignored. A ``.log`` that
    vanishes before it can be ``stat``-ed (renamed to ``.deleted`` by retention) is skipped and
    reported through ``on_skip``. A partition dir that vanished entirely yields ``[]``. ``names``:
    the directory's listing when the caller has one (:func:`list_names`).
    """
    skip = on_skip or _log_skip
    directory = partition.path if isinstance(partition, PartitionDir) else Path(partition)
    if names is None:
        names = list_names(directory, on_skip=skip)
    layout = layout_of(directory, names)
    for path in layout.unnamed:
        skip(path, "file name does not start with a base offset")
    segments: list[SegmentFiles] = []
    for paths in layout.segments:
        try:
            size = os.stat(paths.log).st_size
        except FileNotFoundError:
            skip(paths.log, "segment vanished during the listing (renamed to .deleted by the log store?)")
            continue
        segments.append(
            SegmentFiles(
                base_offset=paths.base_offset,
                log=paths.log,
                size=size,
                index=paths.index,
                time_index=paths.time_index,
                txn_index=paths.txn_index,
                snapshot=paths.snapshot,
            )
        )
    return segments


def active_segment(segments: Sequence[SegmentFiles]) -> SegmentFiles | None:
    """The segment with the highest base offset (the one being written), or ``None`` if none."""
    return max(segments, key=lambda s: s.base_offset, default=None)


def offset_checkpoint_entries(data: bytes, path: Path) -> dict[TopicPartition, int]:
    """The entries of an offset checkpoint's content ``data`` (read from ``path``, named in errors)."""
    text = data.decode("utf-8")
    if not text.strip():
        return {}  # Kafka creates checkpoint files empty and reads an empty file as "no entries"
    try:
        return dict(parse_offset_checkpoint(text).entries)
    except RlmError as exc:
        raise exc.in_file(path) from exc


#: Parses one offset checkpoint file's content: ``(data, path) -> {(topic, partition): offset}``.
EntriesParser = Callable[[bytes, Path], dict[TopicPartition, int]]


def _read_offset_checkpoint(
    path: Path, entries: EntriesParser = offset_checkpoint_entries
) -> dict[TopicPartition, int]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    return entries(data, path)


def read_checkpoints(
    log_dir: Path | str, *, entries: EntriesParser = offset_checkpoint_entries
) -> LogDirCheckpoints:
    """Parse the high-watermark, recovery-point and log-start-offset checkpoints of one log dir;
    ``entries`` parses each file's content (a cache passes one that remembers the last parse).

    Raises :class:`rlm.errors.CheckpointError` naming the file when one is malformed.
    """
    root = Path(log_dir)
    hw_file = root / REPLICATION_OFFSET_CHECKPOINT
    try:  # before the read: a file replaced meanwhile then looks older than its content (harmless)
        written_ns = os.stat(hw_file).st_mtime_ns
    except FileNotFoundError:
        written_ns = 0
    return LogDirCheckpoints(
        high_watermarks=_read_offset_checkpoint(hw_file, entries),
        recovery_points=_read_offset_checkpoint(root / RECOVERY_POINT_CHECKPOINT, entries),
        log_start_offsets=_read_offset_checkpoint(root / LOG_START_OFFSET_CHECKPOINT, entries),
        high_watermarks_written_ns=written_ns,
    )


def cleaned_partitions(log_dir: Path | str) -> set[TopicPartition]:
    """The partitions of ``log_dir`` that Kafka's log cleaner has compacted (its checkpoint lists
    them): evidence of ``cleanup.policy=compact`` that needs no metadata log."""
    return set(_read_offset_checkpoint(Path(log_dir) / CLEANER_OFFSET_CHECKPOINT))


def partition_state(partition: PartitionDir, checkpoints: LogDirCheckpoints | None = None) -> PartitionState:
    """The committed state of ``partition``; pass ``checkpoints`` to avoid re-reading the files."""
    cps = checkpoints if checkpoints is not None else read_checkpoints(partition.log_dir)
    return cps.state_for(partition.topic, partition.partition)


def eligible_segments(
    partition: PartitionDir | Iterable[SegmentFiles],
    state: PartitionState,
    policy: EligibilityPolicy = "high-watermark",
) -> list[SegmentFiles]:
    """Rolled segments that may be tiered, oldest first (docs/formats.md §2.1).

    ``partition`` is a partition dir (listed now) or an already listed set of segments. The active
    segment is never included. ``"high-watermark"``: a rolled segment is included when the next
    segment's base offset ≤ ``state.high_watermark`` — all of its offsets are then below the HW,
    i.e. committed; nothing when the HW is unknown. ``"rolled"``: every rolled segment.
    """
    if policy not in ("high-watermark", "rolled"):
        raise InvalidArgumentError(f"unknown eligibility policy {policy!r}; allowed: high-watermark, rolled")
    segments = list_segments(partition) if isinstance(partition, PartitionDir) else list(partition)
    segments.sort(key=lambda s: s.base_offset)
    result: list[SegmentFiles] = []
    hw = state.high_watermark
    for segment, following in itertools.pairwise(segments):
        committed = hw is not None and following.base_offset <= hw
        if policy == "high-watermark" and not committed:
            break  # bases increase, so no later segment can qualify either
        result.append(segment)
    return result
