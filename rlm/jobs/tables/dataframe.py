"""``read_tiered`` (tiered history as a DataFrame with Spark's Kafka schema) and ``export``."""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Sequence
from typing import Any

from rlm.config import Settings
from rlm.jobs.hadoop_staging import HadoopStagedDir
from rlm.jobs.reading import (
    DEFAULT_TARGET_BYTES,
    KAFKA_SCHEMA_DDL,
    BackendSpec,
    ReadPlan,
    ReadTask,
    plan_read,
    read_task_bytes,
    task_to_arrow,
)
from rlm.jobs.staging import local_path
from rlm.jobs.tables.sink import ExportResult, ParquetSink
from rlm.jobs.tables.spark_sink import run_sink_spark
from rlm.tiering.read import check_isolation

__all__ = ["ExportResult", "export", "read_tiered", "tasks_dataframe", "tiered_dataframe"]


def tasks_dataframe(spark: Any, tasks: Sequence[Any]) -> Any:
    """A one-column (``task binary``) DataFrame with exactly one pickled task per Spark partition."""
    rdd = spark.sparkContext.parallelize([(pickle.dumps(t),) for t in tasks], max(1, len(tasks)))
    return spark.createDataFrame(rdd, "task binary")


def _read_partition(spec: BackendSpec) -> Any:
    def run(batches: Iterator[Any]) -> Iterator[Any]:
        for arrow_batch in batches:
            for blob in arrow_batch.column(0).to_pylist():
                task: ReadTask = pickle.loads(blob)
                yield from task_to_arrow(task, read_task_bytes(task, spec))

    return run


def tiered_dataframe(spark: Any, settings: Settings, plan: ReadPlan) -> Any:
    """The DataFrame reading ``plan`` (see :func:`read_tiered`)."""
    tasks = plan.tasks
    if not tasks:
        return spark.createDataFrame([], KAFKA_SCHEMA_DDL)
    spec = BackendSpec.from_settings(settings)
    return tasks_dataframe(spark, tasks).mapInArrow(_read_partition(spec), KAFKA_SCHEMA_DDL)


def read_tiered(
    spark: Any,
    settings: Settings,
    topics: Sequence[str] | None,
    partitions: Sequence[int] | None = None,
    start: int | None = None,
    end: int | None = None,
    *,
    target_bytes: int = DEFAULT_TARGET_BYTES,
    include_local: bool = True,
    ordered_timestamps: bool = False,
    isolation: str = "read_uncommitted",
) -> Any:
    """Every record of ``topics`` (all discovered topics when None; only ``partitions`` when
    given) from both tiers, as a DataFrame with Spark's Kafka source schema
    (``key, value, topic, partition, offset, timestamp, timestampType, headers``).

    ``start``/``end``: ms timestamps, half-open ``[start, end)`` on record timestamps (None =
    unbounded). Remote offsets ≤ the last manifest's last offset are read from the store, higher
    ones from local segments (up to the high watermark): no record twice. Control batches are
    skipped; ``isolation`` is Kafka's: ``read_uncommitted`` (default) includes aborted
    transactional records, ``read_committed`` reads below the last stable offset and leaves them
    out (docs/transactions.md).

    The plan (manifests, entries, byte ranges) is made now, on the driver; the returned
    DataFrame reads lazily, one ranged read per task, with backends rebuilt on the executors
    from ``settings.remote``. Local tasks read files of ``settings.log.dirs``: executors must run
    on the sidecar host (``local[*]``) unless ``include_local=False``. See
    :mod:`rlm.jobs.reading.plan` for ``target_bytes`` and ``ordered_timestamps``.
    """
    plan = plan_read(
        settings,
        topics,
        partitions,
        start=start,
        end=end,
        target_bytes=target_bytes,
        include_local=include_local,
        ordered_timestamps=ordered_timestamps,
        isolation=check_isolation(isolation),
    )
    return tiered_dataframe(spark, settings, plan)


