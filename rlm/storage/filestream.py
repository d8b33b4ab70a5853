"""A local file as an upload body that a backend may read by regions: :class:`FileStream`.

Any backend can ``put`` a :class:`FileStream` like any other stream: it reads the file from its
position to the end. A backend that uploads large objects in parts from a thread pool (s3) may
instead cut it into :class:`FileRegion` bodies (:meth:`FileStream.regions`) and have each part's
thread read its own part straight from the file, in chunks of :data:`CHUNK` bytes that are still
in the CPU cache when the request's hashing and sending read them again — instead of one thread
reading whole parts ahead into buffers that are cold by the time the part is sent (BENCHMARKS.md
"Copy throughput", #35).

Either way, every byte read for an upload attempt first passes ``on_chunk`` once (the caller's
throttle, metrics and cancellation: it may raise to stop the upload), and :meth:`FileStream.crc32c`
is the CRC-32C of the file as sent — combined from the regions' CRC-32Cs when regions were sent,
so the parts' checksums are the only pass over the bytes that computes one.

Reads are ``os.pread`` calls on one descriptor, never a memory map: a file truncated in place while
it is uploaded (a broker truncating a former leader's log) fails the upload with a
:class:`~rlm.errors.StorageError` naming the file, instead of killing the process with SIGBUS; the
store then publishes nothing (docs/storage.md).
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from rlm.errors import StorageError
from rlm.formats.records.scan import crc32c as _crc32c_of
from rlm.formats.records.scan import crc32c_combine

__all__ = ["CHUNK", "FileRegion", "FileStream", "SeekableBody"]

#: Bytes read from the file at once by a region: small enough to stay in L2 between the passes
#: of one request (checksum, SigV4 payload hash, send) with 8 part threads on 2 cores. Client CPU
#: of a 256 MiB upload to SeaweedFS, 8 MiB parts: 0.39–0.40 s at 128–256 KiB, 0.43 s at 1 MiB,
#: 0.48 s at 4 MiB (boto3 ``upload_file``: 0.48 s).
CHUNK = 256 << 10


class SeekableBody:
    """What a request body must answer besides ``read`` (botocore, and the retry layer rewinding
    it to byte 0): readable, seekable, where it is. ``size`` bytes; the position ``_pos`` may
    lie past the end (a read there returns nothing)."""

    size: int
    _pos: int

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos


class FileStream(SeekableBody, io.RawIOBase):
    """The first ``size`` bytes of the file ``path`` (its size when opened), read with ``pread``.

    ``on_chunk(n)`` is called before each read of ``n`` bytes for the upload (sequential reads, and
    a region's :meth:`FileRegion.checksum`): throttle, metrics, cancellation (it may raise).
    ``on_dispatched()`` is called once :meth:`regions` has handed out its last region (a store
    uploading parts in parallel has submitted every part: what is left is their tail). A read
    finding the file shorter than ``size`` raises :class:`~rlm.errors.StorageError`. Thread-safe
    for regions read on different threads; the stream itself is read by one thread at a time.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        on_chunk: Callable[[int], None] | None = None,
        on_dispatched: Callable[[], None] | None = None,
    ) -> None:
        super().__init__()
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            self.size: int = os.fstat(self._fd).st_size
        except BaseException:
            os.close(self._fd)
            raise
        self._on_chunk = on_chunk
        self._on_dispatched = on_dispatched
        self._pos = 0
        self._crc = 0  # sequential reads: the CRC-32C of [0, _covered)
        self._covered = 0
        self._lock = threading.Lock()
        self._region_crcs: dict[int, tuple[int, int]] = {}  # start -> (end, CRC-32C) as checksummed

    # -- raw reads ------------------------------------------------------------------------------

    def pread(self, n: int, offset: int) -> bytes:
        """``n`` bytes at ``offset``, clipped to ``size``; StorageError if the file is shorter now."""
        n = min(n, self.size - offset)
        if n <= 0:
            return b""
        data = os.pread(self._fd, n, offset)
        while len(data) < n:  # a regular file reads short only at its end: keep asking to be sure
            more = os.pread(self._fd, n - len(data), offset + len(data))
            if not more:
                raise self._shrank(offset + len(data))
            data += more
        return data

    def _pread_into(self, view: memoryview, offset: int) -> None:
        """Fill ``view`` from ``offset`` (within ``size``); StorageError if the file is shorter now."""
        got = 0
        while got < len(view):
            n = os.preadv(self._fd, [view[got:]], offset + got)
            if not n:
                raise self._shrank(offset + got)
            got += n

    def _shrank(self, at: int) -> StorageError:
        return StorageError(
            f"the file shrank to {at} bytes while it was uploaded (it had {self.size}); "
            "nothing of it is published",
            file=self.path,
        )

    def paid(self, n: int) -> None:
        """Account ``n`` bytes about to be read for the upload (``on_chunk``)."""
        if self._on_chunk is not None and n > 0:
            self._on_chunk(n)

    # -- the stream -----------------------------------------------------------------------------

    def read(self, size: int | None = -1) -> bytes:
        n = self.size - self._pos if size is None or size < 0 else min(size, self.size - self._pos)
        if n <= 0:
            return b""
        self.paid(n)
        data = self.pread(n, self._pos)
        self._advance(memoryview(data))
        return data

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        """As :meth:`read`, into ``buffer`` (no copy of the bytes but the kernel's)."""
        view = memoryview(buffer).cast("B")
        n = min(len(view), self.size - self._pos)
        if n <= 0:
            return 0
        self.paid(n)
        self._pread_into(view[:n], self._pos)
        self._advance(view[:n])
        return n

    def _advance(self, data: memoryview) -> None:
        """Move past ``data``, just read at the position, extending the sequential CRC."""
        start, self._pos = self._pos, self._pos + len(data)
        if start <= self._covered < self._pos:  # in order (a rewind re-reads covered bytes)
            self._crc = _crc32c_of(data[self._covered - start :], self._crc)
            self._covered = self._pos

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()

    # -- regions --------------------------------------------------------------------------------

    def regions(self, part_size: int) -> Iterator[FileRegion]:
        """Bodies of ``part_size`` bytes (the last may be shorter) from the position to the end;
        the position is at the end afterwards, as after reading the stream."""
        start = self._pos
        while start < self.size:
            end = min(start + part_size, self.size)
            yield FileRegion(self, start, end)
            start = end
        self._pos = max(self._pos, self.size)
        if self._on_dispatched is not None:
            self._on_dispatched()

    def _record(self, start: int, end: int, crc: int) -> None:
        with self._lock:
            self._region_crcs[start] = (end, crc)

    def crc32c(self) -> int:
        """The CRC-32C of the file's ``size`` bytes as uploaded: combined from the regions'
        checksums when they cover it, else from the sequential reads when they did; else (bytes
        skipped) the file is read again for it, without ``on_chunk``."""
        with self._lock:
            regions = dict(self._region_crcs)
        crc, pos = 0, 0
        while pos in regions and pos < self.size:
            end, part = regions[pos]
            crc, pos = crc32c_combine(crc, part, end - pos), end
        if pos == self.size and regions:
            return crc
        if self._covered == self.size:
            return self._crc
        crc = 0
        for at in range(0, self.size, CHUNK):
            crc = _crc32c_of(self.pread(CHUNK, at), crc)
        return crc


