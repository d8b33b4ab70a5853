"""Output built aside and renamed into place: :class:`StagedDir`, the staging directory every job
that writes a directory tree uses (``rlm export``'s Parquet layout, ``rlm restore``'s partition
directories; docs/export.md, docs/restore.md), and :func:`local_path`, which tells a local output
from another filesystem's URI."""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from rlm.errors import ExportOutputExistsError
from rlm.fsutil import fsync_dir, fsync_file

__all__ = ["ABORT_SETTLE_S", "StagedDir", "local_path", "sweep_stale"]

#: Seconds :meth:`StagedDir.abort` keeps removing a staging dir that straggling tasks write into.
ABORT_SETTLE_S = 30.0


def local_path(out: str | os.PathLike[str]) -> Path | None:
    """``out`` as a local path (plain path or ``file:`` URI), None for another filesystem's URI
    (``hdfs://``, ``s3a://``…: only Spark writes those)."""
    text = os.fspath(out)
    parsed = urlparse(text)
    if parsed.scheme == "file":
        return Path(parsed.path)
    if len(parsed.scheme) > 1:  # a one-letter scheme is a Windows drive, not a URI
        return None
    return Path(text)


@dataclass(frozen=True, slots=True)
class StagedDir:
    """A directory ``out`` built under a hidden sibling (``.<name>.rlm-export-*``) and renamed into
    place on :meth:`commit`: a failed or killed export never leaves anything at ``out``.

    The driver holds an exclusive ``flock`` on ``<staging>.lock`` for the export's lifetime; a
    staging dir whose lock nobody holds belongs to a killed export, and the next export to the same
    ``out`` removes it (:func:`sweep_stale`)."""

    out: Path
    staging: Path
    overwrite: bool

    @classmethod
    def begin(cls, out: Path, overwrite: bool) -> StagedDir:
        """Check ``out`` (it must not exist unless ``overwrite``), remove killed exports' staging
        dirs, and create this one's (locked)."""
        out = out.absolute()
        if not overwrite and (out.exists() or out.is_symlink()):
            raise ExportOutputExistsError(f"{out}: already exists (--overwrite replaces it)")
        out.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale(out)
        staging = Path(tempfile.mkdtemp(prefix=f"{_staging_prefix(out)}", dir=out.parent))
        fd = os.open(f"{staging}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        _HELD[staging] = fd
        return cls(out, staging, overwrite)

    def _release(self) -> None:
        fd = _HELD.pop(self.staging, None)
        if fd is not None:
            Path(f"{self.staging}.lock").unlink(missing_ok=True)
            os.close(fd)

    def commit(self) -> None:
        """fsync what was staged, then rename it to ``out`` (replacing an old ``out`` when
        ``overwrite``: the old one is renamed aside first and deleted after)."""
        _fsync_tree(self.staging)
        old: Path | None = None
        if self.out.exists() or self.out.is_symlink():
            if not self.overwrite:  # created by someone else while we exported
                raise ExportOutputExistsError(f"{self.out}: already exists (--overwrite replaces it)")
            old = self.out.with_name(f".{self.out.name}.rlm-replaced-{uuid.uuid4().hex[:8]}")
            os.rename(self.out, old)
        os.rename(self.staging, self.out)
        fsync_dir(self.out.parent)
        self._release()
        if old is not None:
            _remove(old)

    def abort(self, settle_s: float = ABORT_SETTLE_S) -> None:
        """Remove the staging dir. Spark does not wait for the other running tasks of a failed
        job: one may still be writing a file, so the removal is retried until the dir stays
        gone (for at most ``settle_s`` seconds)."""
        deadline = time.monotonic() + settle_s
        while True:
            shutil.rmtree(self.staging, ignore_errors=True)
            if not self.staging.exists() or time.monotonic() >= deadline:
                self._release()
                return
            time.sleep(0.1)


#: The driver's staging locks (staging dir → open fd): not in StagedDir, which is shipped to workers.
_HELD: dict[Path, int] = {}


def _staging_prefix(out: Path) -> str:
    return f".{out.name}.rlm-export-"


def sweep_stale(out: Path) -> list[Path]:
    """Remove the staging dirs of exports to ``out`` that were killed: those whose ``.lock`` no
    live export holds (a running export keeps its lock; a dir without a lock file is left alone:
    its owner is unknown). Returns what was removed."""
    removed = []
    for lock in out.parent.glob(f"{glob.escape(_staging_prefix(out))}*.lock"):
        staging = lock.with_name(lock.name.removesuffix(".lock"))
        try:
            fd = os.open(lock, os.O_RDWR)
        except FileNotFoundError:
            continue  # its export just finished
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a live export holds it
        else:
            shutil.rmtree(staging, ignore_errors=True)
            lock.unlink(missing_ok=True)
            removed.append(staging)
        finally:
            os.close(fd)
    return removed


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            fsync_file(os.path.join(dirpath, name))
        fsync_dir(dirpath)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
