"""read_tiered and export under isolation=read_committed (docs/transactions.md): one Spark run
over a transactional partition tiered in part, against the kafka-python oracle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlm.jobs import export, read_tiered
from tests.spark.conftest import txn_env


def test_read_tiered_and_export_read_committed(spark: Any, tmp_path: Path) -> None:
    settings, oracle = txn_env(tmp_path)  # remote and local tasks both
    df = read_tiered(spark, settings, ["txn"], target_bytes=3_000, isolation="read_committed")
    rows = sorted((r.offset, r.key, r.value) for r in df.select("offset", "key", "value").collect())
    assert rows == [(r.offset, r.key, r.value) for r in oracle.committed]
    both = read_tiered(spark, settings, ["txn"], target_bytes=3_000)  # the default: read_uncommitted
    assert both.count() == len(oracle.uncommitted) > len(rows)
    result = export(
        spark, settings, ["txn"], str(tmp_path / "out"), target_bytes=3_000, isolation="read_committed"
    )
    assert result.records == len(oracle.committed)
    offsets = sorted(r.offset for r in spark.read.parquet(str(tmp_path / "out")).select("offset").collect())
    assert offsets == [r.offset for r in oracle.committed]
