"""A log dir's parsed Kafka checkpoints, cached until one of the files changes (docs/read-path.md).

One instance per process serves the tiering passes (``RemoteLogManager.checkpoints``) and the read
path (``ReaderResources.checkpoints``: lookups, fetches, offsets-for-times, the Kafka listener), so
neither re-parses the three files per partition.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from rlm.fsutil import Signature, settled, stat_signature
from rlm.logdir.discovery import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    LogDirCheckpoints,
    read_checkpoints,
)

__all__ = ["CheckpointCache"]

#: At most this many log dirs are remembered (a broker has a handful; tests and jobs may name more).
_MAX_LOG_DIRS = 64
_CHECKPOINT_FILES = (REPLICATION_OFFSET_CHECKPOINT, RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT)


class CheckpointCache:
    """A log dir's parsed checkpoints, re-read only when one of the files changed.

    Each file holds every partition of the log dir, so parsing it once per partition pass made a
    pass over P partitions cost O(P²). The cache is validated per use by ``stat`` of the three
    files (inode, size, mtime in ns). Brokers replace them by rename, and a new version can still
    carry its predecessor's signature (a reused inode, the same size, the same timestamp tick), so
    a parse is kept only when the files had settled before it was read (:func:`settled`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[Path, tuple[tuple[Signature, ...], LogDirCheckpoints]] = {}

    @staticmethod
    def _signature(log_dir: Path) -> tuple[Signature, ...]:
        return tuple(stat_signature(log_dir / name) for name in _CHECKPOINT_FILES)

    def get(self, log_dir: Path) -> LogDirCheckpoints:
        """The checkpoints of ``log_dir`` as they are now: one ``stat`` per file on a hit, a parse
        otherwise. Raises what :func:`read_checkpoints` raises for an unreadable file (not cached)."""
        sig = self._signature(log_dir)
        with self._lock:
            hit = self._cache.get(log_dir)
        if hit is not None and hit[0] == sig:
            return hit[1]
        started_ns = time.time_ns()
        checkpoints = read_checkpoints(log_dir)
        if self._signature(log_dir) == sig and settled(sig, started_ns):
            with self._lock:
                if len(self._cache) >= _MAX_LOG_DIRS and log_dir not in self._cache:
                    self._cache.clear()  # a bound, not an LRU: a process names few log dirs
                self._cache[log_dir] = (sig, checkpoints)
        return checkpoints
