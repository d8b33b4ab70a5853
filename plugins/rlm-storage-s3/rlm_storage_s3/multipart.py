"""One multipart upload of the ``s3`` backend: create, parts in parallel, complete, abort on failure.

The steps of one upload (CreateMultipartUpload, each UploadPart, CompleteMultipartUpload) are
retried, step by step, under the policy of the retry layer the store was opened with — the same
single :class:`~rlm.storage.retry.RetryPolicy` object, handed down by
:class:`~rlm.storage.retry.RetryingBackend` (``S3Backend.use_retry_policy``) — so a 503 on one
part re-sends that part, not the whole object. When a step has used up its attempts, the policy
marks the error (``attempts``) and the retry layer above does not start the upload again: a
persistent failure costs ``max_attempts`` requests of the failing step, never ``max_attempts``
squared (docs/storage.md). A backend built without that layer (tests, tools) sends each step once.
On any failure the upload is aborted (best effort: a bucket lifecycle rule cleans up the rest).
"""

from __future__ import annotations

import base64
import concurrent.futures
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import crc32c

from rlm.errors import StorageError
from rlm.storage.api import ObjectInfo
from rlm.storage.filestream import FileRegion
from rlm.storage.redaction import scrub
from rlm.storage.retry import RetryPolicy
from rlm_storage_s3.errors import code_of, status_of
from rlm_storage_s3.parts import BodyView, multipart_etag

__all__ = ["MAX_PARTS", "OWN_ALGORITHM", "Caller", "MultipartUpload", "part_checksum"]

log = logging.getLogger(__name__)

MAX_PARTS = 10_000
#: ``call(op, key, fn, **kwargs)``: one SDK call, its errors translated (``S3Backend._call``).
Caller = Callable[..., Any]


#: The upload's ``ChecksumAlgorithm`` when the plugin computes each part's checksum itself.
OWN_ALGORITHM = {"ChecksumAlgorithm": "CRC32C"}


def part_checksum(body: bytes | FileRegion) -> dict[str, str]:
    """The ``ChecksumCRC32C`` header of one part body (hardware CRC-32C, ~20 GB/s).

    Sent with the part, the store verifies the part against it, and botocore, finding a checksum
    header set, computes none of its own (its default, CRC32, is zlib's: about 5 times the CPU
    per byte; BENCHMARKS.md "Copy throughput", #35). Only on plain-HTTP endpoints, where botocore
    signs every payload with SHA-256 anyway: over HTTPS botocore streams its CRC32 in a trailer and
    signs no payload, which a checksum header set by the caller would turn back on (S3SigV4Auth)."""
    crc = body.checksum() if isinstance(body, FileRegion) else crc32c.crc32c(body)
    return {"ChecksumCRC32C": base64.b64encode(crc.to_bytes(4, "big")).decode("ascii")}


