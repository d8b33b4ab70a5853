"""Transient store errors from a real S3 server (SeaweedFS behind a fault-injecting proxy): each
request is retried once-level with backoff, lost acknowledgements never duplicate, and an
exhausted error names the operation, the object, the status and the attempts."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from rlm.errors import TransientStorageError
from rlm.storage.retry import RetryingBackend, RetryPolicy, put_if_absent_idempotent
from rlm.testing.backend_suite import payload
from rlm.testing.faultproxy import FaultProxy
from tests.s3servers import S3Target

pytestmark = pytest.mark.s3
S3Backend = pytest.importorskip("rlm_storage_s3").S3Backend

MiB = 1024 * 1024


@pytest.fixture
def proxy(s3_target: S3Target) -> Iterator[FaultProxy]:
    with FaultProxy(s3_target.endpoint) as p:
        yield p


def _backend(target: S3Target, proxy: FaultProxy, delays: list[float], **extra: Any) -> Any:
    opts = target.options(
        endpoint_url=proxy.endpoint,
        part_size="5MiB",
        multipart_threshold="5MiB",
        max_concurrency=2,
        conditional_create="native",
        retry_base_delay=0.01,
        **extra,
    )
    return S3Backend(sleep=delays.append, **opts)


def test_failed_upload_part_is_resent_alone(s3_target: S3Target, proxy: FaultProxy) -> None:
    delays: list[float] = []
    b = _backend(s3_target, proxy, delays)
    data = payload(11 * MiB, 7)  # three parts
    proxy.fail("upload_part", "500", times=2)
    proxy.fail("create_multipart_upload", "503")
    proxy.fail("complete_multipart_upload", "500")
    b.put("seg.log", data)
    assert b.read("seg.log") == data
    assert proxy.injected == {
        "upload_part:500": 2,
        "create_multipart_upload:503": 1,
        "complete_multipart_upload:500": 1,
    }
    assert proxy.seen["upload_part"] == 3 + 2  # only the failed parts were sent again
    assert proxy.seen["put"] == 0
    assert len(delays) == 4 and all(0 <= d <= 20.0 for d in delays)  # backoff before each retry


def test_lost_complete_ack_does_not_fail_or_duplicate(s3_target: S3Target, proxy: FaultProxy) -> None:
    delays: list[float] = []
    b = _backend(s3_target, proxy, delays)
    data = payload(6 * MiB, 8)
    proxy.fail("complete_multipart_upload", "lost_ack")
    b.put("seg.log", data, if_absent=True)  # a conditional create: the re-sent complete finds it
    assert proxy.injected["complete_multipart_upload:lost_ack"] == 1
    assert proxy.seen["complete_multipart_upload"] == 2
    assert b.read("seg.log") == data
    assert [o.key for o in b.list("")] == ["seg.log"]


def test_lost_conditional_put_ack_never_duplicates(s3_target: S3Target, proxy: FaultProxy) -> None:
    b = _backend(s3_target, proxy, [])
    proxy.fail("put", "lost_ack")
    info = put_if_absent_idempotent(b, "m.json", b'{"a": 1}', RetryPolicy(sleep=lambda s: None))
    assert info.size == 8 and proxy.injected["put:lost_ack"] == 1
    assert [o.key for o in b.list("")] == ["m.json"] and b.read("m.json") == b'{"a": 1}'


@pytest.mark.parametrize(
    "op, call",
    [
        ("get", lambda b: b.read("k")),
        ("head", lambda b: b.head("k")),
        ("list", lambda b: list(b.list(""))),
        ("delete", lambda b: b.delete("k")),
        ("put", lambda b: b.put("k2", b"x")),
    ],
)
def test_every_operation_is_retried(s3_target: S3Target, proxy: FaultProxy, op: str, call: Any) -> None:
    b = _backend(s3_target, proxy, [])
    b.put("k", b"v")
    proxy.fail(op, "503", times=2)
    call(b)
    assert proxy.injected[f"{op}:503"] == 2


def test_nested_policies_retry_each_request_once_level(s3_target: S3Target, proxy: FaultProxy) -> None:
    """A RetryingBackend (or a call site's policy) over the plugin's own request retries does not
    multiply the attempts: the exhausted error is marked and passes through."""
    b = _backend(s3_target, proxy, [], max_attempts=3)
    wrapped = RetryingBackend(b, RetryPolicy(max_attempts=5, sleep=lambda s: None))
    key = f"obj-{uuid.uuid4().hex[:6]}"
    proxy.fail("get", "500", times=-1)  # a GET: a HEAD's error has no body, so no code
    with pytest.raises(TransientStorageError) as exc:
        RetryPolicy(max_attempts=4, sleep=lambda s: None).call(wrapped.read, key)
    assert proxy.seen["get"] == 3
    assert exc.value.attempts == 3
    text = str(exc.value)  # one line: operation, object, code, status, attempts
    assert "\n" not in text
    for part in (
        "read",
        f"{s3_target.prefix}/{key}",
        "InternalError",
        "HTTP 500",
        "gave up after 3 attempts",
    ):
        assert part in text, (part, text)


def test_policy_over_a_backend_without_own_retries_still_retries() -> None:
    """The marker only stops re-retrying: a plain transient error is retried by the one policy."""
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise TransientStorageError("memory: injected")
        return "ok"

    assert RetryPolicy(max_attempts=5, sleep=lambda s: None).call(flaky) == "ok"
    assert len(calls) == 3
