"""One ``rlm run`` per state directory: an ``fcntl.flock``'d lock file (docs/operations.md).

Two daemons over the same state dir would both resolve the journal's open attempts, both copy the
same segments and race on ``progress.json``. ``rlm run`` (daemon and ``--once``) therefore takes
an exclusive, non-blocking ``flock`` on ``<state dir>/rlm-run.lock`` of every state dir it owns
before doing anything, and holds it until it exits. The kernel releases a ``flock`` when the
process dies, SIGKILL included, so a stale lock file never blocks a restart; the file itself stays
and only carries the holder's pid and start time for the error message. Read-only commands
(``status``, ``lookup``, ``fetch``) take no lock and run beside a daemon.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from rlm.errors import StateDirLockedError

__all__ = ["LOCK_NAME", "StateDirLock"]

LOCK_NAME = "rlm-run.lock"


class StateDirLock:
    """Exclusive locks on several state dirs, taken in sorted order (no lock-order deadlock)."""

    def __init__(self, state_dirs: Iterable[Path]) -> None:
        self.state_dirs = sorted({Path(d) for d in state_dirs})
        self._fds: list[int] = []

    def acquire(self) -> StateDirLock:
        try:
            for state_dir in self.state_dirs:
                self._fds.append(_lock_one(state_dir))
        except BaseException:
            self.release()
            raise
        return self

    def release(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)  # closing the only descriptor releases the flock
        self._fds.clear()

    def __enter__(self) -> StateDirLock:
        return self.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _lock_one(state_dir: Path) -> int:
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise StateDirLockedError(
            f"another rlm run{holder} already owns this state dir; stop it first (one daemon per state dir)",
            file=state_dir,
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "started_ms": int(time.time() * 1000)}).encode(), 0)
    return fd


def _holder(fd: int) -> str:
    """`` (pid N)`` from the lock file's content, or "" when it cannot be read."""
    try:
        doc = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f" (pid {int(doc['pid'])})"
    except (OSError, ValueError, KeyError, TypeError):
        return ""
