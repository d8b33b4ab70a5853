"""``rlm export --engine local`` equals ``--engine spark``: same rows (all eight columns), same
directory layout and file names; both leave nothing at ``out`` when the job fails (docs/export.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlm.jobs import export, export_local, plan_read
from rlm.jobs.reading.plan import BackendSpec
from rlm.jobs.tables.sink import ParquetSink
from rlm.jobs.tables.spark_sink import run_sink_spark
from tests.jobs.helpers import corrupt_one_object, layout, sorted_rows
from tests.spark.conftest import Env, generated_env, txn_env


def _both(
    spark: Any, settings: Any, topics: list[str] | None, tmp_path: Path, **kw: Any
) -> tuple[Path, Path]:
    spark_out, local_out = tmp_path / "spark", tmp_path / "local"
    s = export(spark, settings, topics, str(spark_out), **kw)
    loc = export_local(settings, topics, local_out, parallelism=2, **kw)
    assert (s.records, s.tasks, s.bytes_planned) == (loc.records, loc.tasks, loc.bytes_planned)
    assert (s.engine, loc.engine) == ("spark", "local")
    return spark_out, local_out


@pytest.mark.parametrize("env_name", ["gen_env", "fixture_env"])
def test_engines_same_rows_and_layout(
    spark: Any, env_name: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    env: Env = request.getfixturevalue(env_name)
    spark_out, local_out = _both(spark, env.settings, None, tmp_path, target_bytes=16 * 1024)
    rows = sorted_rows(local_out)
    assert len(rows) > 100 and rows == sorted_rows(spark_out)
    files = layout(local_out)
    assert files == layout(spark_out) and files["_SUCCESS"] == 0 and len(files) > 3


def test_engines_equal_read_committed_time_range_partitions(spark: Any, tmp_path: Path) -> None:
    settings, oracle = txn_env(tmp_path)  # remote and local tasks both
    spark_out, local_out = _both(
        spark,
        settings,
        ["txn"],
        tmp_path / "rc",
        target_bytes=3_000,
        isolation="read_committed",
        partitions=[0],
    )
    rows = sorted_rows(local_out)
    assert [r[2] for r in rows] == [r.offset for r in oracle.committed]
    assert rows == sorted_rows(spark_out) and layout(local_out) == layout(spark_out)
    stamps = sorted(r[3] for r in rows)
    start = int(stamps[len(stamps) // 2].timestamp() * 1000)
    spark_out, local_out = _both(
        spark, settings, ["txn"], tmp_path / "range", target_bytes=3_000, start=start
    )
    assert 0 < len(sorted_rows(local_out)) < len(oracle.uncommitted)
    assert sorted_rows(local_out) == sorted_rows(spark_out)
    spark_out, local_out = _both(spark, settings, ["txn"], tmp_path / "empty", start=10**15)
    assert layout(spark_out) == layout(local_out) == {"_SUCCESS": 0}


def test_failed_spark_export_leaves_nothing_at_out(spark: Any, tmp_path: Path) -> None:
    env = generated_env(tmp_path / "env")
    corrupt_one_object(env.root / "store")
    out = tmp_path / "out"
    with pytest.raises(Exception, match="CRC"):
        export(spark, env.settings, ["gen"], str(out), target_bytes=16 * 1024)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env"]  # no out, no staging dir
    out.mkdir()
    (out / "old").write_text("previous export")
    with pytest.raises(Exception, match="CRC"):
        export(spark, env.settings, ["gen"], str(out), target_bytes=16 * 1024, mode="overwrite")
    assert [p.name for p in out.iterdir()] == ["old"]  # Spark's own overwrite would have deleted it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env", "out"]
    with pytest.raises(Exception, match="already exists"):
        export(spark, env.settings, ["other"], str(out))
    result = export(spark, env.settings, ["other"], str(out), mode="overwrite")
    assert result.records == len(sorted_rows(out)) > 0 and not (out / "old").exists()


def test_a_sink_on_spark_executors_writes_what_local_workers_write(
    spark: Any, gen_env: Env, tmp_path: Path
) -> None:
    """The sink seam on both engines: run_sink_spark (executors write, the driver commits) and the
    local engine give the same files, and each DataFile describes its file."""
    import pyarrow.parquet as pq

    plan = plan_read(gen_env.settings, ["gen"], target_bytes=16 * 1024)
    sink = ParquetSink.begin(tmp_path / "via-spark")
    files = run_sink_spark(spark, plan, BackendSpec.from_settings(gen_env.settings), sink)
    local = export_local(gen_env.settings, ["gen"], tmp_path / "local", target_bytes=16 * 1024)
    assert sorted_rows(tmp_path / "via-spark") == sorted_rows(tmp_path / "local")
    assert layout(tmp_path / "via-spark") == layout(tmp_path / "local")
    assert (
        len(files) == sum(n for n in layout(tmp_path / "local").values())
        and sum(f.records for f in files) == local.records
    )
    for f in files:  # committed: the staging dir became the output dir
        table = pq.read_table(Path(f.path.replace(str(sink.staged.staging), str(tmp_path / "via-spark"))))
        offsets = table.column("offset").to_pylist()
        assert (f.records, f.min_offset, f.max_offset) == (len(offsets), offsets[0], offsets[-1])
        assert f"topic={f.topic}/partition={f.partition}/" in f.path
