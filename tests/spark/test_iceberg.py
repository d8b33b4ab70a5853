"""``rlm export --format iceberg`` (docs/iceberg.md): one snapshot per run, partitioned by topic and
day, incremental by the offsets the snapshots record, crash-safe between write and commit; read
back with pyiceberg and with Spark (no Iceberg runtime jar; with it: test_iceberg_spark_runtime.py),
against kafka-python's decoding of the original segments and against the Parquet export."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlm.errors import TableError
from rlm.formats.checkpoint import format_offset_checkpoint, parse_offset_checkpoint
from rlm.formats.compression import Compression
from rlm.formats.records import Header, Record, RecordSpec, encode_control_key, encode_end_txn_marker
from rlm.jobs import export
from rlm.jobs.tables.iceberg import (
    ATTEMPT_PROPERTY,
    OFFSET_PROPERTY,
    IcebergTarget,
    export_iceberg,
    load_table,
    local_engine,
    open_table,
    spark_engine,
)
from rlm.jobs.tables.iceberg_files import FILE_PREFIX
from rlm.jobs.tables.iceberg_read import spark_read_table
from rlm.logdir.discovery import discover_partitions, partition_state, read_checkpoints
from rlm.logdir.writer import LogWriter
from rlm.testing.configs import write_config
from rlm.testing.daemon import rlm_cli
from tests.spark.conftest import Env, arrow_records, kafka_python_records, make_settings, tier

pytestmark = pytest.mark.spark
pytest.importorskip("pyiceberg")

DAY_MS = 86_400_000
DAY0 = 1_767_225_600_000 - 3 * 3_600_000  # 2025-12-31T21:00Z: the first records are on the 31st
TOPIC = "clicks"


def _expected(env: Env, topic: str | None = None) -> dict[tuple[str, int], list[Any]]:
    out = {}
    for d in env.log_dirs:
        for part in sorted(
            p for p in d.iterdir() if p.is_dir() and (topic is None or p.name.rsplit("-", 1)[0] == topic)
        ):
            recs = kafka_python_records(part)
            if recs:
                out[(part.name.rsplit("-", 1)[0], int(part.name.rsplit("-", 1)[1]))] = recs
    return out


def _table_records(table: Any) -> dict[tuple[str, int], list[Any]]:
    return arrow_records(table.scan().to_arrow())


def multi_day_env(root: Path) -> tuple[Env, dict[int, int]]:
    """Topic ``clicks``, 2 partitions, batches 2 h apart over ~5 days (snappy/zstd, headers, null
    keys, a transaction marker), many small segments; the high watermark at about half the log,
    so only the first half is visible and tiered. Returns the env and each partition's log end."""
    log_dir = root / "logs"
    log_dir.mkdir(parents=True)
    ends = {}
    for p, codec in enumerate([Compression.SNAPPY, Compression.ZSTD]):
        rng = random.Random(p)
        with LogWriter(
            log_dir, TOPIC, p, segment_bytes=6 * 1024, index_interval_bytes=512, clock=lambda: DAY0
        ) as w:
            for i in range(60):
                ts = DAY0 + i * 2 * 3_600_000
                specs = [
                    RecordSpec(
                        ts + j,
                        None if j == 0 else f"k{j}".encode(),
                        rng.randbytes(rng.randint(0, 300)),
                        (Header("h", b"v"),) if j % 2 else (),
                    )
                    for j in range(rng.randint(1, 6))
                ]
                w.append(specs, compression=codec)
                if i == 20:
                    w.append(
                        [Record(w.log_end_offset, ts, encode_control_key(1), encode_end_txn_marker(0))],
                        is_control=True,
                        is_transactional=True,
                        producer_id=3,
                        producer_epoch=0,
                    )
            w.roll()
            ends[p] = w.log_end_offset
            w.high_watermark = ends[p] // 2
    settings = make_settings([log_dir], options={"root": str(root / "store")}, index_entry_bytes=1024)
    tier(settings)
    return Env([log_dir], settings, root), ends


def raise_high_watermarks(env: Env, ends: dict[int, int]) -> None:
    """The broker committed everything: the high watermark moves to the log end."""
    path = env.log_dirs[0] / "replication-offset-checkpoint"
    entries = dict(parse_offset_checkpoint(path.read_text()).entries)
    entries.update({(TOPIC, p): end for p, end in ends.items()})
    path.write_text(format_offset_checkpoint(entries))


def _target(env: Env, out: Path) -> IcebergTarget:
    return IcebergTarget.from_settings(env.settings, out)


