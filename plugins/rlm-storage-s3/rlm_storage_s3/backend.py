"""``s3``: Amazon S3 and S3-compatible stores (MinIO, Ceph RGW, s3rver, moto) through boto3.

Options (``[remote.options]``)::

    bucket = "tiered"                 # required
    prefix = "kafka/"                 # key prefix inside the bucket ("" = bucket root)
    endpoint_url = "http://minio:9000"  # S3-compatible endpoint; unset = AWS
    region = "eu-west-1"              # unset = the standard AWS chain (AWS_DEFAULT_REGION, profile)
    path_style = true                 # path-style addressing (MinIO, most on-prem stores)
    # credentials: unset = standard AWS chain (env, shared profile, container/instance role)
    access_key_id = "..."  secret_access_key = "..."  session_token = "..."  profile = "name"
    part_size = "8MiB"                # multipart part size (>= 5 MiB, S3's minimum)
    multipart_threshold = "8MiB"      # objects larger than this are uploaded in parts
    max_concurrency = 8               # parallel part uploads per object
    storage_class = "STANDARD_IA"     # unset = the bucket default
    sse = "aws:kms"                   # "AES256" | "aws:kms"; sse_kms_key_id = "arn:..."
    request_checksum_calculation = "when_required"   # for stores that mangle aws-chunked uploads
    response_checksum_validation = "when_supported"
    conditional_create = "auto"       # "native" (If-None-Match: *) | "emulated" (HEAD + PUT) | "auto"
    max_attempts = 8                  # attempts per request on throttling (503 SlowDown), 5xx, timeouts ...
    retry_base_delay = 0.1            # ... with exponential backoff + full jitter (seconds)
    retry_max_delay = 20.0
    connect_timeout = 10.0  read_timeout = 60.0  verify_ssl = true  ca_bundle = "/path/ca.pem"

Conditional create is S3's ``PutObject``/``CompleteMultipartUpload`` with ``If-None-Match: *``; a
``412 PreconditionFailed`` becomes :class:`~rlm.errors.ObjectExistsError`. ``auto`` probes once (two
conditional puts of a scratch key under ``<prefix>.rlm-probe/``) whether the store honours the header;
stores that ignore it get ``emulated`` (HEAD then PUT — not atomic, reported as
``capabilities.conditional_create = False``).

Retries: this backend reports throttling, 5xx and timeouts as
:class:`~rlm.errors.TransientStorageError` (rlm_storage_s3/errors.py) and never retries itself;
botocore's own retries are off (``total_max_attempts = 1``). ``max_attempts`` / ``retry_base_delay``
/ ``retry_max_delay`` configure the one retry layer where the store is opened
(:meth:`S3Backend.retry_options`, docs/storage.md); that layer hands its policy down for the steps
of a multipart upload, so a 500 on one part re-sends that part (rlm_storage_s3/multipart.py).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Iterable
from typing import Any, BinaryIO, ClassVar, TypeVar

from rlm.errors import (
    ConfigError,
    ObjectExistsError,
    ObjectNotFoundError,
    StorageError,
    TransientStorageError,
)
from rlm.storage.api import RESERVED_PREFIX, Capabilities, ListPage, ObjectInfo, StorageBackend
from rlm.storage.filestream import FileStream
from rlm.storage.options import Option, at_least
from rlm.storage.redaction import register_secret, scrub
from rlm.storage.retry import RetryPolicy
from rlm_storage_s3.errors import TRANSIENT_CODES, status_of, translate
from rlm_storage_s3.multipart import OWN_ALGORITHM, MultipartUpload
from rlm_storage_s3.parts import read_exact, split_parts

__all__ = ["MIN_PART_SIZE", "S3Backend"]

log = logging.getLogger(__name__)
T = TypeVar("T")

MIN_PART_SIZE = 5 * 1024 * 1024
_CHECKSUM_MODES = ("when_supported", "when_required")


class S3Backend(StorageBackend):
    """An S3 bucket (+ prefix) as an object store; see module doc."""

    name: ClassVar[str] = "s3"
    OPTIONS: ClassVar[tuple[Option, ...]] = (
        Option("bucket", "str", required=True, help="the bucket name"),
        Option("prefix", "str", default=""),
        Option("endpoint_url", "str"),
        Option("region", "str"),
        Option("path_style", "bool", default=False),
        Option("access_key_id", "str", secret=True),
        Option("secret_access_key", "str", secret=True),
        Option("session_token", "str", secret=True),
        Option("profile", "str"),
        Option("part_size", "size", default=8 * 1024 * 1024, check=at_least(MIN_PART_SIZE)),
        Option("multipart_threshold", "size", default=None, check=at_least(1)),
        Option("max_concurrency", "int", default=8, check=at_least(1)),
        Option("storage_class", "str"),
        Option("sse", "str", choices=("AES256", "aws:kms")),
        Option("sse_kms_key_id", "str"),
        Option("request_checksum_calculation", "str", default="when_supported", choices=_CHECKSUM_MODES),
        Option("response_checksum_validation", "str", default="when_supported", choices=_CHECKSUM_MODES),
        Option("conditional_create", "str", default="auto", choices=("auto", "native", "emulated")),
        Option("max_attempts", "int", default=8, check=at_least(1)),
        Option("retry_base_delay", "float", default=0.1, check=at_least(0)),
        Option("retry_max_delay", "float", default=20.0, check=at_least(0)),
        Option("connect_timeout", "float", default=10.0, check=at_least(0)),
        Option("read_timeout", "float", default=60.0, check=at_least(0)),
        Option("verify_ssl", "bool", default=True),
        Option("ca_bundle", "str"),
    )

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        o = self.options
        if o["bucket"] == "" or "/" in o["bucket"]:
            raise ConfigError(f"remote.options.bucket = {o['bucket']!r} is invalid: a name without '/'")
        if bool(o["access_key_id"]) != bool(o["secret_access_key"]):
            raise ConfigError("remote.options.access_key_id and secret_access_key must be set together")
        if o["sse_kms_key_id"] and o["sse"] != "aws:kms":
            raise ConfigError('remote.options.sse_kms_key_id requires sse = "aws:kms"')
        prefix = o["prefix"].strip("/")
        self._prefix = prefix + "/" if prefix else ""
        self.bucket: str = o["bucket"]
        self.part_size: int = o["part_size"]
        self.threshold: int = o["multipart_threshold"] or self.part_size
        self._part_checksums = o["request_checksum_calculation"] == "when_supported"
        for secret in (o["secret_access_key"], o["session_token"]):
            register_secret(secret)
        #: The retry layer's policy for the steps of a multipart upload (None: each sent once).
        self._step_policy: RetryPolicy | None = None
        self._client = self._make_client()
        self._native: bool | None = {"auto": None, "native": True, "emulated": False}[o["conditional_create"]]
        self._probe_lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def _make_client(self) -> Any:
        import boto3
        import botocore.config
        import botocore.exceptions

        o = self.options
        try:
            session = boto3.session.Session(
                aws_access_key_id=o["access_key_id"],
                aws_secret_access_key=o["secret_access_key"],
                aws_session_token=o["session_token"],
                profile_name=o["profile"],
                region_name=o["region"],
            )
            creds = session.get_credentials()
            if creds is not None:  # resolved from the chain: keep those out of logs too
                frozen = creds.get_frozen_credentials()
                register_secret(frozen.secret_key)
                register_secret(frozen.token)
            config = botocore.config.Config(
                s3={"addressing_style": "path" if o["path_style"] else "auto"},
                retries={"total_max_attempts": 1, "mode": "standard"},
                max_pool_connections=max(10, 2 * o["max_concurrency"]),
                connect_timeout=o["connect_timeout"],
                read_timeout=o["read_timeout"],
                request_checksum_calculation=o["request_checksum_calculation"],
                response_checksum_validation=o["response_checksum_validation"],
            )
            verify: bool | str = o["ca_bundle"] or o["verify_ssl"]
            return session.client("s3", endpoint_url=o["endpoint_url"], config=config, verify=verify)
        except botocore.exceptions.ProfileNotFound as e:
            raise ConfigError(f"remote.options.profile = {o['profile']!r}: {e}") from None
        except (botocore.exceptions.BotoCoreError, ValueError) as e:
            raise ConfigError(f"s3: invalid client configuration: {scrub(str(e))}") from None

    def retry_options(self) -> dict[str, Any]:
        o = self.options
        return {
            "max_attempts": o["max_attempts"],
            "base_delay": o["retry_base_delay"],
            "max_delay": o["retry_max_delay"],
        }

    def use_retry_policy(self, policy: RetryPolicy) -> None:
        self._step_policy = policy

    def close(self) -> None:
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
        self._client.close()

    # -- helpers --------------------------------------------------------------------------------

    def _full(self, key: str) -> str:
        return self._prefix + key

    def _where(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._full(key)}"

    def _call(self, op: str, key: str, fn: Callable[..., T], /, **kwargs: Any) -> T:
        """Run one SDK call (plus reading its body inside ``fn``), its errors translated once
        (rlm_storage_s3/errors.py). Not retried here: see the module doc."""
        import botocore.exceptions as bex

        try:
            return fn(**kwargs)
        except (bex.BotoCoreError, bex.ClientError) as e:
            raise translate(op, self._where(key), e) from e

    def _put_extra(self) -> dict[str, Any]:
        o = self.options
        extra: dict[str, Any] = {}
        if o["storage_class"]:
            extra["StorageClass"] = o["storage_class"]
        if o["sse"]:
            extra["ServerSideEncryption"] = o["sse"]
            if o["sse_kms_key_id"]:
                extra["SSEKMSKeyId"] = o["sse_kms_key_id"]
        return extra

    # -- capabilities / conditional create ------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(conditional_create=self._conditional_native(), multipart=True)

    def _conditional_native(self) -> bool:
        """Whether the store honours ``If-None-Match: *`` (probed once in ``auto`` mode)."""
        if self._native is not None:
            return self._native
        with self._probe_lock:
            if self._native is None:
                self._native = self._probe()
                log.info(
                    "s3: %s conditional writes (If-None-Match) for bucket %s: %s",
                    "using" if self._native else "store ignores",
                    self.bucket,
                    "native" if self._native else "emulated with HEAD + PUT (not atomic)",
                )
        return self._native

    def _probe(self) -> bool:
        key = f"{RESERVED_PREFIX}probe/{uuid.uuid4().hex}"
        full = self._full(key)

        def create(body: bytes) -> None:
            self._call(
                "probe",
                key,
                self._client.put_object,
                Bucket=self.bucket,
                Key=full,
                Body=body,
                IfNoneMatch="*",
            )

        try:
            create(b"1")
            try:
                create(b"2")  # a store honouring If-None-Match refuses this second create
            except ObjectExistsError:
                return True
            return False
        except StorageError as e:
            if isinstance(e, TransientStorageError):
                raise
            log.info("s3: conditional-write probe failed (%s); emulating conditional create", e)
            return False
        finally:
            self._call("probe", key, self._client.delete_object, Bucket=self.bucket, Key=full)

    # -- writes ---------------------------------------------------------------------------------

    def _put(self, key: str, stream: BinaryIO, if_absent: bool) -> ObjectInfo:
        native = self._conditional_native() if if_absent else False
        if if_absent and not native and self.exists(key):
            raise ObjectExistsError(f"s3: {self._where(key)} already exists")
        cond: dict[str, Any] = {"IfNoneMatch": "*"} if native else {}
        algorithm = self._part_algorithm()
        if (
            isinstance(stream, FileStream)
            and algorithm == OWN_ALGORITHM
            and stream.size - stream.tell() > self.threshold
        ):
            # A local file, parts checksummed by the plugin: each part's thread reads its own part
            # from the file (rlm.storage.filestream), nothing read ahead on this one. Only with
            # the plugin's own part checksum, which the store verifies against the bytes it gets:
            # the file is read once for it and again for sending.
            upload = self._multipart(key, algorithm)
            return upload.run(stream.regions(self.part_size), cond)
        # Read the threshold, then one part more: EOF there means a single PUT. Reading whole
        # parts (not threshold + 1 bytes) keeps every later part aligned, so part bodies are the
        # stream's own read results, never re-sliced or concatenated copies.
        first = read_exact(stream, self.threshold)
        second = read_exact(stream, self.part_size) if len(first) == self.threshold else b""
        if not second:
            resp = self._call(
                "put",
                key,
                self._client.put_object,
                Bucket=self.bucket,
                Key=self._full(key),
                Body=first,
                **cond,
                **self._put_extra(),
            )
            return ObjectInfo(key, len(first), str(resp.get("ETag", "")).strip('"') or None)
        return self._multipart(key, algorithm).run(split_parts(first, second, stream, self.part_size), cond)

    def _multipart(self, key: str, algorithm: dict[str, Any]) -> MultipartUpload:
        return MultipartUpload(
            self._client,
            self.bucket,
            key,
            self._full(key),
            self._call,
            self._executor(),
            self.options["max_concurrency"],
            self._step_policy,
            # As s3transfer does: with request checksums on, declare a checksum for the upload, so
            # every part carries one and the object gets a composite checksum from the parts';
            # without it the store builds a full-object one by re-reading the object.
            algorithm,
            self._put_extra(),
        )

    def _part_algorithm(self) -> dict[str, Any]:
        """The multipart upload's ``ChecksumAlgorithm``: none with request checksums off; CRC32C
        computed by the plugin on a plain-HTTP endpoint (multipart.part_checksum); else CRC32,
        computed by botocore as s3transfer has it (over HTTPS in a trailer, no payload SHA-256)."""
        if not self._part_checksums:
            return {}
        plain_http = (self.options["endpoint_url"] or "").lower().startswith("http://")
        return dict(OWN_ALGORITHM) if plain_http else {"ChecksumAlgorithm": "CRC32"}

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    self.options["max_concurrency"], thread_name_prefix="rlm-s3-part"
                )
            return self._pool

    def _delete(self, key: str) -> None:
        with contextlib.suppress(ObjectNotFoundError):  # some S3-compatible stores answer 404
            self._call("delete", key, self._client.delete_object, Bucket=self.bucket, Key=self._full(key))

    def delete_many(self, keys: Iterable[str]) -> None:
        """Batched DeleteObjects (1000 keys per request); missing keys are fine."""
        from rlm.storage.api import validate_key

        batch: list[str] = []
        for key in keys:
            batch.append(validate_key(key))
            if len(batch) == 1000:
                self._delete_batch(batch)
                batch = []
        if batch:
            self._delete_batch(batch)

    def _delete_batch(self, keys: list[str]) -> None:
        resp = self._call(
            "delete_objects",
            keys[0],
            self._client.delete_objects,
            Bucket=self.bucket,
            Delete={"Objects": [{"Key": self._full(k)} for k in keys], "Quiet": True},
        )
        errors = [e for e in resp.get("Errors", []) if e.get("Code") != "NoSuchKey"]
        if errors:
            first = errors[0]
            text = f"s3: delete {len(errors)} object(s) failed, e.g. {first.get('Key')}: {first.get('Code')}"
            if first.get("Code") in TRANSIENT_CODES:
                raise TransientStorageError(text)
            raise StorageError(text)

    # -- reads ----------------------------------------------------------------------------------

    def _read(self, key: str, start: int, end: int | None) -> bytes:
        if end is not None and end == start:
            self._head(key)  # an empty range still requires the object to exist
            return b""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._full(key)}
        if start > 0 or end is not None:
            kwargs["Range"] = f"bytes={start}-{'' if end is None else end - 1}"

        def get() -> bytes:
            body = self._client.get_object(**kwargs)["Body"]
            try:
                return bytes(body.read())
            finally:
                body.close()

        try:
            return self._call("read", key, get)
        except StorageError as e:
            cause = e.__cause__
            if "Range" in kwargs and status_of(cause) == 416:
                return b""  # the object exists (else 404) but the range starts at/after its end
            raise

    def _head(self, key: str) -> ObjectInfo:
        r = self._call("head", key, self._client.head_object, Bucket=self.bucket, Key=self._full(key))
        lm = r.get("LastModified")
        return ObjectInfo(
            key,
            int(r["ContentLength"]),
            str(r.get("ETag", "")).strip('"') or None,
            lm.timestamp() if lm is not None else None,
        )

    def _list_page(self, prefix: str, start_after: str | None, limit: int) -> ListPage:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._full(prefix), "MaxKeys": limit}
        if start_after is not None:
            kwargs["StartAfter"] = self._full(start_after)
        r = self._call("list", prefix, self._client.list_objects_v2, **kwargs)
        n = len(self._prefix)
        objects = []
        for c in r.get("Contents", []):
            key = c["Key"][n:]
            if key.startswith(RESERVED_PREFIX):
                continue  # the capability probe's scratch keys
            lm = c.get("LastModified")
            objects.append(
                ObjectInfo(
                    key,
                    int(c["Size"]),
                    str(c.get("ETag", "")).strip('"') or None,
                    lm.timestamp() if lm is not None else None,
                )
            )
        contents = r.get("Contents", [])
        more = bool(r.get("IsTruncated")) and bool(contents)
        return ListPage(tuple(objects), contents[-1]["Key"][n:] if more else None)
