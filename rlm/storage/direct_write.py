"""Copying a stream into a new file without filling the OS page cache: :func:`copy_to_fd`.

A store's objects are cold: they are written once and read, if ever, long after (a consumer
catching up from the remote tier). Written through the page cache they evict the broker's hot
pages, and every page they fill must first be allocated — on a virtual machine whose freed memory
goes back to the host that allocation is most of a buffered write's cost (BENCHMARKS.md "Beside
Kafka's own tiered storage": 400 MB written with fsync cost ~1.1 s of system CPU buffered, ~0.1 s
direct, on this 2-core host). So an object of at least :data:`BUFFER` bytes is written with
``O_DIRECT`` from one reused, page-aligned buffer per thread: the device reads it from there.

``O_DIRECT`` wants the memory, the file offset and the length aligned (:data:`ALIGN` bytes covers
the common 512-byte and 4 KiB devices). Every write but the last is a whole buffer; the last is
padded with zeros to :data:`ALIGN` and the file is then cut back to the stream's length
(``ftruncate``). A file system that refuses ``O_DIRECT`` (tmpfs; some FUSE and network mounts),
at ``fcntl`` or at a write (``EINVAL``), gets the rest buffered: same bytes, same result. Smaller
objects (manifests, entries, indexes) are written buffered: one write each.

Durability is the caller's: ``O_DIRECT`` bypasses the page cache, not the device's write cache,
so the caller still ``fsync``'s.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import threading
from typing import BinaryIO

__all__ = ["ALIGN", "BUFFER", "DIRECT_FLAG", "copy_to_fd"]

#: Alignment of direct writes' offsets and lengths, and of the buffer (bytes).
ALIGN = 4096
#: Bytes read from the stream per write (one page-aligned buffer per thread, reused).
BUFFER = 1 << 20

#: ``os.O_DIRECT``; 0 where the platform has none: always buffered (reads too: direct_read.py).
DIRECT_FLAG = getattr(os, "O_DIRECT", 0)
_buffers = threading.local()


def _buffer() -> mmap.mmap:
    buf: mmap.mmap | None = getattr(_buffers, "buf", None)
    if buf is None:
        buf = _buffers.buf = mmap.mmap(-1, BUFFER)  # anonymous maps are page-aligned
    return buf


def _fill(stream: BinaryIO, view: memoryview) -> int:
    """Read from ``stream`` until ``view`` is full or the stream ends; the bytes read."""
    readinto = getattr(stream, "readinto", None)
    got = 0
    while got < len(view):
        if readinto is not None:
            n = readinto(view[got:])
        else:
            data = stream.read(len(view) - got)
            n = len(data)
            view[got : got + n] = data
        if not n:
            break
        got += n
    return got


def _write_all(fd: int, data: memoryview, direct: bool) -> bool:
    """Write ``data`` at the file's position; returns whether writes are still direct (a refused
    direct write is redone buffered and the descriptor stays buffered)."""
    while data:
        try:
            n = os.write(fd, data)
        except OSError as e:
            if not direct or e.errno != errno.EINVAL:
                raise
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~DIRECT_FLAG)
            direct = False
            continue
        data = data[n:]
    return direct


def _go_direct(fd: int) -> bool:
    if not DIRECT_FLAG:
        return False
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | DIRECT_FLAG)
    except OSError:
        return False
    return True


def copy_to_fd(stream: BinaryIO, fd: int, *, direct: bool = True) -> int:
    """Copy ``stream`` from its position to its end into the empty file open for writing at
    ``fd`` (position 0); returns the bytes copied. ``direct`` False: buffered writes only."""
    buf = _buffer()
    view = memoryview(buf)
    try:
        n = _fill(stream, view)
        if n < BUFFER or not direct:
            _write_all(fd, view[:n], False)
            total = n
            while n == BUFFER:
                n = _fill(stream, view)
                _write_all(fd, view[:n], False)
                total += n
            return total
        direct = _go_direct(fd)
        total = 0
        while n == BUFFER:
            direct = _write_all(fd, view, direct)
            total += n
            n = _fill(stream, view)
        if n:
            padded = -(-n // ALIGN) * ALIGN if direct else n
            view[n:padded] = bytes(padded - n)
            _write_all(fd, view[:padded], direct)
            total += n
            if padded != n:
                os.ftruncate(fd, total)
        return total
    finally:
        view.release()