def test_append_is_one_snapshot_equal_to_the_parquet_export(spark: Any, gen_env: Env, tmp_path: Path) -> None:
    target = _target(gen_env, tmp_path / "ice")
    result = export_iceberg(
        gen_env.settings, ["gen", "other"], target, spark_engine(spark), target_bytes=16 * 1024
    )
    table = load_table(target)
    assert len(table.snapshots()) == 1 and result.snapshot_id == table.current_snapshot().snapshot_id
    summary = table.current_snapshot().summary
    assert summary.operation.value == "append"
    assert int(summary["added-data-files"]) == result.files > result.tasks // 2
    got = _table_records(table)
    expected = _expected(gen_env)
    assert got == expected
    assert result.records == sum(len(v) for v in expected.values())
    # The snapshot records one past the last visible offset of every partition: its high watermark
    # (past trailing control batches too).
    offsets = {
        k[len(OFFSET_PROPERTY) :]: int(v)
        for k, v in summary.additional_properties.items()
        if k.startswith(OFFSET_PROPERTY)
    }
    hws = {
        f"{p.topic}-{p.partition}": partition_state(p, read_checkpoints(p.path.parent)).high_watermark
        for p in discover_partitions(gen_env.log_dirs)
    }
    assert offsets == hws
    assert all(offsets[f"{t}-{p}"] > recs[-1][0] for (t, p), recs in expected.items())
    assert summary[ATTEMPT_PROPERTY]

    parquet = tmp_path / "parquet"
    export(spark, gen_env.settings, ["gen", "other"], str(parquet))
    from_parquet: dict[tuple[str, int], list[Any]] = {}
    for part_dir in sorted(parquet.glob("topic=*/partition=*")):
        t, p = part_dir.parent.name.split("=", 1)[1], int(part_dir.name.split("=", 1)[1])
        rows = pq.read_table(part_dir)
        rows = rows.append_column("topic", pa.array([t] * rows.num_rows)).append_column(
            "partition", pa.array([p] * rows.num_rows, pa.int32())
        )
        from_parquet.update(arrow_records(rows))
    assert got == from_parquet

    # Spark reads the same snapshot back without the Iceberg runtime.
    assert arrow_records(spark_read_table(spark, table).toArrow()) == got


