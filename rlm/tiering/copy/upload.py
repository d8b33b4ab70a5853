"""Uploads of one copy attempt's objects (step 3 of :mod:`rlm.tiering.copy.copier`): through the shared
token bucket, each object's CRC-32C computed as it is streamed. Transient store errors are retried
by the store itself (the retry layer where it was opened, docs/storage.md), which rewinds the
stream to byte 0 before each retry."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO, cast

import crc32c

from rlm.errors import UploadAbandoned
from rlm.tiering.local import PartitionContext, ThrottledReader, crash_point
from rlm.tiering.store import StoredObject

__all__ = ["COMPANION_THREADS", "upload_bytes", "upload_file", "upload_together"]

#: Companion objects of one segment uploaded at once beside its ``.log``.
COMPANION_THREADS = 4


def upload_file(
    ctx: PartitionContext,
    key: str,
    path: Path,
    *,
    watch_half: bool = False,
    cancel: threading.Event | None = None,
) -> StoredObject:
    """Upload through the shared token bucket (the store's retry layer resends from byte 0).

    The CRC-32C is computed over the file's bytes as they are streamed to the store, so the file
    is normally read once. Bytes read again (a retry rewinds the stream) are
    not counted twice; only if the store read the stream out of order is the file read again.
    ``cancel`` set stops the upload at its next read with :class:`UploadAbandoned` (the store
    aborts a multipart upload then).
    """
    shared = ctx.shared
    size = path.stat().st_size
    crc = 0
    covered = 0  # the CRC covers bytes [0, covered) of the file
    in_order = True
    sent = 0
    half_reached = False

    def on_bytes(n: int) -> None:
        nonlocal sent, half_reached
        if cancel is not None and cancel.is_set():
            raise UploadAbandoned("upload cancelled: its segment failed the checksum walk")
        sent += n
        ctx.series(shared.metrics.copy_bytes).inc(n)
        if watch_half and not half_reached and sent >= size // 2:
            half_reached = True
            crash_point("mid_upload")

    with path.open("rb") as fh:

        def on_data(data: bytes | memoryview) -> None:
            nonlocal crc, covered, in_order
            end = fh.tell()
            start = end - len(data)
            if start > covered:
                in_order = False  # a gap: someone seeked forward
            elif end > covered:
                crc = crc32c.crc32c(memoryview(data)[covered - start :], crc)
                covered = end

        stream = cast(
            BinaryIO, ThrottledReader(fh, shared.bucket, on_bytes=on_bytes, on_data=on_data, stop=shared.stop)
        )
        shared.backend.put(key, stream)
        if not in_order or covered != size:
            fh.seek(0)
            crc = 0
            while chunk := fh.read(1 << 20):
                crc = crc32c.crc32c(chunk, crc)
    return StoredObject(key, size, crc)


def upload_bytes(ctx: PartitionContext, key: str, data: bytes) -> StoredObject:
    ctx.shared.backend.put(key, data)
    return StoredObject(key, len(data), crc32c.crc32c(data))


def upload_together(
    first: Callable[[], StoredObject], rest: Mapping[str, Callable[[], StoredObject]]
) -> tuple[StoredObject, dict[str, StoredObject]]:
    """Run ``first`` (the ``.log``) on this thread while ``rest`` (its companions, by manifest
    name) upload on up to :data:`COMPANION_THREADS` threads.

    Each companion is small but costs the store a round trip of its own — on HDFS a file create
    and close, 0.1–0.5 s on a quiet cluster — so one after another they, not the bytes, were most
    of a small segment's copy (BENCHMARKS.md "HDFS copy and read"). Order does not matter: nothing
    is visible before the manifest, written after all of them. Every upload has finished or been
    cancelled when this returns or raises; the first error raised is the one propagated.
    """
    if not rest:
        return first(), {}
    with concurrent.futures.ThreadPoolExecutor(
        min(len(rest), COMPANION_THREADS), thread_name_prefix="rlm-upload"
    ) as pool:
        futures = {name: pool.submit(upload) for name, upload in rest.items()}
        try:
            head = first()
        except BaseException:
            for future in futures.values():
                future.cancel()
            raise
        return head, {name: future.result() for name, future in futures.items()}
