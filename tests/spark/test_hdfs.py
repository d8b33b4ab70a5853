"""The same job code against a live HDFS store (the session's MiniDFSCluster, tests/hdfsservers.py):
Spark's executors rebuild the hdfs backend from ``[remote.options]`` and read its objects over
WebHDFS; a flipped byte in an HDFS object is what the deep verify finds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlm.jobs import plan_read, read_tiered, verify
from rlm.logdir.discovery import discover_partitions
from rlm.storage.registry import create_backend
from tests.hdfsservers import HdfsTarget
from tests.spark.conftest import (
    CODECS,
    arrow_records,
    kafka_python_records,
    make_settings,
    tier,
    write_generated,
)

pytestmark = [pytest.mark.spark, pytest.mark.hdfs]
pytest.importorskip("rlm_storage_hdfs")


def test_read_and_verify_over_hdfs(spark: Any, hdfs_target: HdfsTarget, tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    for p, codec in enumerate(CODECS[1:4]):
        write_generated(log_dir, "hdfst", p, codec, seed=20 + p, batches=32)
    options = hdfs_target.options()
    settings = make_settings([log_dir], backend="hdfs", options=options, index_entry_bytes=8192)
    tier(settings)
    plan = plan_read(settings, ["hdfst"], target_bytes=20_000)
    assert {t.source for t in plan.tasks} == {"remote", "local"}

    got = arrow_records(read_tiered(spark, settings, ["hdfst"], target_bytes=20_000).toArrow())
    expected = {(p.topic, p.partition): kafka_python_records(p.path) for p in discover_partitions([log_dir])}
    assert got == expected
    assert verify(spark, settings, deep=True).ok

    victim = plan.partitions[0].manifests[0].log.key
    hdfs = create_backend("hdfs", options)
    data = bytearray(hdfs.read(victim))
    data[100] ^= 0x01
    hdfs.put(victim, bytes(data))
    report = verify(spark, settings, deep=True)
    assert not report.ok
    assert {(p.check, p.key) for p in report.errors} >= {("object_crc32c", victim)}
    assert any(p.check in ("batch_crc", "batch_corrupt") and p.key == victim for p in report.errors)