#: Save modes written through the staged ParquetSink for a local ``out`` (docs/export.md), and
#: whether they replace an existing ``out``.
_STAGED_MODES = {"error": False, "errorifexists": False, "overwrite": True}


def export(
    spark: Any,
    settings: Settings,
    topics: Sequence[str] | None,
    out: str,
    *,
    partitions: Sequence[int] | None = None,
    start: int | None = None,
    end: int | None = None,
    target_bytes: int = DEFAULT_TARGET_BYTES,
    mode: str = "errorifexists",
    compression: str = "snappy",
    isolation: str = "read_uncommitted",
) -> ExportResult:
    """Write :func:`read_tiered` as Parquet under ``out``, partitioned by ``topic``/``partition``
    (Spark's ``partitionBy`` layout: ``out/topic=T/partition=P/part-*.parquet``; read it back
    with ``spark.sql.sources.partitionColumnTypeInference.enabled=false`` if topic names look
    numeric). ``mode`` is Spark's save mode. Returns what was planned and the records written
    (as the writers counted them; Spark's own writer: from the Parquet footers). ``isolation``
    as in :func:`read_tiered`.

    A local ``out`` (a path or ``file:`` URI) with mode ``errorifexists`` or ``overwrite`` is
    written by the executors through :class:`~rlm.jobs.tables.sink.ParquetSink` (pyarrow, the local
    engine's writer and layout; ``compression`` one of its codecs) into a staging dir next to
    ``out``, renamed into place once every task succeeded: a failed job leaves ``out`` as it was
    (docs/export.md). Another filesystem's ``out`` (``hdfs://``, ``s3a://``…) is written by Spark's
    own writer into a hidden sibling renamed into place the same way
    (:class:`~rlm.jobs.hadoop_staging.HadoopStagedDir`; docs/export.md, "HDFS and S3 outputs").
    Other modes (``append``, ``ignore``) write ``out`` itself with Spark's writer and commit."""
    plan = plan_read(
        settings,
        topics,
        partitions,
        start=start,
        end=end,
        target_bytes=target_bytes,
        isolation=check_isolation(isolation),
    )
    path = local_path(out)
    if path is not None and mode.lower() in _STAGED_MODES:
        # Executors write each task's Arrow batches with pyarrow (the sink seam): no Arrow → JVM
        # row conversion, no sort by the partition columns, no JVM Parquet encoding — that was
        # most of a Spark export's time (BENCHMARKS.md, export).
        sink = ParquetSink.begin(path, overwrite=_STAGED_MODES[mode.lower()], compression=compression)
        spec = BackendSpec.from_settings(settings)
        records = sum(f.records for f in run_sink_spark(spark, plan, spec, sink))
    elif path is None and mode.lower() in _STAGED_MODES:
        staged = HadoopStagedDir.begin(spark, out, overwrite=_STAGED_MODES[mode.lower()])
        try:
            records = _spark_write(spark, settings, plan, staged.staging_uri, "errorifexists", compression)
            staged.commit()
        except BaseException:
            staged.abort()  # also when the commit refused: an out created meanwhile keeps it
            raise
    else:
        records = _spark_write(spark, settings, plan, out, mode, compression)
    return ExportResult.of_plan(out, plan, records)


def _spark_write(
    spark: Any, settings: Settings, plan: ReadPlan, out: str, mode: str, compression: str
) -> int:
    """Spark's own Parquet writer and commit into ``out``; the records written."""
    df = tiered_dataframe(spark, settings, plan)
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")  # not legacy INT96
    df.write.mode(mode).option("compression", compression).partitionBy("topic", "partition").parquet(out)
    # Counted from the footers. The schema is given: an export without rows is only `_SUCCESS`,
    # from which Spark cannot infer one (UNABLE_TO_INFER_SCHEMA).
    records: int = spark.read.schema(KAFKA_SCHEMA_DDL).parquet(out).count()
    return records