class FileRegion(SeekableBody):
    """Bytes ``[start, end)`` of a :class:`FileStream` as a seekable, read-only request body.

    Reads are views of one :data:`CHUNK`-sized ``pread`` result at a time (immutable ``bytes``, so
    a view stays valid). :meth:`checksum` is the one pass that pays ``on_chunk``; the reads of
    the request itself (hashing, sending, a retry's re-send from byte 0) do not pay again.
    """

    def __init__(self, file: FileStream, start: int, end: int) -> None:
        self.file, self.start, self.end = file, start, end
        self.size = end - start
        self._pos = 0
        self._block = b""
        self._block_at = 0  # offset in the region of _block

    def checksum(self) -> int:
        """The region's CRC-32C, read once in :data:`CHUNK` pieces through ``on_chunk``; recorded
        for :meth:`FileStream.crc32c`."""
        crc = 0
        for at in range(self.start, self.end, CHUNK):
            n = min(CHUNK, self.end - at)
            self.file.paid(n)
            crc = _crc32c_of(self.file.pread(n, at), crc)
        self.file._record(self.start, self.end, crc)
        return crc

    def read(self, size: int | None = -1) -> bytes | memoryview:
        """Up to ``size`` bytes (to the end when negative); a short read only at a chunk's end."""
        left = self.size - self._pos
        if left <= 0:
            return b""
        if size is None or size < 0:
            data = self.file.pread(left, self.start + self._pos)
            self._pos = self.size
            return data
        i = self._pos - self._block_at
        if not 0 <= i < len(self._block):
            self._block_at, i = self._pos, 0
            self._block = self.file.pread(min(CHUNK, left), self.start + self._pos)
        n = min(size, len(self._block) - i)
        self._pos += n
        return memoryview(self._block)[i : i + n]
