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
``ALIGN``): the aligned superset of ``[start, end)`` is read into an aligned view of a larger
``bytearray`` and the range copied out of it (a ``bytes``, as every store read returns; the copy
costs a fraction of what it saves). A file system that refuses
``O_DIRECT`` (at ``open`` or at the first read, ``EINVAL``) gets ``None``: the caller reads
buffered. Ranges under :data:`MIN_BYTES` (manifests, index entries, small objects) are not worth it:
read buffered, they stay in the page cache for the next reader.
"""

from __future__ import annotations

import ctypes
import errno
import os

from rlm.storage.direct_write import ALIGN, BUFFER, DIRECT_FLAG

__all__ = ["MIN_BYTES", "read_direct"]

#: Ranges of at least this many bytes are read direct: the size from which objects are written
#: direct too.
MIN_BYTES = BUFFER


def _aligned(size: int) -> memoryview:
    """A writable view of ``size`` bytes whose memory starts at a multiple of ``ALIGN``."""
    buf = bytearray(size + ALIGN)
    address = ctypes.addressof(ctypes.c_char.from_buffer(buf))  # the export ends with the temporary
    skip = -address % ALIGN
    return memoryview(buf)[skip : skip + size]


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
        view = _aligned(-(-end // ALIGN) * ALIGN - lo)
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
        return bytes(view[start - lo : min(end, lo + got) - lo]) if got > start - lo else b""
    finally:
        os.close(fd)