@dataclass
class MultipartUpload:
    """Uploads the parts of one object ``key`` (full S3 key ``full``) of the backend's ``bucket``."""

    client: Any
    bucket: str
    key: str
    full: str
    call: Caller
    pool: concurrent.futures.ThreadPoolExecutor
    max_concurrency: int
    policy: RetryPolicy | None
    #: ``ChecksumAlgorithm`` (CRC32 per part) when request checksums are on, else empty.
    algo: dict[str, Any]
    extra: dict[str, Any]

    def _step(self, op: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
        """One step (a request), retried under the handed-down policy when there is one."""
        if self.policy is None:
            return self.call(op, self.key, fn, **kwargs)
        return self.policy.call(self.call, op, self.key, fn, **kwargs)

    def run(self, parts: Iterator[bytes | FileRegion], cond: dict[str, Any]) -> ObjectInfo:
        """Upload ``parts`` in order as one object; ``cond`` = ``{"IfNoneMatch": "*"}`` or ``{}``.

        A part is a body in memory or a :class:`~rlm.storage.filestream.FileRegion`, which the
        part's thread reads from the file itself (only with the plugin's own part checksum)."""
        self.upload_id = self._step(
            "create_multipart_upload",
            self.client.create_multipart_upload,
            Bucket=self.bucket,
            Key=self.full,
            **self.algo,
            **self.extra,
        )["UploadId"]
        futures: list[concurrent.futures.Future[dict[str, Any]]] = []
        try:
            total = self._send_parts(parts, futures)
            done = [f.result() for f in futures]
            resp = self._step("complete_multipart_upload", self._completer(done, total), **cond)
        except BaseException:
            for f in futures:
                f.cancel()
            concurrent.futures.wait(futures)
            self._abort()
            raise
        return ObjectInfo(self.key, total, str(resp.get("ETag", "")).strip('"') or None)

    def _send_parts(
        self, parts: Iterator[bytes | FileRegion], futures: list[concurrent.futures.Future[Any]]
    ) -> int:
        """Submit every part (at most ``max_concurrency + 1`` in flight, so memory stays bounded
        at that many part bodies); return the object's size in bytes."""
        inflight: set[concurrent.futures.Future[dict[str, Any]]] = set()
        total = 0
        for number, body in enumerate(parts, start=1):
            if number > MAX_PARTS:
                raise StorageError(
                    f"s3: put s3://{self.bucket}/{self.full}: more than {MAX_PARTS} parts; raise part_size"
                )
            total += body.size if isinstance(body, FileRegion) else len(body)
            fut = self.pool.submit(self._upload_part, number, body)
            futures.append(fut)
            inflight.add(fut)
            if len(inflight) > self.max_concurrency:
                done, _ = concurrent.futures.wait(inflight, return_when="FIRST_COMPLETED")
                for d in done:
                    d.result()
                inflight -= done
        return total

    def _upload_part(self, number: int, body: bytes | FileRegion) -> dict[str, Any]:
        checksum = part_checksum(body) if self.algo == OWN_ALGORITHM else {}
        if isinstance(body, FileRegion) and not checksum:
            raise ValueError("s3: a file region is sent only with the plugin's own part checksum")

        def send(**kwargs: Any) -> Any:
            # A fresh body per attempt, so a retry sends the part from byte 0; views, not the bytes
            # (which botocore would copy piece by piece): rlm_storage_s3.parts.BodyView. A file
            # region is read from the file again, in small chunks (rlm.storage.filestream).
            fresh = (
                FileRegion(body.file, body.start, body.end)
                if isinstance(body, FileRegion)
                else BodyView(body)
            )
            return self.client.upload_part(Body=fresh, **kwargs)

        r = self._step(
            "upload_part",
            send,
            Bucket=self.bucket,
            Key=self.full,
            UploadId=self.upload_id,
            PartNumber=number,
            **self.algo,
            **checksum,
        )
        part = {"PartNumber": number, "ETag": r["ETag"], **checksum}
        if self.algo and r.get("ChecksumCRC32"):
            part["ChecksumCRC32"] = r["ChecksumCRC32"]
        return part

    def _abort(self) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=self.full, UploadId=self.upload_id)
        except Exception as abort_error:  # best effort: a lifecycle rule should clean up the rest
            log.warning(
                "s3: could not abort multipart upload of s3://%s/%s: %s",
                self.bucket,
                self.full,
                scrub(str(abort_error)),
            )

    def _completer(self, parts: list[dict[str, Any]], total: int) -> Callable[..., dict[str, Any]]:
        """CompleteMultipartUpload, idempotent under retries: when an earlier attempt's answer was
        lost, the store already assembled the object and a re-sent complete answers NoSuchUpload
        (or 412 under If-None-Match). Then the object under the key is ours iff its size and its
        multipart ETag (MD5 of the parts' MD5s + ``-N``) match; anything else is re-raised."""
        import botocore.exceptions as bex

        sent = [0]

        def complete(**cond: Any) -> dict[str, Any]:
            sent[0] += 1
            try:
                return dict(
                    self.client.complete_multipart_upload(
                        Bucket=self.bucket,
                        Key=self.full,
                        UploadId=self.upload_id,
                        MultipartUpload={"Parts": parts},
                        **cond,
                    )
                )
            except bex.ClientError as e:
                if (
                    sent[0] == 1
                    or code_of(e) not in ("NoSuchUpload", "PreconditionFailed")
                    or not status_of(e)
                ):
                    raise
                return self._find_earlier_completion(e, parts, total)

        return complete

    def _find_earlier_completion(
        self, e: Exception, parts: list[dict[str, Any]], total: int
    ) -> dict[str, Any]:
        """The answer of an earlier complete whose acknowledgement was lost, or ``e`` re-raised."""
        import botocore.exceptions as bex

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.full)
        except bex.ClientError:
            raise e from None  # nothing there: the upload really is gone
        etag = str(head.get("ETag", "")).strip('"')
        if int(head["ContentLength"]) != total or etag != multipart_etag(parts):
            raise e
        log.info(
            "s3: s3://%s/%s: an earlier CompleteMultipartUpload succeeded, its answer was lost",
            self.bucket,
            self.full,
        )
        return {"ETag": head.get("ETag", "")}
