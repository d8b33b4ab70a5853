"""The table ``rlm export --format iceberg`` writes, read and maintained by Spark's own Iceberg
runtime (docs/iceberg.md): Spark 4.1 with ``iceberg-spark-runtime-4.1_2.13`` and a JDBC catalog on
the embedded ``catalog.db`` (rlm/testing/iceberg_spark.py; ``make iceberg-spark``) agrees with
pyiceberg on every row and column, and with kafka-python's decoding of the segments; after Spark
compacts the table and expires rlm's snapshots, both still agree, and rlm's next incremental
export appends exactly the new offsets."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlm.config import load_settings
from rlm.errors import InvalidArgumentError
from rlm.jobs.reading.decode import arrow_schema
from rlm.jobs.tables.iceberg import (
    ATTEMPT_PROPERTY,
    OFFSET_PROPERTY,
    IcebergTarget,
    export_iceberg,
    load_table,
    local_engine,
)
from rlm.jobs.tables.iceberg_files import FILE_PREFIX, read_data_files
from rlm.jobs.tables.iceberg_read import SPARK_EXTENSIONS, spark_catalog_conf
from rlm.testing.configs import write_config
from rlm.testing.iceberg_spark import IcebergSpark, iceberg_spark_problem
from tests.needs import unavailable
from tests.spark.conftest import arrow_records, tier
from tests.spark.test_iceberg import TOPIC, _expected, multi_day_env, raise_high_watermarks

pytestmark = pytest.mark.spark

NAMES = [f.name for f in arrow_schema()]
TS, HEADERS = NAMES.index("timestamp"), NAMES.index("headers")


@pytest.fixture(scope="module")
def iceberg_spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IcebergSpark]:
    """One Spark driver with the Iceberg runtime for the module (its own JVM: a session's jars are
    fixed at start, and the runtime does not load in the pyspark the ``spark`` fixture runs)."""
    problem = iceberg_spark_problem()
    if problem is not None:
        unavailable(f"Spark with the Iceberg runtime: {problem}")
    home = tmp_path_factory.mktemp("iceberg-spark")
    with IcebergSpark(home, {"spark.sql.extensions": SPARK_EXTENSIONS}) as spark:
        yield spark


def rows(table: pa.Table) -> list[tuple[Any, ...]]:
    """Every column of every row, in (topic, partition, offset) order; timestamps as µs, headers
    as tuples (None: a record without headers, as rlm writes it)."""
    table = table.select(NAMES)
    stamps = table.column("timestamp").cast(pa.timestamp("us", "UTC")).cast(pa.int64()).to_pylist()
    cols = [table.column(n).to_pylist() for n in NAMES]
    out = []
    for i in range(table.num_rows):
        row = [c[i] for c in cols]
        row[TS] = stamps[i]
        row[HEADERS] = None if row[HEADERS] is None else tuple((h["key"], h["value"]) for h in row[HEADERS])
        out.append(tuple(row))
    return sorted(
        out, key=lambda r: (r[NAMES.index("topic")], r[NAMES.index("partition")], r[NAMES.index("offset")])
    )


def pyiceberg_rows(table: Any) -> list[tuple[Any, ...]]:
    """:func:`rows` of pyiceberg's reading of the table's current snapshot. pyiceberg (0.12) reads
    a null ``list<struct>`` as an empty list (apache/iceberg-python#3833, open): records without
    headers, null in the data files, come back as ``[]``; mapped back to None here, which loses
    nothing because the data files never hold an empty list (:func:`spark_rows` checks)."""
    return [
        (*r[:HEADERS], None if r[HEADERS] == () else r[HEADERS], *r[HEADERS + 1 :])
        for r in rows(table.scan().to_arrow())
    ]


def spark_rows(spark: IcebergSpark, target: IcebergTarget, out: Path) -> list[tuple[Any, ...]]:
    """:func:`rows` of Spark's Iceberg reader (``SELECT *`` through the JDBC catalog)."""
    n = spark.to_parquet(f"SELECT * FROM {target.catalog_name}.{target.identifier}", out)
    got = rows(pq.read_table(out))
    assert len(got) == n and pq.read_table(out).column_names == NAMES
    assert all(r[HEADERS] != () for r in got) and any(r[HEADERS] is None for r in got)
    return got


def _compact_and_expire(spark: IcebergSpark, target: IcebergTarget) -> None:
    """Spark's ``rewrite_data_files`` over every partition, then ``expire_snapshots`` of all but
    the newest: rlm's own snapshot is gone afterwards."""
    (rewrite,) = spark.sql(
        f"CALL {target.catalog_name}.system.rewrite_data_files(table => '{target.identifier}', "
        "options => map('min-input-files', '2'))"
    )
    assert 0 < rewrite["added_data_files_count"] < rewrite["rewritten_data_files_count"]
    cutoff = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=1)).strftime(
        "%Y-%m-%d %H:%M:%S"
    )
    (expired,) = spark.sql(
        f"CALL {target.catalog_name}.system.expire_snapshots(table => '{target.identifier}', "
        f"older_than => TIMESTAMP '{cutoff}', retain_last => 1)"
    )
    assert expired["deleted_data_files_count"] > 0


