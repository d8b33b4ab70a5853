"""The live HDFS of the HDFS suites: one MiniDFSCluster per pytest session (rlm/testing/hdfs_cluster.py).

``hdfs_server`` starts it once (free loopback ports, killed by pid at the end); ``hdfs_target``
hands each test its own root directory in it, so tests stay independent. With
``RLM_TEST_HDFS_URL`` set (``webhdfs://namenode:9870``, + ``RLM_TEST_HDFS_USER``) the same tests run
against that cluster instead and no MiniDFSCluster is started. Where the runtime is missing (no
Java, ``make hdfs`` not run) a test skips outside CI and fails in CI (tests/needs.py).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from rlm.testing.hdfs_cluster import HdfsCluster, hdfs_runtime_problem
from tests.needs import unavailable


@dataclass(frozen=True)
class HdfsTarget:
    """One WebHDFS ``url`` and this test's own ``root``; :meth:`options` is the ``[remote.options]``
    table of the ``hdfs`` backend for it."""

    url: str
    root: str
    user: str | None
    cluster: HdfsCluster | None  # None: RLM_TEST_HDFS_URL's cluster (no DataNode to stop)

    def options(self, **extra: Any) -> dict[str, Any]:
        """(A user only when one is named: TOML has no null.)"""
        user = {"user": self.user} if self.user else {}
        return {"url": self.url, "root": self.root, **user, **extra}


def require_hdfs() -> None:
    """Skip (outside CI) or fail (in CI) when a MiniDFSCluster cannot run here."""
    problem = hdfs_runtime_problem()
    if problem is not None:
        unavailable(f"live HDFS: {problem}")


@pytest.fixture(scope="session")
def hdfs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HdfsCluster | None]:
    """The session's MiniDFSCluster (None when RLM_TEST_HDFS_URL names another cluster)."""
    if os.environ.get("RLM_TEST_HDFS_URL"):
        yield None
        return
    require_hdfs()
    cluster = HdfsCluster(tmp_path_factory.mktemp("hdfs"))
    try:
        yield cluster.start()
    finally:
        cluster.close()


@pytest.fixture
def hdfs_target(hdfs_server: HdfsCluster | None) -> HdfsTarget:
    """A fresh root directory on the session's live HDFS."""
    root = f"/rlm-test-{uuid.uuid4().hex[:10]}"
    if hdfs_server is None:
        return HdfsTarget(os.environ["RLM_TEST_HDFS_URL"], root, os.environ.get("RLM_TEST_HDFS_USER"), None)
    return HdfsTarget(hdfs_server.url, root, None, hdfs_server)
