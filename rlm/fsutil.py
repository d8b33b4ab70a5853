"""Local-file primitives shared by every layer (logdir, storage, tiering): durable writes, and
trusting a file's ``stat`` signature in place of reading it again.

POSIX only guarantees a rename survives a crash once the *directory* is fsynced, and file contents
once the file is; the write helpers do both, in the right order.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

__all__ = [
    "SETTLE_NS",
    "FileMemo",
    "Signature",
    "atomic_write",
    "fsync_dir",
    "fsync_file",
    "settled",
    "stat_signature",
]

T = TypeVar("T")

#: A file's (inode, size, mtime in ns); None when it does not exist.
Signature = tuple[int, int, int] | None

#: How long a file must have been unchanged before its stat signature is trusted to stand for its
#: content (ns). A file replaced by rename may get the inode its predecessor freed, the same size
#: and — within one file-system timestamp tick — the same mtime: only a version older than a tick
#: when it was read cannot have a same-signature successor that was not read ("racy git").
SETTLE_NS = 100_000_000


def stat_signature(path: str | os.PathLike[str]) -> Signature:
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def settled(sigs: tuple[Signature, ...], read_started_ns: int) -> bool:
    """Whether every file of ``sigs`` was last changed at least :data:`SETTLE_NS` before
    ``read_started_ns``: only then may what was read be remembered under those signatures."""
    return all(s is None or s[2] < read_started_ns - SETTLE_NS for s in sigs)


class FileMemo(Generic[T]):
    """``parse(path)`` of small files, parsed again only when a file's signature changed.

    For files read on every request (a partition's ``partition.metadata``, the daemon's
    ``progress.json``), and for a directory's listing (its signature moves with its entries:
    rlm/logdir/listing_cache.py). A missing file is parsed every time (that is cheap and it may appear); a
    parse that raises is not remembered. At most ``max_entries`` files (then it starts over: a
    bound, not an LRU). ``max_age_s``: a value is also parsed again once this old (seconds), for a
    file whose signature a client may cache (a directory on a network share). Values are shared:
    ``T`` should be immutable, or callers copy.
    """

    def __init__(
        self, parse: Callable[[Path], T], max_entries: int = 65_536, max_age_s: float | None = None
    ) -> None:
        self._parse, self._max, self._max_age_s = parse, max_entries, max_age_s
        self._lock = threading.Lock()
        self._memo: dict[Path, tuple[Signature, float, T]] = {}  # signature, monotonic time parsed

    def get(self, path: Path) -> T:
        sig = stat_signature(path)
        hit = self._memo.get(path)
        now = time.monotonic()
        if (
            sig is not None
            and hit is not None
            and hit[0] == sig
            and (self._max_age_s is None or now - hit[1] < self._max_age_s)
        ):
            return hit[2]
        started_ns = time.time_ns()
        value = self._parse(path)
        if sig is not None and stat_signature(path) == sig and settled((sig,), started_ns):
            with self._lock:
                if len(self._memo) >= self._max:
                    self._memo.clear()
                self._memo[path] = (sig, now, value)
        return value


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so renames/creations/deletions inside it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """fsync an existing file's data and metadata."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: str | os.PathLike[str], data: bytes) -> None:
    """Create ``path`` (it must not exist) with ``data``, fsynced; its directory is not.

    Only for a file inside a directory nobody reads until it is published whole by a rename of
    the directory (whose caller fsyncs it and its parent): there a crash leaves an unpublished
    directory, never a torn file anyone trusts, so :func:`atomic_write`'s temporary file and
    rename would only cost an inode and two metadata operations more.
    """
    with open(path, "xb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def atomic_write(path: str | os.PathLike[str], data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so a crash leaves the old or the new content, never a mix.

    Writes ``<path>.tmp``, fsyncs it, renames it over ``path`` and fsyncs the directory.
    ``durable=False`` skips both fsyncs: only for caches whose content is self-checking (a CRC),
    where a power loss may leave the file empty or torn and the reader then falls back.
    """
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        if durable:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, target)
    if durable:
        fsync_dir(target.parent)
