"""read_tiered and export under isolation=read_committed (docs/transactions.md): one Spark run
over a transactional partition tiered in part, against the kafka-python oracle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlm.jobs import export, read_tiered
from tests.lookup.helpers import delete_local_segments
from tests.spark.conftest import make_settings, tier
from tests.tiering.txn_helpers import Oracle, write_txn_log


def test_read_tiered_and_export_read_committed(spark: Any, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_txn_log(logs, "txn", 0, seed=5, leave_open=True)
    oracle = Oracle.of(logs / "txn-0")
    settings = make_settings([logs], options={"root": str(tmp_path / "store")}, index_entry_bytes=2_000,
                             state_dir=str(tmp_path / "state"))
    tier(settings)
    delete_local_segments(logs / "txn-0", keep_last=3)  # remote and local tasks both
    df = read_tiered(spark, settings, ["txn"], target_bytes=3_000, isolation="read_committed")
    rows = sorted((r.offset, r.key, r.value) for r in df.select("offset", "key", "value").collect())
    assert rows == [(r.offset, r.key, r.value) for r in oracle.committed]
    both = read_tiered(spark, settings, ["txn"], target_bytes=3_000)  # the default: read_uncommitted
    assert both.count() == len(oracle.uncommitted) > len(rows)
    result = export(spark, settings, ["txn"], str(tmp_path / "out"), target_bytes=3_000,
                    isolation="read_committed")
    assert result.records == len(oracle.committed)
    offsets = sorted(r.offset for r in spark.read.parquet(str(tmp_path / "out")).select("offset").collect())
    assert offsets == [r.offset for r in oracle.committed]
