"""A log dir's parsed Kafka checkpoints, cached until one of the files changes."""

from __future__ import annotations

import threading
from pathlib import Path

from rlm.logdir.scan import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    LogDirCheckpoints,
    read_checkpoints,
)

_CHECKPOINT_FILES = (REPLICATION_OFFSET_CHECKPOINT, RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT)


class CheckpointCache:
    """A log dir's parsed checkpoints, re-read only when one of the files changed.

    Each file holds every partition of the log dir, so parsing it once per partition pass made a
    pass over P partitions cost O(P²). The cache is validated per use by ``stat`` of the three
    files (inode, size, mtime in ns): brokers replace them by rename, so a new version always has
    a new signature.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[Path, tuple[tuple[tuple[int, int, int] | None, ...], LogDirCheckpoints]] = {}

    @staticmethod
    def _signature(log_dir: Path) -> tuple[tuple[int, int, int] | None, ...]:
        sig: list[tuple[int, int, int] | None] = []
        for name in _CHECKPOINT_FILES:
            try:
                st = (log_dir / name).stat()
            except FileNotFoundError:
                sig.append(None)
            else:
                sig.append((st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(sig)

    def get(self, log_dir: Path) -> LogDirCheckpoints:
        sig = self._signature(log_dir)
        with self._lock:
            hit = self._cache.get(log_dir)
        if hit is not None and hit[0] == sig:
            return hit[1]
        checkpoints = read_checkpoints(log_dir)
        if self._signature(log_dir) == sig:  # unchanged while parsing: safe to keep
            with self._lock:
                self._cache[log_dir] = (sig, checkpoints)
        return checkpoints
