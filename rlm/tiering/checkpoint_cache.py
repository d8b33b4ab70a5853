"""A log dir's parsed Kafka checkpoints, cached until one of the files changes."""

from __future__ import annotations

import threading
import time
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
    files (inode, size, mtime in ns). Brokers replace them by rename, and a new version can still
    carry its predecessor's signature (a reused inode, the same size, the same timestamp tick), so
    a parse is kept only when the files had settled before it was read (:func:`settled`).
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
        started_ns = time.time_ns()
        checkpoints = read_checkpoints(log_dir)
        if self._signature(log_dir) == sig and settled(sig, started_ns):
            with self._lock:
                self._cache[log_dir] = (sig, checkpoints)
        return checkpoints


#: How long a file must have been unchanged before a stat signature is trusted to stand for its
#: content (ns). A file replaced by rename may get the inode its predecessor freed, the same size
#: and — within one file-system timestamp tick — the same mtime: only a version older than a tick
#: when it was read cannot have a same-signature successor that was not read ("racy git").
SETTLE_NS = 100_000_000


def settled(sig: tuple[tuple[int, int, int] | None, ...], read_started_ns: int) -> bool:
    """Whether every file of ``sig`` (inode, size, mtime ns) was last changed at least
    :data:`SETTLE_NS` before ``read_started_ns``: only then may the parse be cached."""
    return all(s is None or s[2] < read_started_ns - SETTLE_NS for s in sig)
