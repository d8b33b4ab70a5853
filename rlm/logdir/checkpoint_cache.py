"""A log dir's parsed Kafka checkpoints, cached until one of the files changes (docs/read-path.md).

One instance per process serves the tiering passes (``RemoteLogManager.checkpoints``) and the read
path (``ReaderResources.checkpoints``: lookups, fetches, offsets-for-times, the Kafka listener), so
neither re-parses the three files per partition.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from rlm.fsutil import SETTLE_NS, Signature, settled, stat_signature
from rlm.logdir.discovery import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    LogDirCheckpoints,
    TopicPartition,
    offset_checkpoint_entries,
    read_checkpoints,
)

__all__ = ["CheckpointCache"]

#: At most this many log dirs are remembered (a broker has a handful; tests and jobs may name more).
_MAX_LOG_DIRS = 64
_CHECKPOINT_FILES = (REPLICATION_OFFSET_CHECKPOINT, RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT)
#: How long a hint is served without ``stat``-ing the files again (ns): a sweep asks once per
#: partition, thousands of times in a few ms. A hint at most this old is what a check this much
#: earlier would have seen; a change it misses is seen by the next sweep, as one just after it.
HINT_RESTAT_NS = 10_000_000


class CheckpointCache:
    """A log dir's parsed checkpoints, re-read only when one of the files changed.

    Each file holds every partition of the log dir, so parsing it once per partition pass made a
    pass over P partitions cost O(P²). The cache is validated per use by ``stat`` of the three
    files (inode, size, mtime in ns). Brokers replace them by rename, and a new version can still
    carry its predecessor's signature (a reused inode, the same size, the same timestamp tick), so
    a parse is kept for good only when the files had settled before it was read (:func:`settled`).

    A caller that only needs a hint (``hint=True``: the idle fingerprint of a partition pass,
    rlm/tiering/idle.py, where a stale value costs at most one pass's delay) is also served a
    parse of files that had not settled, while they keep its signature and until
    :data:`~rlm.fsutil.SETTLE_NS` after the newest file's mtime. A broker rewrites
    ``replication-offset-checkpoint`` every 5 s: before, every partition pass in the following
    100 ms parsed the whole file again (10 000 partitions: a fifth of an idle sidecar's CPU,
    bench/idle_bench.py). A hint is also served for :data:`HINT_RESTAT_NS` without a ``stat``.
    Misses are parsed one at a time, and a file is parsed again only when its content changed: an
    idle broker rewrites the same high watermarks every 5 s.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parse_lock = threading.Lock()
        #: log dir → (signature, checkpoints, ns until which an unsettled parse is served; 0: settled)
        self._cache: dict[Path, tuple[tuple[Signature, ...], LogDirCheckpoints, int]] = {}
        #: log dir → its three files' paths as strings: a sweep asks once per partition, and
        #: building the paths anew each time was most of a hit's cost
        self._files: dict[Path, tuple[str, ...]] = {}
        #: log dir → (time.time_ns() until which a hint is served without a stat, the checkpoints)
        self._recent: dict[Path, tuple[int, LogDirCheckpoints]] = {}
        #: checkpoint file → (its content when last parsed, the entries parsed from it)
        self._parsed: dict[Path, tuple[bytes, dict[TopicPartition, int]]] = {}

    def _paths(self, log_dir: Path) -> tuple[str, ...]:
        files = self._files.get(log_dir)
        if files is None:
            files = tuple(os.path.join(log_dir, name) for name in _CHECKPOINT_FILES)
            if len(self._files) >= _MAX_LOG_DIRS:
                self._files.clear()  # the same bound as the cache's
            self._files[log_dir] = files
        return files

    def _signature(self, log_dir: Path) -> tuple[Signature, ...]:
        return tuple(stat_signature(f) for f in self._paths(log_dir))

    def _hit(self, log_dir: Path, sig: tuple[Signature, ...], hint: bool) -> LogDirCheckpoints | None:
        with self._lock:
            hit = self._cache.get(log_dir)
        if hit is not None and hit[0] == sig and (hit[2] == 0 or (hint and time.time_ns() < hit[2])):
            return hit[1]
        return None

    def get(self, log_dir: Path, *, hint: bool = False) -> LogDirCheckpoints:
        """The checkpoints of ``log_dir`` as they are now: one ``stat`` per file on a hit, a parse
        otherwise (``hint``: see the class). Raises what :func:`read_checkpoints` raises for an
        unreadable file (not cached)."""
        if hint:
            recent = self._recent.get(log_dir)
            if recent is not None and time.time_ns() < recent[0]:
                return recent[1]
        sig = self._signature(log_dir)
        found = self._hit(log_dir, sig, hint)
        if found is None:
            found = self._parse(log_dir, sig, hint)
        if hint:
            with self._lock:
                cached = self._cache.get(log_dir)
                if cached is not None and cached[1] is found:
                    expires = time.time_ns() + HINT_RESTAT_NS
                    if len(self._recent) >= _MAX_LOG_DIRS:
                        self._recent.clear()
                    self._recent[log_dir] = (min(expires, cached[2]) if cached[2] else expires, found)
        return found

    def _parse(self, log_dir: Path, sig: tuple[Signature, ...], hint: bool) -> LogDirCheckpoints:
        with self._parse_lock:  # one parse at a time: a hint waiting for it takes its result
            found = self._hit(log_dir, sig, hint)
            if found is not None:
                return found
            started_ns = time.time_ns()
            checkpoints = read_checkpoints(log_dir, entries=self._entries)
            if self._signature(log_dir) == sig:
                newest = max((s[2] for s in sig if s is not None), default=0)
                until = 0 if settled(sig, started_ns) else newest + SETTLE_NS
                with self._lock:
                    if len(self._cache) >= _MAX_LOG_DIRS and log_dir not in self._cache:
                        self._cache.clear()  # a bound, not an LRU: a process names few log dirs
                    self._cache[log_dir] = (sig, checkpoints, until)
        return checkpoints

    def _entries(self, data: bytes, path: Path) -> dict[TopicPartition, int]:
        """One file's entries; parsed again only when its content differs from the last parse's
        (the same bytes parse to the same entries, whatever the signature: no racy case)."""
        known = self._parsed.get(path)
        if known is not None and known[0] == data:
            return known[1]
        entries = offset_checkpoint_entries(data, path)
        if len(self._parsed) >= 3 * _MAX_LOG_DIRS:
            self._parsed.clear()
        self._parsed[path] = (data, entries)
        return entries
