"""Transient store errors from a real S3 server (SeaweedFS behind a fault-injecting proxy): the
plugin reports them, the one retry layer where the store is opened retries each request with
backoff (a multipart upload step by step, under that same policy), lost acknowledgements never
duplicate, a persistent failure costs exactly ``max_attempts`` requests, and an exhausted error
names the operation, the object, the status and the attempts (docs/storage.md)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from rlm.errors import TransientStorageError
from rlm.storage.registry import open_backend
from rlm.storage.retry import RetryingBackend, RetryPolicy
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


def _options(target: S3Target, proxy: FaultProxy, **extra: Any) -> dict[str, Any]:
    return target.options(
        endpoint_url=proxy.endpoint,
        part_size="5MiB",
        multipart_threshold="5MiB",
        max_concurrency=2,
        conditional_create="native",
        retry_base_delay=0.01,
        **extra,
    )


def _backend(target: S3Target, proxy: FaultProxy, delays: list[float], **extra: Any) -> RetryingBackend:
    """The store as rlm opens it (the one retry seam), its backoff recorded instead of slept."""
    b = open_backend("s3", _options(target, proxy, **extra))
    assert isinstance(b, RetryingBackend)
    b.policy.sleep = delays.append
    return b


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
    info = b.put("m.json", b'{"a": 1}', if_absent=True)  # the retry finds its own object: success
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


def test_the_raw_plugin_reports_one_503_as_one_transient_error(
    s3_target: S3Target, proxy: FaultProxy
) -> None:
    """No retries inside the plugin (nor in botocore): one injected 503, one request, one error;
    the same call through the seam succeeds with one more request."""
    raw = S3Backend(**_options(s3_target, proxy))
    raw.put("k", b"v")
    for op, call in (("get", lambda: raw.read("k")), ("put", lambda: raw.put("k", b"v"))):
        proxy.fail(op, "503")
        before = proxy.seen[op]
        with pytest.raises(TransientStorageError, match="SlowDown"):
            call()
        assert proxy.seen[op] - before == 1, op
    seam = _backend(s3_target, proxy, [])
    proxy.fail("get", "503")
    before = proxy.seen["get"]
    assert seam.read("k") == b"v"
    assert proxy.seen["get"] - before == 2


@pytest.mark.parametrize(
    "op, size",
    [("get", 0), ("put", 0), ("upload_part", 6 * MiB), ("complete_multipart_upload", 6 * MiB)],
)
def test_a_persistent_503_costs_exactly_max_attempts_requests(
    s3_target: S3Target, proxy: FaultProxy, op: str, size: int
) -> None:
    """max_attempts requests of the failing step, never max_attempts squared: the multipart steps
    are retried under the seam's own policy object, and its exhausted error is not retried again."""
    b = _backend(s3_target, proxy, [], max_attempts=3)
    key = f"obj-{uuid.uuid4().hex[:6]}"
    b.put(key, b"v")
    proxy.fail(op, "503", times=-1)
    with pytest.raises(TransientStorageError) as exc:
        b.read(key) if op == "get" else b.put(key, payload(size or 10, 1))
    requests = 2 if op == "upload_part" else 1  # 6 MiB = two 5 MiB-sized parts, both in flight
    assert proxy.injected[f"{op}:503"] == 3 * requests  # each request 3 times, never 3 x 3
    assert exc.value.attempts == 3
    if op != "put":
        assert proxy.seen["create_multipart_upload"] <= 1  # the upload was not started again
    text = str(exc.value)  # one line: operation, object, code, status, attempts
    assert "\n" not in text
    for part in (op if op != "get" else "read", f"{s3_target.prefix}/{key}", "SlowDown", "HTTP 503"):
        assert part in text, (part, text)
    assert "gave up after 3 attempts" in text


def test_policy_over_a_backend_without_own_retries_still_retries() -> None:
    """A transient error from any callable is retried by the policy, up to ``max_attempts``."""
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise TransientStorageError("memory: injected")
        return "ok"

    assert RetryPolicy(max_attempts=5, sleep=lambda s: None).call(flaky) == "ok"
    assert len(calls) == 3
