"""Any export :class:`~rlm.jobs.tables.sink.Sink` on Spark: executors write, the driver commits once.

The Spark counterpart of :func:`rlm.jobs.tables.export_local.run_sink` (docs/export.md): one Spark task
per planned read task, each running :func:`rlm.jobs.tables.sink.run_task` (read, decode, the
sink's ``write_task``) on an executor; only the :class:`~rlm.jobs.tables.sink.DataFile` descriptions
(paths and counts, never rows) come back to the driver, which then calls ``commit`` once — or
``abort`` if the job failed. The Iceberg export uses it (docs/iceberg.md), and so does the Parquet
export to a local ``out`` (:class:`~rlm.jobs.tables.sink.ParquetSink`; other filesystems keep Spark's own
writer, docs/export.md). A retried Spark task runs ``write_task`` again with the same index.
"""

from __future__ import annotations

from typing import Any

from rlm.jobs.reading import BackendSpec, ReadPlan
from rlm.jobs.tables.sink import DataFile, Sink, run_task

__all__ = ["run_sink_spark"]


def run_sink_spark(spark: Any, plan: ReadPlan, spec: BackendSpec, sink: Sink) -> list[DataFile]:
    """Run every task of ``plan`` through ``sink`` on Spark's executors, then commit the sink;
    on any failure (or interrupt) abort it and re-raise. Returns the committed files in task order."""
    tasks = plan.tasks
    try:
        files: list[DataFile] = []
        if tasks:
            rdd = spark.sparkContext.parallelize(list(enumerate(tasks)), len(tasks))
            files = list(rdd.flatMap(lambda it: run_task(sink, spec, it[0], it[1])).collect())
        sink.commit(files)
    except BaseException:
        sink.abort()
        raise
    return files
