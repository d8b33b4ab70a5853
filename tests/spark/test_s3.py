"""The same job code against real S3 servers — SeaweedFS (the session's, tests/s3servers.py) and
moto's server: executors rebuild the s3 backend and read over HTTP."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from rlm.tiering.store import object_keys
from tests.spark.conftest import (
    check_jobs_on_store,
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
    victim = check_jobs_on_store(spark, tmp_path / "logs", "s3t", "s3", s3_options)
    assert object_keys.parse_data_key("s3t", 0, victim) is not None
