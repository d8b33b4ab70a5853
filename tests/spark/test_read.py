"""read_tiered / export against an independent decoder (kafka-python) of the original segments."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlm.jobs import export, plan_read, read_tiered
from rlm.jobs.reading.decode import KAFKA_SCHEMA_DDL
from rlm.logdir.discovery import discover_partitions
from tests.spark.conftest import Env, arrow_records, kafka_python_records

pytestmark = pytest.mark.spark


def _expected(env: Env, topics: set[str] | None = None) -> dict[tuple[str, int], list[Any]]:
    out = {}
    for part in discover_partitions(env.log_dirs):
        if topics is None or part.topic in topics:
            recs = kafka_python_records(part.path)
            if recs:
                out[(part.topic, part.partition)] = recs
    return out


def test_schema_is_sparks_kafka_source_schema(spark: Any, gen_env: Env) -> None:
    from pyspark.sql.types import _parse_datatype_string

    df = read_tiered(spark, gen_env.settings, ["other"], start=0, end=1)
    assert df.schema == _parse_datatype_string(KAFKA_SCHEMA_DDL)
    assert [f.name for f in df.schema] == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]


def test_fixtures_both_tiers_equal_kafka_python(spark: Any, fixture_env: Env) -> None:
    # every topic, __consumer_offsets too: the internal logs are read when the setting allows
    # them (docs/visibility.md, "Internal topics"; refused otherwise: tests/http/test_internal_topics.py)
    settings = dataclasses.replace(
        fixture_env.settings,
        server=dataclasses.replace(fixture_env.settings.server, serve_internal_topics=True),
    )
    plan = plan_read(settings, None)
    assert "remote" in {t.source for t in plan.tasks}
    got = arrow_records(read_tiered(spark, settings, None).toArrow())
    expected = _expected(fixture_env)
    assert any(topic == "__consumer_offsets" for topic, _ in expected)
    assert set(got) == set(expected)
    for tp, recs in expected.items():
        assert got[tp] == recs, tp
    assert sum(len(v) for v in got.values()) > 25_000  # the KRaft metadata log (no HW) excluded


def test_generated_every_codec_split_tasks_no_duplicates(spark: Any, gen_env: Env) -> None:
    # Small tasks: several per remote segment and per local segment.
    plan = plan_read(gen_env.settings, ["gen"], target_bytes=16 * 1024)
    sources = {t.source for t in plan.tasks}
    assert sources == {"remote", "local"}
    for p in plan.partitions:
        assert p.highest_tiered_offset > 0
        assert len([t for t in p.tasks if t.source == "remote"]) > len(p.manifests)
    df = read_tiered(spark, gen_env.settings, ["gen"], target_bytes=16 * 1024)
    table = df.toArrow()
    got = arrow_records(table)
    expected = _expected(gen_env, {"gen"})
    assert set(got) == set(expected) == {("gen", p) for p in range(5)}
    for tp, recs in expected.items():
        assert got[tp] == recs, tp
    types = dict(
        zip(table.column("partition").to_pylist(), table.column("timestampType").to_pylist(), strict=True)
    )
    assert types[4] == 1 and types[0] == 0  # LogAppendTime / CreateTime


def test_partition_filter_and_time_range_export(spark: Any, gen_env: Env, tmp_path: Path) -> None:
    expected = _expected(gen_env, {"gen"})
    stamps = sorted(r[1] for r in expected[("gen", 1)])
    start, end = stamps[len(stamps) // 3], stamps[2 * len(stamps) // 3]
    plan = plan_read(gen_env.settings, ["gen"], [1, 3], start=start, end=end, target_bytes=16 * 1024)
    assert sum(p.pruned_segments + p.pruned_entries for p in plan.partitions) > 0
    out = tmp_path / "out"
    result = export(
        spark,
        gen_env.settings,
        ["gen"],
        str(out),
        partitions=[1, 3],
        start=start,
        end=end,
        target_bytes=16 * 1024,
    )
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["topic=gen"]
    assert sorted(p.name for p in (out / "topic=gen").iterdir()) == ["partition=1", "partition=3"]
    got: dict[tuple[str, int], list[Any]] = {}
    for p in (1, 3):
        table = pq.read_table(out / "topic=gen" / f"partition={p}")
        n = table.num_rows
        table = table.append_column("topic", pa.array(["gen"] * n)).append_column(
            "partition", pa.array([p] * n, pa.int32())
        )
        got.update(arrow_records(table))
    want = {tp: [r for r in expected[tp] if start <= r[1] < end] for tp in [("gen", 1), ("gen", 3)]}
    assert got == want
    assert all(want.values()) and result.records == sum(len(v) for v in want.values())
    recs = expected[("gen", 1)]
    assert any(a[1] > b[1] for a, b in itertools.pairwise(recs))  # timestamps really go backwards


def test_empty_selection(spark: Any, gen_env: Env) -> None:
    assert read_tiered(spark, gen_env.settings, ["gen"], start=10**15).count() == 0
