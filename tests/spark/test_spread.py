"""Spark jobs on a store with a key prefix spread (docs/key-spread.md) on SeaweedFS: executors
rebuild the backend from the plain ``BackendSpec`` (name, options, ``prefix_spread``), read every
record as kafka-python decodes it, and verify names corrupted objects by their logical keys."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from rlm.config import settings_from_mapping
from rlm.jobs import plan_read, read_tiered, verify
from rlm.logdir.discovery import discover_partitions
from rlm.storage.registry import create_backend, open_backend
from rlm.tiering.manager import RemoteLogManager
from tests.s3servers import S3Target
from tests.spark.conftest import CODECS, arrow_records, kafka_python_records, write_generated

pytestmark = [pytest.mark.spark, pytest.mark.s3]
pytest.importorskip("rlm_storage_s3")


def test_read_and_verify_with_spread_on_seaweedfs(spark: Any, s3_target: S3Target, tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    for p, codec in enumerate(CODECS[1:3]):
        write_generated(log_dir, "spread", p, codec, seed=20 + p, batches=32)
    options = s3_target.options()
    settings = settings_from_mapping(
        {
            "log": {"dirs": [str(log_dir)]},
            "remote": {"backend": "s3", "options": options, "prefix_spread": 2},
            "tiering": {"gc_grace_ms": 0, "index_entry_bytes": 8192},
            "topics": {"follow_kafka_configs": False},
            "cluster": {"leadership": "always"},
        }
    )
    results = RemoteLogManager(settings, open_backend("s3", options, 2)).run_once()
    assert all(r.error is None for r in results) and any(r.copied for r in results)

    plan = plan_read(settings, ["spread"], target_bytes=20_000)
    assert {t.source for t in plan.tasks} == {"remote", "local"}
    got = arrow_records(read_tiered(spark, settings, ["spread"], target_bytes=20_000).toArrow())
    parts = discover_partitions([log_dir])
    assert got == {(p.topic, p.partition): kafka_python_records(p.path) for p in parts}
    assert verify(spark, settings, deep=True).ok

    victim = plan.partitions[0].manifests[0].log.key  # a logical key
    raw = create_backend("s3", options)
    stored = f"{hashlib.sha256(victim.split('/')[0].split('=')[0].encode()).hexdigest()[:2]}/{victim}"
    data = bytearray(raw.read(stored))
    data[100] ^= 0x01
    raw.put(stored, bytes(data))
    report = verify(spark, settings, deep=True)
    assert not report.ok and ("object_crc32c", victim) in {(p.check, p.key) for p in report.errors}