def test_partitioned_by_topic_and_day(tmp_path: Path) -> None:
    env, _ = multi_day_env(tmp_path)
    target = _target(env, tmp_path / "ice")
    export_iceberg(env.settings, [TOPIC], target, local_engine(), target_bytes=4096)
    table = load_table(target)
    spec = [
        (table.schema().find_field(f.source_id).name, str(f.transform), f.name) for f in table.spec().fields
    ]
    assert spec == [("topic", "identity", "topic"), ("timestamp", "day", "timestamp_day")]
    days = set()
    for task in table.scan().plan_files():
        topic, day = task.file.partition[0], task.file.partition[1]
        rows = pq.read_table(task.file.file_path.removeprefix("file://"))
        stamps = rows.column("timestamp").cast(pa.int64()).to_pylist()
        assert set(rows.column("topic").to_pylist()) == {topic}
        assert {s // (DAY_MS * 1000) for s in stamps} == {day}
        assert f"/topic={topic}/timestamp_day=" in task.file.file_path
        days.add(day)
    assert len(days) >= 3  # the visible half spans several UTC days
    # Partition pruning works on the day: one day's scan holds only that day's records.
    day_rows = table.scan(
        row_filter="timestamp >= '2026-01-01T00:00:00+00:00' and timestamp < '2026-01-02T00:00:00+00:00'"
    ).to_arrow()
    assert day_rows.num_rows > 0
    assert {s // (DAY_MS * 1000) for s in day_rows.column("timestamp").cast(pa.int64()).to_pylist()} == {
        (DAY0 + 3 * 3_600_000) // DAY_MS
    }


def test_incremental_appends_only_new_offsets_and_a_repeat_appends_nothing(
    spark: Any, tmp_path: Path
) -> None:
    env, ends = multi_day_env(tmp_path)
    target = _target(env, tmp_path / "ice")
    first = export_iceberg(env.settings, [TOPIC], target, spark_engine(spark))
    assert first.offsets == {(TOPIC, p): end // 2 for p, end in ends.items()}
    again = export_iceberg(env.settings, [TOPIC], target, spark_engine(spark), incremental=True)
    table = load_table(target)
    assert again.snapshot_id is None and again.records == 0 and again.tasks == 0
    assert len(table.snapshots()) == 1  # no empty snapshot
    with pytest.raises(TableError, match="--incremental"):
        export_iceberg(env.settings, [TOPIC], target, spark_engine(spark))

    raise_high_watermarks(env, ends)
    tier(env.settings)  # the second half's segments tier now
    second = export_iceberg(env.settings, [TOPIC], target, spark_engine(spark), incremental=True)
    table = load_table(target)
    assert len(table.snapshots()) == 2 and second.snapshot_id == table.current_snapshot().snapshot_id
    assert second.offsets == {(TOPIC, p): end for p, end in ends.items()}
    added = arrow_records(table.scan(snapshot_id=second.snapshot_id).to_arrow())
    before = arrow_records(table.scan(snapshot_id=first.snapshot_id).to_arrow())
    expected = _expected(env, TOPIC)
    for tp, recs in expected.items():
        half = ends[tp[1]] // 2
        assert before[tp] == [r for r in recs if r[0] < half]
        assert added[tp] == recs  # the new snapshot is the whole table: old files + new ones
    assert second.records == sum(len(v) for v in expected.values()) - first.records
    assert _table_records(table) == expected
    assert arrow_records(spark_read_table(spark, table).toArrow()) == expected


def test_a_rollback_rewinds_the_offsets_with_the_data(tmp_path: Path) -> None:
    """The table properties carry the last rlm commit's offsets (for when its snapshots are
    expired), but the newest rlm snapshot of the current ancestry wins: rolled back to the first
    export, the table lacks the second one's records, and the next run exports them again."""
    env, ends = multi_day_env(tmp_path)
    target = _target(env, tmp_path / "ice")
    first = export_iceberg(env.settings, [TOPIC], target, local_engine(1))
    raise_high_watermarks(env, ends)
    tier(env.settings)
    export_iceberg(env.settings, [TOPIC], target, local_engine(1), incremental=True)
    table = load_table(target)
    assert table.properties[f"{OFFSET_PROPERTY}{TOPIC}-0"] == str(ends[0])
    table.manage_snapshots().rollback_to_snapshot(first.snapshot_id).commit()
    again = export_iceberg(env.settings, [TOPIC], target, local_engine(1), incremental=True)
    assert again.records > 0 and again.offsets == {(TOPIC, p): end for p, end in ends.items()}
    assert _table_records(load_table(target)) == _expected(env, TOPIC)


def _orphans(out: Path) -> list[Path]:
    return sorted(out.rglob(f"{FILE_PREFIX}*.parquet"))


@pytest.mark.parametrize(
    "engine", [["--engine", "local"], ["--spark-master", "local[1]"]], ids=["local", "spark"]
)
def test_crash_between_write_and_commit_then_rerun_completes(tmp_path: Path, engine: list[str]) -> None:
    env, ends = multi_day_env(tmp_path)
    out = tmp_path / "ice"
    target = _target(env, out)
    first = export_iceberg(env.settings, [TOPIC], target, local_engine(), target_bytes=4096)
    before_files = set(_orphans(out))
    raise_high_watermarks(env, ends)
    tier(env.settings)
    cfg = write_config(
        tmp_path / "rlm.toml",
        env.log_dirs,
        root=tmp_path / "store",
        index_entry_bytes=1024,
        topics={"follow_kafka_configs": False},
        cluster={"leadership": "always"},
    )
    args = [
        "export",
        "--config",
        cfg,
        "--topic",
        TOPIC,
        "--format",
        "iceberg",
        "--incremental",
        "--out",
        out,
        *engine,
        "--task-mib",
        "1",
    ]
    crashed = rlm_cli(*args, env={"RLM_CRASH_AT": "export_before_commit"}, timeout=300)
    assert crashed.returncode == -9, crashed.stderr
    table = load_table(target)
    assert table.current_snapshot().snapshot_id == first.snapshot_id  # nothing visible
    assert _table_records(table) == arrow_records(table.scan(snapshot_id=first.snapshot_id).to_arrow())
    orphans = set(_orphans(out)) - before_files
    assert orphans  # the crashed run wrote its files

    done = rlm_cli(*args, timeout=300)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["format"] == "iceberg" and doc["orphans_removed"] == len(orphans)
    assert not orphans & set(_orphans(out))  # removed
    table = load_table(target)
    assert len(table.snapshots()) == 2
    referenced = {
        Path(p.removeprefix("file://")) for p in table.inspect.all_files().column("file_path").to_pylist()
    }
    assert set(_orphans(out)) == referenced

    clean = _target(env, tmp_path / "clean")
    export_iceberg(env.settings, [TOPIC], clean, local_engine())
    assert _table_records(table) == _table_records(load_table(clean)) == _expected(env, TOPIC)


def test_existing_table_with_another_partitioning_is_refused(tmp_path: Path) -> None:
    from rlm.jobs.reading.decode import arrow_schema

    env = Env([tmp_path], make_settings([tmp_path]), tmp_path)
    target = _target(env, tmp_path / "ice")
    catalog = target.catalog()
    catalog.create_namespace(target.namespace)
    catalog.create_table(target.identifier, schema=arrow_schema())  # unpartitioned
    with pytest.raises(TableError, match="partitioned by"):
        open_table(target)


def test_configured_catalog_and_cli_usage_errors(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    cfg = write_config(tmp_path / "rlm.toml", [tmp_path / "logs"], root=tmp_path / "store")
    cfg.write_text(
        cfg.read_text()
        + "\n".join(
            [
                "[iceberg]",
                'namespace = "ops"',
                'table = "history"',
                "[iceberg.catalog]",
                'type = "sql"',
                f'uri = "sqlite:///{tmp_path / "cat.db"}"',
                f'warehouse = "{wh.as_uri()}"',
            ]
        )
        + "\n"
    )
    from rlm.config import load_settings

    settings = load_settings(cfg)
    target = IcebergTarget.from_settings(settings, None)
    assert target.identifier == "ops.history" and target.lock_dir is None
    table = open_table(target)
    assert table.location().startswith(wh.as_uri())

    (tmp_path / "logs").mkdir()
    bad = rlm_cli("export", "--config", cfg, "--topic", "t", "--format", "iceberg", "--from-timestamp", "1")
    assert bad.returncode == 2 and "by offset" in bad.stderr
    bad = rlm_cli("export", "--config", cfg, "--topic", "t", "--incremental", "--out", tmp_path / "x")
    assert bad.returncode == 2 and "--incremental" in bad.stderr


@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_plan_read_start_offsets_resume_each_partition(gen_env: Env, isolation: str) -> None:
    from rlm.jobs import plan_read
    from rlm.jobs.reading.decode import read_task_bytes, task_to_arrow
    from rlm.jobs.reading.plan import BackendSpec

    expected = _expected(gen_env, "gen")
    start = {("gen", 0): expected[("gen", 0)][40][0], ("gen", 1): 10**12}
    full = plan_read(gen_env.settings, ["gen"], target_bytes=16 * 1024, isolation=isolation)
    plan = plan_read(
        gen_env.settings, ["gen"], target_bytes=16 * 1024, isolation=isolation, start_offsets=start
    )
    spec = BackendSpec.from_settings(gen_env.settings)

    def rows(tasks: list[Any]) -> dict[tuple[str, int], list[Any]]:
        batches = [b for t in tasks for b in task_to_arrow(t, read_task_bytes(t, spec))]
        return arrow_records(pa.Table.from_batches(batches)) if batches else {}

    by_part = {(p.topic, p.partition): p for p in plan.partitions}
    assert by_part[("gen", 1)].tasks == []  # nothing at or beyond the recorded offset
    assert all(t.min_offset >= start[("gen", 0)] for t in by_part[("gen", 0)].tasks)
    got = rows(by_part[("gen", 0)].tasks)[("gen", 0)]
    want = rows([t for t in full.tasks if t.partition == 0])[("gen", 0)]
    assert got == [r for r in want if r[0] >= start[("gen", 0)]] and len(got) < len(want)
    # Partitions without a start offset are planned as before; visible ends are unchanged.
    assert [t for t in plan.tasks if t.partition >= 2] == [t for t in full.tasks if t.partition >= 2]
    assert [p.local_max_offset for p in plan.partitions] == [p.local_max_offset for p in full.partitions]


@pytest.mark.s3
def test_s3_warehouse_executors_write_and_read_through_the_catalogs_file_io(
    spark: Any, gen_env: Env, moto_endpoint: str, tmp_path: Path
) -> None:
    """A configured catalog with its warehouse on an S3 server: Spark executors write the data
    files and read them back with only the catalog's properties (no S3A jars, no driver env)."""
    import uuid

    import boto3

    from rlm.jobs.tables.iceberg import remove_orphans

    prefix = f"wh-{uuid.uuid4().hex[:8]}"
    props = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path / 'cat.db'}",
        "warehouse": f"s3://rlm-test/{prefix}",
        "s3.endpoint": moto_endpoint,
        "s3.region": "us-east-1",
        "s3.access-key-id": "testing",
        "s3.secret-access-key": "testing",
    }
    target = IcebergTarget("rlm", props, "kafka", "records", orphan_grace_ms=3_600_000)
    result = export_iceberg(gen_env.settings, ["gen"], target, spark_engine(spark), target_bytes=16 * 1024)
    table = load_table(target)
    assert table.location().startswith(f"s3://rlm-test/{prefix}/") and result.files > 1
    expected = _expected(gen_env, "gen")
    assert _table_records(table) == expected
    assert arrow_records(spark_read_table(spark, table).toArrow()) == expected

    # An unreferenced rlm file (a crashed run's) is removed only once older than the grace.
    s3 = boto3.client("s3", endpoint_url=moto_endpoint)
    orphan = (
        f"{prefix}/kafka/records/data/topic=gen/timestamp_day=2023-11-14/{FILE_PREFIX}dead-000000-000.parquet"
    )
    s3.put_object(Bucket="rlm-test", Key=orphan, Body=b"not even parquet")
    assert remove_orphans(table, 3_600_000) == 0
    assert remove_orphans(table, 0) == 1
    assert _table_records(table) == expected
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="rlm-test", Prefix=prefix)["Contents"]]
    assert orphan not in keys and sum(k.endswith(".parquet") for k in keys) == result.files


