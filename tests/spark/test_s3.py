"""The same job code against real S3 servers — SeaweedFS (the session's, tests/s3servers.py) and
moto's server: executors rebuild the s3 backend and read over HTTP."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from rlm.jobs import plan_read, read_tiered, verify
from rlm.logdir.discovery import discover_partitions
from rlm.tiering.store import object_keys
from tests.spark.conftest import (
    CODECS,
    arrow_records,
    kafka_python_records,
    make_settings,
    tier,
    write_generated,
)

pytestmark = [pytest.mark.spark, pytest.mark.s3]
pytest.importorskip("rlm_storage_s3")


@pytest.fixture(params=["seaweedfs", "moto"])
def s3_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    """``[remote.options]`` of the s3 backend on each server. Credentials in the options (not only
    the driver's environment): executors rebuild the backend from them."""
    if request.param == "moto":
        endpoint = request.getfixturevalue("moto_endpoint")
        return {
            "bucket": "rlm-test",
            "prefix": f"jobs-{uuid.uuid4().hex[:8]}",
            "endpoint_url": endpoint,
            "region": "us-east-1",
            "path_style": True,
            "access_key_id": "testing",
            "secret_access_key": "testing",
        }
    options: dict[str, Any] = request.getfixturevalue("s3_target").options()
    return options


def test_read_and_verify_over_s3(spark: Any, s3_options: dict[str, Any], tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    for p, codec in enumerate(CODECS[1:4]):
        write_generated(log_dir, "s3t", p, codec, seed=10 + p, batches=32)
    options = s3_options
    settings = make_settings([log_dir], backend="s3", options=options, index_entry_bytes=8192)
    tier(settings)
    plan = plan_read(settings, ["s3t"], target_bytes=20_000)
    assert {t.source for t in plan.tasks} == {"remote", "local"}

    got = arrow_records(read_tiered(spark, settings, ["s3t"], target_bytes=20_000).toArrow())
    expected = {(p.topic, p.partition): kafka_python_records(p.path) for p in discover_partitions([log_dir])}
    assert got == expected

    assert verify(spark, settings, deep=True).ok
    backend = plan.partitions[0]
    victim = backend.manifests[0].log.key
    from rlm.storage.registry import create_backend

    s3 = create_backend("s3", options)
    data = bytearray(s3.read(victim))
    data[100] ^= 0x01
    s3.put(victim, bytes(data))
    report = verify(spark, settings, deep=True)
    assert not report.ok
    assert {(p.check, p.key) for p in report.errors} >= {("object_crc32c", victim)}
    assert any(p.check in ("batch_crc", "batch_corrupt") and p.key == victim for p in report.errors)
    assert object_keys.parse_data_key("s3t", 0, victim) is not None
