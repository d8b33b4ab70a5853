"""Multipart helpers of the ``s3`` backend: exact-size part reads, part splitting, S3's multipart
ETag, and :class:`BodyView`, a request body that botocore reads without copying."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any, BinaryIO

from rlm.storage.api import read_fully
from rlm.storage.filestream import SeekableBody

__all__ = ["BodyView", "multipart_etag", "read_exact", "split_parts"]


class BodyView(SeekableBody):
    """A seekable, read-only request body over ``data`` whose reads are views, not copies.

    botocore wraps a ``bytes`` body in :class:`io.BytesIO`, and every read of that copies: the
    request checksum (CRC32), the SigV4 payload hash (SHA-256, always on a plain-HTTP endpoint)
    and the socket send each read the whole body in 1 MiB / 16 KiB pieces — three copies of every
    byte into fresh buffers, made while holding the GIL, on each part thread. Views of the one
    part buffer cost none of that. A view is only valid while ``data`` is alive and unchanged.
    """

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self._view = memoryview(data).cast("B")
        self.size = len(self._view)
        self._pos = 0

    def read(self, size: int | None = -1) -> memoryview:
        """Up to ``size`` bytes from the current position (all that is left when negative)."""
        end = len(self._view) if size is None or size < 0 else min(len(self._view), self._pos + size)
        start, self._pos = self._pos, max(self._pos, end)
        return self._view[start : self._pos]


def multipart_etag(parts: list[dict[str, Any]]) -> str:
    """S3's ETag of an object assembled from ``parts`` (each with its ``ETag``, the part's MD5)."""
    try:
        digests = b"".join(bytes.fromhex(str(p["ETag"]).strip('"')) for p in parts)
    except ValueError:  # not MD5 ETags (e.g. SSE-KMS): nothing to compare with
        return ""
    return f"{hashlib.md5(digests, usedforsecurity=False).hexdigest()}-{len(parts)}"


def read_exact(stream: BinaryIO, n: int) -> bytes:
    """``n`` bytes, fewer only at EOF; one read's result is returned as is (no copy) when complete."""
    chunk = stream.read(n)
    if len(chunk) == n or not chunk:
        return chunk
    return chunk + read_fully(stream, n - len(chunk))


def split_parts(first: bytes, second: bytes, stream: BinaryIO, size: int) -> Iterator[bytes]:
    """Part bodies of ``size`` bytes (the last may be shorter): ``first`` and ``second`` (already
    read) and then the rest of ``stream``. When ``first`` is one whole part (threshold == part
    size, the usual case) every body is one read's result, never a re-sliced copy."""
    if len(first) == size:
        chunk = second
        yield first
        while chunk:
            yield chunk
            chunk = read_exact(stream, size) if len(chunk) == size else b""
        return
    buffer = bytearray(first)  # threshold != part size: re-slice into part-size pieces
    buffer += second
    eof = len(second) < size
    while True:
        while not eof and len(buffer) < size:
            more = read_exact(stream, size - len(buffer))
            eof = len(more) < size - len(buffer)
            buffer += more
        if not buffer:
            return
        body = bytes(buffer[:size])
        del buffer[:size]
        yield body