def test_commit_refuses_a_table_changed_since_the_plan_and_abort_removes_the_runs_files(
    gen_env: Env, tmp_path: Path
) -> None:
    from rlm.jobs import plan_read
    from rlm.jobs.reading.decode import read_task_bytes, task_to_arrow
    from rlm.jobs.reading.plan import BackendSpec
    from rlm.jobs.tables.iceberg import IcebergSink, next_offsets

    target = _target(gen_env, tmp_path / "ice")
    table = open_table(target)
    plan = plan_read(gen_env.settings, ["other"])
    sink = IcebergSink(
        target, dict(table.io.properties), f"{table.location()}/data", "slow1", next_offsets({}, plan), None
    )
    spec = BackendSpec.from_settings(gen_env.settings)
    files = [
        f
        for i, t in enumerate(plan.tasks)
        for f in sink.write_task(i, t, task_to_arrow(t, read_task_bytes(t, spec)))
    ]
    assert files and all(Path(f.path.removeprefix("file://")).stat().st_size == f.size for f in files)
    # Another export commits between this run's plan and its commit.
    export_iceberg(gen_env.settings, ["gen"], target, local_engine(parallelism=1), partitions=[0])
    with pytest.raises(TableError, match="changed while exporting"):
        sink.commit(files)
    sink.abort()
    assert not any(Path(f.path.removeprefix("file://")).exists() for f in files)
    assert set(_table_records(load_table(target))) == {("gen", 0)}


