"""Reading a byte range of a file past the OS page cache: :func:`read_direct`.

The local store writes its large objects with ``O_DIRECT`` (:mod:`rlm.storage.direct_write`), so a
read of the tier comes from the device. Read buffered, each page of it lands first in a page-cache
page the device filled, then is copied to the reader. On a VM that copy is the costly part: the
guest's first touch of a page its host filled is a fault in the host (measured beside a live
broker on the bench host: 47 % of a first 400 MB catch-up's CPU in that copy, ~1.6 ms per MB,
against ~0.1 when the same bytes were read again). With ``O_DIRECT`` the device writes straight
into the reader's buffer — memory the process reuses (:mod:`rlm.daemon.allocator`) — and the cold
bytes do not evict the broker's hot pages, as with the writes.

``O_DIRECT`` wants the file offset, the length and the memory aligned (to direct_write's
``ALIGN``): the aligned superset of ``[start, end)`` is read into a page-aligned buffer and the
range copied out of it (a ``bytes``, as every store read returns; the copy costs a fraction of
what it saves). Buffers are reused: :data:`KEPT` mappings of :data:`KEEP_BYTES` each are kept
between reads, so a read costs no zero-fill of fresh memory (3 % of a catch-up's CPU) and no new
pages; a larger read, or one beyond :data:`KEPT` at once, maps a buffer of its own. A file system
that refuses ``O_DIRECT`` (at ``open`` or at the first read, ``EINVAL``) gets ``None``: the caller
reads buffered. Ranges under :data:`MIN_BYTES` (manifests, index entries, small objects) are not worth it:
read buffered, they stay in the page cache for the next reader.

The copy out of the buffer runs **without the GIL** (:func:`copy_out`): ``bytes(view)`` holds it
for the whole copy — 0.7–0.9 ms for a read-ahead's 8 MiB GET on the bench host, during which the
Kafka listener's thread, which answers the Fetches those GETs serve, cannot run a line (a thread
looping beside 64 MiB copies got a tenth of its progress with ``bytes``, all of it with the copy
outside the GIL).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import cast

from rlm.storage.direct_write import ALIGN, BUFFER, DIRECT_FLAG

__all__ = ["KEEP_BYTES", "KEPT", "MIN_BYTES", "copy_out", "read_direct"]

#: Ranges of at least this many bytes are read direct: the size from which objects are written
#: direct too.
MIN_BYTES = BUFFER


#: Buffers kept for the next reads, and the largest kept (bytes): the read-ahead's coalesced
#: GETs are 8 MiB; two cover the reads a 2-core host runs at once, and bound what stays mapped.
KEPT = 2
KEEP_BYTES = 16 << 20

_kept: list[mmap.mmap] = []
_kept_lock = threading.Lock()


@contextmanager
def _aligned(size: int) -> Iterator[memoryview]:
    """A writable view of ``size`` bytes starting at a page boundary (so at a multiple of
    ``ALIGN``), for the block: a kept buffer (each maps :data:`KEEP_BYTES`) when one is free and
    ``size`` fits, else a new mapping, kept afterwards while fewer than :data:`KEPT` are."""
    with _kept_lock:
        buf = _kept.pop() if _kept and size <= KEEP_BYTES else None
    if buf is None:  # anonymous: page-aligned, and its pages are only taken once touched
        pages = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        buf = mmap.mmap(-1, KEEP_BYTES if size <= KEEP_BYTES else pages)
    whole = memoryview(buf)
    view = whole[:size]
    try:
        yield view
    finally:
        view.release()  # the caller's slices of it are gone: a mapping with views cannot close
        whole.release()
        with _kept_lock:
            keep = len(buf) == KEEP_BYTES and len(_kept) < KEPT
            if keep:
                _kept.append(buf)
        if not keep:
            buf.close()


def read_direct(path: str | os.PathLike[str], start: int, end: int) -> bytes | None:
    """Bytes ``[start, end)`` of the file (clipped to its size), read with ``O_DIRECT``; None when
    the platform or the file system does not take it (the caller then reads buffered). Raises
    :class:`OSError` as ``open``/``read`` do (a missing file: :class:`FileNotFoundError`)."""
    if not DIRECT_FLAG:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | DIRECT_FLAG)
    except OSError as e:
        if e.errno == errno.EINVAL:
            return None
        raise
    try:
        end = min(end, os.fstat(fd).st_size)
        if start >= end:
            return b""
        lo = start - start % ALIGN
        with _aligned(-(-end // ALIGN) * ALIGN - lo) as view:
            got = 0
            while got < end - lo:
                try:
                    n = os.preadv(fd, [view[got:]], lo + got)
                except OSError as e:
                    if e.errno == errno.EINVAL and got == 0:
                        return None  # refused at the read, not at open (some FUSE and network mounts)
                    raise
                got += n
                if n == 0 or got % ALIGN:  # the file's end (it shrank since fstat): what is there
                    break
            return copy_out(view, start - lo, min(end, lo + got) - lo) if got > start - lo else b""
    finally:
        os.close(fd)


_New = Callable[[None, int], bytes]
_Address = Callable[[bytes], int]


def _bytes_api() -> tuple[_New, _Address] | None:
    """CPython's ``PyBytes_FromStringAndSize`` (with a NULL source: a new ``bytes`` to fill) and
    ``PyBytes_AsString``; None where the interpreter has no such C API (the copy then holds the GIL)."""
    try:
        new, address = ctypes.pythonapi.PyBytes_FromStringAndSize, ctypes.pythonapi.PyBytes_AsString
    except AttributeError:
        return None
    new.restype, new.argtypes = ctypes.py_object, (ctypes.c_void_p, ctypes.c_ssize_t)
    address.restype, address.argtypes = ctypes.c_void_p, (ctypes.py_object,)
    return cast(_New, new), cast(_Address, address)


_BYTES_API = _bytes_api()


def copy_out(view: memoryview, lo: int, hi: int) -> bytes:
    """``bytes(view[lo:hi])`` of a writable ``view``, the copy made without holding the GIL (module
    doc): a new, not yet shared ``bytes`` is filled by ``memmove`` through ctypes, whose foreign
    calls release the GIL. Bounds as a slice's must be: ``0 <= lo <= hi <= len(view)``."""
    if not 0 <= lo <= hi <= len(view):
        raise ValueError(f"range [{lo}, {hi}) is not within the {len(view)} bytes of the buffer")
    if _BYTES_API is None or hi == lo:
        return bytes(view[lo:hi])
    new, address = _BYTES_API
    out: bytes = new(None, hi - lo)
    source = ctypes.c_char.from_buffer(view, lo)  # needs a writable buffer: the read's own mapping
    try:
        ctypes.memmove(address(out), ctypes.addressof(source), hi - lo)
    finally:
        del source  # its export of ``view`` must end before the mapping is released
    return out
