"""The same job code against a live HDFS store (the session's MiniDFSCluster, tests/hdfsservers.py):
Spark's executors rebuild the hdfs backend from ``[remote.options]`` and read its objects over
WebHDFS; a flipped byte in an HDFS object is what the deep verify finds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.hdfsservers import HdfsTarget
from tests.spark.conftest import check_jobs_on_store

pytestmark = [pytest.mark.spark, pytest.mark.hdfs]


def test_read_and_verify_over_hdfs(spark: Any, hdfs_target: HdfsTarget, tmp_path: Path) -> None:
    check_jobs_on_store(spark, tmp_path / "logs", "hdfst", "hdfs", hdfs_target.options())