def test_spark_reads_compacts_and_expires_and_rlm_appends_on_top(
    iceberg_spark: IcebergSpark, tmp_path: Path
) -> None:
    env, ends = multi_day_env(tmp_path)
    target = IcebergTarget.from_settings(env.settings, tmp_path / "ice")
    first = export_iceberg(env.settings, [TOPIC], target, local_engine(2), target_bytes=4096)
    name = f"{target.catalog_name}.{target.identifier}"
    iceberg_spark.new_session(spark_catalog_conf(target))

    # Both readers, every column of every row, and what the segments hold (the visible half).
    table = load_table(target)
    ours = pyiceberg_rows(table)
    assert spark_rows(iceberg_spark, target, tmp_path / "read1") == ours
    expected = _expected(env, TOPIC)
    assert arrow_records(pq.read_table(tmp_path / "read1")) == expected
    assert len(ours) == first.records == sum(len(v) for v in expected.values())
    # rlm's commit set its offsets as table properties too (what outlives its snapshots, below).
    assert table.properties[f"{OFFSET_PROPERTY}{TOPIC}-1"] == str(ends[1] // 2)
    # Spark sees rlm's snapshot, its offsets and the table's partitioning.
    (snap,) = iceberg_spark.sql(f"SELECT snapshot_id, operation, summary FROM {name}.snapshots")
    assert snap["snapshot_id"] == first.snapshot_id and snap["operation"] == "append"
    assert snap["summary"][f"{OFFSET_PROPERTY}{TOPIC}-0"] == str(ends[0] // 2)
    parts = iceberg_spark.sql(f"SELECT partition, file_count FROM {name}.partitions")
    assert len(parts) >= 3 and {p["partition"]["topic"] for p in parts} == {TOPIC}
    assert sum(p["file_count"] for p in parts) == first.files

    # Maintenance as users run it: compact every partition's files, expire rlm's snapshot.
    _compact_and_expire(iceberg_spark, target)
    table = load_table(target)
    (only,) = table.snapshots()  # rlm's snapshot is gone: the current one is Spark's compaction
    assert (
        only.summary.operation.value == "replace"
        and ATTEMPT_PROPERTY not in only.summary.additional_properties
    )
    assert all(not Path(t.file.file_path).name.startswith(FILE_PREFIX) for t in table.scan().plan_files())
    assert pyiceberg_rows(table) == ours
    assert spark_rows(iceberg_spark, target, tmp_path / "read2") == ours
    # rlm's own reader (what spark_read_table's executors run) reads Spark's files too.
    files = [t.file.file_path for t in table.scan().plan_files()]
    assert arrow_records(pa.Table.from_batches(read_data_files(dict(table.io.properties), files))) == expected

    # More records arrive and tier; rlm's next run appends exactly them on top of Spark's snapshot.
    raise_high_watermarks(env, ends)
    tier(env.settings)
    again = export_iceberg(
        env.settings, [TOPIC], target, local_engine(1), target_bytes=4096, incremental=True
    )
    assert again.offsets == {(TOPIC, p): end for p, end in ends.items()}
    expected = _expected(env, TOPIC)
    assert again.records == sum(len(v) for v in expected.values()) - first.records
    table = load_table(target)
    assert table.current_snapshot().parent_snapshot_id == only.snapshot_id
    both = pyiceberg_rows(table)
    assert arrow_records(table.scan().to_arrow()) == expected  # every offset once: no gap, no duplicate
    assert spark_rows(iceberg_spark, target, tmp_path / "read3") == both
    # A repeat appends nothing.
    assert export_iceberg(env.settings, [TOPIC], target, local_engine(1), incremental=True).records == 0


def test_spark_catalog_conf_is_the_embedded_catalogs_jdbc_twin_and_refuses_other_catalogs(
    tmp_path: Path,
) -> None:
    cfg = write_config(tmp_path / "rlm.toml", [tmp_path / "logs"], root=tmp_path / "store")
    target = IcebergTarget.from_settings(load_settings(cfg), tmp_path / "out")
    assert spark_catalog_conf(target) == {
        "spark.sql.extensions": SPARK_EXTENSIONS,
        "spark.sql.catalog.rlm": "org.apache.iceberg.spark.SparkCatalog",
        "spark.sql.catalog.rlm.type": "jdbc",
        "spark.sql.catalog.rlm.uri": f"jdbc:sqlite:{tmp_path / 'out' / 'catalog.db'}",
        "spark.sql.catalog.rlm.warehouse": (tmp_path / "out" / "warehouse").as_uri(),
        "spark.sql.catalog.rlm.cache-enabled": "false",
    }
    for props in (
        {"type": "rest", "uri": "http://catalog:8181"},
        {"type": "sql", "uri": "postgresql://db/x"},
    ):
        with pytest.raises(InvalidArgumentError, match="SQLite catalog only"):
            spark_catalog_conf(IcebergTarget("rlm", props, "kafka", "records"))
