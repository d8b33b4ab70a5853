"""Tiering passes against a real S3 server (the session's SeaweedFS) that fails some requests: a
500 on an ``upload_part`` is retried within the pass; one that outlasts the retries fails the
partition's pass with one line naming the partition, object, operation, status and attempts, and
the next pass resumes and converges."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlm.cli.generate import generate_log_dir
from rlm.config import load_settings
from rlm.storage.registry import open_backend
from rlm.testing.configs import write_config
from rlm.testing.faultproxy import FaultProxy
from rlm.testing.store_check import check_store
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.manager import RemoteLogManager
from tests.s3servers import S3Target

pytestmark = [pytest.mark.s3, pytest.mark.integration]
pytest.importorskip("rlm_storage_s3")
TOPIC = "errs"


@pytest.fixture
def proxy(s3_target: S3Target) -> Iterator[FaultProxy]:
    with FaultProxy(s3_target.endpoint) as p:
        yield p


def _manager(tmp_path: Path, s3_target: S3Target, proxy: FaultProxy) -> tuple[Path, RemoteLogManager, Any]:
    logs = tmp_path / "logs"
    generate_log_dir(logs, [(TOPIC, 2)], seed=5, records=300, segment_bytes=8 * 1024)
    # A tiny multipart threshold: every segment.log goes up as CreateMultipartUpload + UploadPart
    # + CompleteMultipartUpload, the requests SeaweedFS was seen failing.
    options = s3_target.options(
        endpoint_url=proxy.endpoint,
        multipart_threshold="4KiB",
        max_attempts=3,
        retry_base_delay=0.01,
        retry_max_delay=0.05,
    )
    cfg = write_config(tmp_path / "c.toml", [logs], backend="s3", options=options)
    backend = open_backend("s3", options)  # retried as the daemon opens it
    return logs, RemoteLogManager(load_settings(cfg), backend, metrics=TieringMetrics()), backend


def test_transient_upload_part_errors_are_retried_within_the_pass(
    tmp_path: Path, s3_target: S3Target, proxy: FaultProxy
) -> None:
    logs, manager, backend = _manager(tmp_path, s3_target, proxy)
    proxy.fail("upload_part", "500", times=2)
    proxy.fail("complete_multipart_upload", "503")
    proxy.fail("get", "500")
    results = manager.run_once()
    assert not [r.error for r in results if r.error]
    assert sum(len(r.copied) for r in results) > 0
    assert proxy.injected["upload_part:500"] == 2 and proxy.injected["complete_multipart_upload:503"] == 1
    check = check_store([logs], backend)
    assert not check.unreferenced


def test_a_pass_that_still_fails_names_the_object_and_resumes(
    tmp_path: Path, s3_target: S3Target, proxy: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    logs, manager, backend = _manager(tmp_path, s3_target, proxy)
    proxy.fail("upload_part", "500", times=-1)
    with caplog.at_level(logging.ERROR, logger="rlm.tiering.manager"):
        results = manager.run_once()
    failed = {r.partition: r.error for r in results if r.error}
    assert failed, "every upload_part failed: the pass must fail"
    rows = {(row["topic"], row["partition"]): row for row in manager.status(observe=False)}
    for partition, error in failed.items():
        assert error is not None
        last = rows[(TOPIC, partition)]["last_error"]
        assert last == error and "\n" not in last
        for part in (
            "upload_part",
            f"s3://{s3_target.bucket}/{s3_target.prefix}/",
            "/segment.log",
            "InternalError",
            "HTTP 500",
            "gave up after 3 attempts",
        ):
            assert part in last, (part, last)
        messages = [r.getMessage() for r in caplog.records]
        logged = [m for m in messages if m.startswith(f"{TOPIC}-{partition}: ")]
        assert logged and "upload_part" in logged[0]
    # 3 attempts per failed object, never 3 x 3: one retry layer per request
    assert proxy.injected["upload_part:500"] == 3 * len(failed)

    proxy.clear()  # the store recovers: the next pass resumes and converges
    results = manager.run_once()
    assert not [r.error for r in results if r.error]
    assert all(row["last_error"] is None for row in manager.status(observe=False))
    check = check_store([logs], backend, deep=True)
    assert not check.unreferenced
