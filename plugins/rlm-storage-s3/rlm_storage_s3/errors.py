"""How the ``s3`` backend reports failures: the one place botocore errors become rlm.errors.

Transient (safe to retry; the retry layer where the store is opened does, docs/storage.md):
throttling and server-side codes (``SlowDown``, ``InternalError``, ...), HTTP 429 and 5xx, and the
transport failures botocore raises by type (connection refused/reset, connect/read timeouts, a
response body cut off). 404 is :class:`~rlm.errors.ObjectNotFoundError` (but not a missing bucket
or upload), 412 :class:`~rlm.errors.ObjectExistsError`, anything else
:class:`~rlm.errors.StorageError`. Texts are scrubbed of credentials.
"""

from __future__ import annotations

from typing import Any

from rlm.errors import ObjectExistsError, ObjectNotFoundError, StorageError, TransientStorageError
from rlm.storage.redaction import scrub

__all__ = ["TRANSIENT_CODES", "code_of", "status_of", "translate"]

TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "InternalError",
        "ServiceUnavailable",
        "RequestLimitExceeded",
        "TooManyRequests",
        "ConditionalRequestConflict",
        "OperationAborted",
    }
)
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})


def translate(op: str, where: str, e: Exception) -> StorageError:
    """The rlm error for botocore error ``e`` of operation ``op`` on ``where`` (an ``s3://`` URL)."""
    import botocore.exceptions as bex

    if isinstance(e, bex.ClientError):
        return _client_error(op, where, e)
    transport = (
        bex.ConnectionError,
        bex.HTTPClientError,
        bex.ReadTimeoutError,
        bex.ConnectTimeoutError,
        bex.ResponseStreamingError,
    )
    if isinstance(e, transport):
        return TransientStorageError(scrub(f"s3: {op} {where}: {type(e).__name__}: {e}"))
    if isinstance(e, bex.NoCredentialsError):
        return StorageError(
            f"s3: {op} {where}: no AWS credentials found (env, profile, instance role); "
            "set access_key_id/secret_access_key or the AWS_* environment"
        )
    return StorageError(scrub(f"s3: {op} {where}: {type(e).__name__}: {e}"))


def _client_error(op: str, where: str, e: Any) -> StorageError:
    """An S3 answer with an error status, by its code first, then its HTTP status."""
    err = e.response.get("Error", {})
    code = str(err.get("Code", ""))
    status = status_of(e)
    text = scrub(f"s3: {op} {where}: {code or status} (HTTP {status}): {err.get('Message', '')}")
    if code in _NOT_FOUND_CODES or (status == 404 and code not in ("NoSuchBucket", "NoSuchUpload")):
        return ObjectNotFoundError(text)
    if code == "PreconditionFailed" or status == 412:
        return ObjectExistsError(text)
    if code in TRANSIENT_CODES or status == 429 or status >= 500:
        return TransientStorageError(text)
    return StorageError(text)


def status_of(e: BaseException | None) -> int:
    """The HTTP status of a botocore ClientError (0 when ``e`` is none or carries no response)."""
    response = getattr(e, "response", None)
    if isinstance(response, dict):
        return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    return 0


def code_of(e: BaseException) -> str:
    """The S3 error code of a botocore ClientError ("" when none)."""
    response = getattr(e, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""
