"""Durable local-file primitives shared by every layer that writes files (logdir, storage, tiering).

POSIX only guarantees a rename survives a crash once the *directory* is fsynced, and file contents
once the file is; these helpers do both, in the right order.
"""

from __future__ import annotations

import os
from pathlib import Path


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


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` so a crash leaves the old or the new content, never a mix.

    Writes ``<path>.tmp``, fsyncs it, renames it over ``path`` and fsyncs the directory.
    """
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)
    fsync_dir(target.parent)
