"""The shared stores of the cluster tests: a prefix of moto's S3 server (the session fixture of
tests/storage) and a key prefix of the session's SeaweedFS (tests/s3servers.py); each yields
(raw boto3 view, [remote.options])."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.rig import RawStore
from tests.s3servers import S3Target
from tests.storage.conftest import BUCKET, aws_env, moto_endpoint  # noqa: F401 - pytest fixtures


@pytest.fixture
def moto_store(moto_endpoint: str) -> tuple[RawStore, dict[str, Any]]:  # noqa: F811 - the fixture
    import boto3

    prefix = f"cluster-{uuid.uuid4().hex[:8]}"
    options = {
        "bucket": BUCKET,
        "prefix": prefix,
        "endpoint_url": moto_endpoint,
        "path_style": True,
        "region": "us-east-1",
        "access_key_id": "testing",
        "secret_access_key": "testing",
    }
    client = boto3.client(
        "s3",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    return RawStore(client, BUCKET, prefix), options


@pytest.fixture
def seaweed_store(s3_target: S3Target) -> Iterator[tuple[RawStore, dict[str, Any]]]:
    """A key prefix of the session's SeaweedFS (tests/s3servers.py; or RLM_TEST_S3_ENDPOINT)."""
    client = s3_target.client()
    try:
        yield RawStore(client, s3_target.bucket, s3_target.prefix), s3_target.options(region="us-east-1")
    finally:
        client.close()