def _one_partition(log_dir: Path, topic_id: str, values: list[bytes]) -> None:
    with LogWriter(log_dir, "orders", 0, topic_id=topic_id, segment_bytes=1024) as w:
        for i, value in enumerate(values):
            w.append([RecordSpec(DAY0 + i, b"k", value)])
        w.roll()
        w.high_watermark = w.log_end_offset


def test_a_re_created_topic_is_refused_not_appended_by_offset(tmp_path: Path) -> None:
    """The table records each topic's id. A topic deleted and created again is a new log whose
    offsets start over: appending it "from the recorded offset" would skip its first records, so
    an incremental run refuses it with one line naming both ids (docs/iceberg.md)."""
    import shutil

    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    old, new = "h21Hd1FxRjC-20k1lF5oYA", "Zm9vYmFyYmF6cXV4cXV1eA"
    _one_partition(log_dir, old, [b"x" * 200] * 30)
    settings = make_settings([log_dir], options={"root": str(tmp_path / "store")})
    tier(settings)
    target = IcebergTarget.from_settings(settings, tmp_path / "ice")
    first = export_iceberg(settings, ["orders"], target, local_engine(1))
    assert first.records == 30
    assert load_table(target).current_snapshot().summary["rlm.topic-id.orders"] == old

    shutil.rmtree(log_dir / "orders-0")  # deleted, then created again with 10 records
    _one_partition(log_dir, new, [b"y" * 200] * 10)
    tier(settings)
    with pytest.raises(TableError, match=f"re-created \\(topic id {old} in the table, {new} in the log dir"):
        export_iceberg(settings, ["orders"], target, local_engine(1), incremental=True)
    assert len(load_table(target).snapshots()) == 1  # nothing appended
