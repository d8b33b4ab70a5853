"""Uploads of one copy attempt's objects (step 3 of :mod:`rlm.tiering.copy.copier`): through the shared
token bucket, each object's CRC-32C that of the bytes sent (a file goes up as a
:class:`~rlm.storage.filestream.FileStream`, which the s3 store reads by parts on its part threads).
Transient store errors are retried by the store itself (the retry layer where it was opened,
docs/storage.md), which rewinds the stream to byte 0 before each retry, or re-sends one part."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, cast

from rlm.errors import UploadAbandoned
from rlm.formats.records.scan import crc32c as crc32c_of
from rlm.storage.filestream import FileStream
from rlm.tiering.local import PartitionContext, crash_point
from rlm.tiering.store import StoredObject

__all__ = ["UploadControl", "upload_bytes", "upload_file", "upload_together"]


@dataclass(frozen=True, slots=True)
class UploadControl:
    """Between a ``.log``'s upload (:func:`upload_file`) and the thread that started it:
    ``cancel`` set stops the upload at its next chunk (its segment failed the checksum walk, or
    the segment before it in a pipelined copy failed its commit); ``sending`` is set when its
    first chunk is read, i.e. its requests are under way; ``dispatched`` when a store uploading
    parts in parallel has submitted its last part (``FileStream.regions``)."""

    cancel: threading.Event = field(default_factory=threading.Event)
    sending: threading.Event = field(default_factory=threading.Event)
    dispatched: threading.Event = field(default_factory=threading.Event)


def upload_file(
    ctx: PartitionContext,
    key: str,
    path: Path,
    *,
    watch_half: bool = False,
    control: UploadControl | None = None,
) -> StoredObject:
    """Upload through the shared token bucket (the store's retry layer resends from byte 0).

    The file goes to the store as a :class:`~rlm.storage.filestream.FileStream`: a store that
    uploads parts in parallel (s3) reads each part from the file on the part's own thread, any
    other reads it as a stream. Every byte read for an attempt pays the bucket first and counts in
    ``copy_bytes``; the CRC-32C returned is that of the bytes the store was sent (from the parts'
    checksums, or computed as the stream was read), so the file is normally read once for it. A
    file shorter than when the upload started fails it with StorageError, nothing published.
    ``control.cancel`` set (:class:`UploadControl`), or shutdown, stops the upload at its next
    chunk with :class:`UploadAbandoned` (the store aborts a multipart upload then). Parts' threads call in
    at once: the accounting is locked.
    """
    shared = ctx.shared
    lock = threading.Lock()
    sent = 0
    half = -1  # bytes at which crash_point("mid_upload") fires; -1 = not watched or fired

    def on_chunk(n: int) -> None:
        nonlocal sent, half
        if shared.stop.is_set():
            raise UploadAbandoned("upload abandoned: shutting down")
        if control is not None:
            control.sending.set()
            if control.cancel.is_set():
                raise UploadAbandoned("upload cancelled: its attempt will not be committed")
        shared.bucket.take(n)
        ctx.series(shared.metrics.copy_bytes).inc(n)
        with lock:
            sent += n
            crossed = 0 <= half <= sent
            if crossed:
                half = -1
        if crossed:
            crash_point("mid_upload")

    dispatched = control.dispatched.set if control is not None else None
    with FileStream(path, on_chunk=on_chunk, on_dispatched=dispatched) as stream:
        if watch_half:
            half = stream.size // 2
        shared.backend.put(key, cast(BinaryIO, stream))
        return StoredObject(key, stream.size, stream.crc32c())


def upload_bytes(ctx: PartitionContext, key: str, data: bytes) -> StoredObject:
    ctx.shared.backend.put(key, data)
    return StoredObject(key, len(data), crc32c_of(data))


def upload_together(
    pool: concurrent.futures.Executor | None,
    first: Callable[[], StoredObject],
    rest: Mapping[str, Callable[[], StoredObject]],
) -> tuple[StoredObject, dict[str, StoredObject]]:
    """Run ``first`` (the ``.log``) on this thread while ``rest`` (its companions, by manifest
    name) upload on ``pool`` (the process's companion threads, ``SharedResources.companion_pool``:
    :data:`~rlm.tiering.local.COMPANION_THREADS` per concurrent upload); with no ``pool``, ``rest``
    after ``first`` on this thread.

    Each companion is small but costs the store a round trip of its own — on HDFS a file create
    and close, 0.1–0.5 s on a quiet cluster — so one after another they, not the bytes, were most
    of a small segment's copy (BENCHMARKS.md "HDFS copy and read"). On a store without round trips
    (``Capabilities.local_io``) a put is a file create and two fsyncs, and handing it to another
    thread cost more CPU than the put: a copy of 50 broker segments used 0.56 CPU s without the
    pool, 0.65 with it (#35). Order does not matter: nothing is visible before the manifest,
    written after all of them. Every upload has finished or been cancelled when this returns or
    raises; the first error raised is the one propagated.
    """
    if pool is None or not rest:
        head = first()
        return head, {name: upload() for name, upload in rest.items()}
    futures = {name: pool.submit(upload) for name, upload in rest.items()}
    try:
        head = first()
    except BaseException:
        for future in futures.values():
            future.cancel()
        raise
    finally:
        concurrent.futures.wait(futures.values())  # none outlives its attempt
    return head, {name: future.result() for name, future in futures.items()}
