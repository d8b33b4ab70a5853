"""Multipart helpers of the ``s3`` backend: exact-size part reads and S3's multipart ETag."""

from __future__ import annotations

import hashlib
from typing import Any, BinaryIO

from rlm.storage.api import read_fully


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
