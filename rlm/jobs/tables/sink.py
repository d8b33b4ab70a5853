"""Export sinks: where the Arrow batches of each planned read task go (docs/export.md).

The seam between the export *engines* and the output *formats*. An engine (the local engine of
:mod:`rlm.jobs.tables.export_local`, the Spark one of :mod:`rlm.jobs.tables.spark_sink`) runs :func:`run_task`
once per :class:`~rlm.jobs.reading.plan.ReadTask`, wherever the task runs (a worker thread or process, an
executor): it calls :meth:`Sink.write_task` with the task's Arrow batches from
:func:`rlm.jobs.reading.decode.task_to_arrow`, and ``write_task`` returns what it wrote as
:class:`DataFile` values (plain, picklable). The driver then calls :meth:`Sink.commit` once with
every task's files, or :meth:`Sink.abort` when anything failed. A sink is shipped to the workers,
so it must pickle and ``write_task`` must not depend on driver state; nothing a sink writes may be
visible at the destination before ``commit``. Both engines summarise an export as
:class:`ExportResult`.

:class:`ParquetSink` writes Spark's ``partitionBy("topic", "partition")`` layout into a staging
directory next to ``out`` (:class:`rlm.jobs.staging.StagedDir`) and renames it to ``out`` on commit.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rlm.errors import InvalidArgumentError
from rlm.jobs.reading import BackendSpec, ReadPlan, ReadTask, read_task_bytes, task_to_arrow
from rlm.jobs.staging import StagedDir, local_path

__all__ = [
    "DICTIONARY_COLUMNS",
    "PARQUET_CODECS",
    "ROW_GROUP_BYTES",
    "DataFile",
    "ExportResult",
    "ParquetSink",
    "Sink",
    "parquet_codec",
    "run_task",
]

#: Rows of a task buffered before they are written as one Parquet row group (bounds a worker's
#: memory whatever ``--task-mib`` is; Spark's writer buffers a 128 MiB row group the same way).
ROW_GROUP_BYTES = 64 * 1024 * 1024

#: Columns dictionary-encoded. Keys, values and headers are mostly distinct: building a
#: dictionary until it overflows (then falling back) cost ~half the write time (bench/export_bench.py).
DICTIONARY_COLUMNS = ["timestampType"]


#: Spark's ``compression`` option → (pyarrow codec, the file-name infix Spark writes).
PARQUET_CODECS: dict[str, tuple[str, str]] = {
    "none": ("none", ""),
    "uncompressed": ("none", ""),
    "snappy": ("snappy", ".snappy"),
    "gzip": ("gzip", ".gz"),
    "zstd": ("zstd", ".zstd"),
    "lz4_raw": ("lz4", ".lz4raw"),
    "brotli": ("brotli", ".br"),
}


@dataclass(frozen=True, slots=True)
class DataFile:
    """One file a sink wrote for one task: ``records`` rows of one topic-partition, offsets
    ``min_offset..max_offset`` (inclusive), ``size`` bytes at ``path`` (absolute, in the
    sink's staging area until :meth:`Sink.commit`)."""

    path: str
    topic: str
    partition: int
    records: int
    size: int
    min_offset: int
    max_offset: int


class Sink(Protocol):
    """What an export engine writes through (see the module doc for the contract)."""

    def write_task(self, index: int, task: ReadTask, batches: Iterable[Any]) -> list[DataFile]:
        """Write the task's Arrow record batches (schema :func:`rlm.jobs.reading.decode.arrow_schema`);
        ``index`` is the task's position in the plan (unique per export). Runs on a worker."""
        ...

    def commit(self, files: Sequence[DataFile]) -> None:
        """Make every task's files visible at the destination at once. Runs on the driver."""
        ...

    def abort(self) -> None:
        """Drop what was written (best effort). Runs on the driver after a failure."""
        ...


def run_task(sink: Sink, spec: BackendSpec, index: int, task: ReadTask) -> list[DataFile]:
    """One task on a worker: read its bytes, decode, write through ``sink``."""
    return sink.write_task(index, task, task_to_arrow(task, read_task_bytes(task, spec)))


@dataclass(frozen=True, slots=True)
class ExportResult:
    """What an export did: ``partitions`` and ``tasks`` planned, ``bytes_planned`` (bytes of the
    planned byte ranges), ``records`` written under ``out``, by ``engine`` (``spark`` or ``local``).
    Both engines build it here, beside the sink they write through."""

    out: str
    partitions: int
    tasks: int
    bytes_planned: int
    records: int
    engine: str = "spark"

    @classmethod
    def of_plan(cls, out: str, plan: ReadPlan, records: int, engine: str = "spark") -> ExportResult:
        """The summary of an export of ``plan`` that wrote ``records`` under ``out``."""
        return cls(
            out, len(plan.partitions), len(plan.tasks), sum(t.size for t in plan.tasks), records, engine
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "out": self.out,
            "partitions": self.partitions,
            "tasks": self.tasks,
            "bytes_planned": self.bytes_planned,
            "records": self.records,
            "engine": self.engine,
        }


def parquet_codec(compression: str) -> tuple[str, str]:
    """(pyarrow codec, file-name infix) for a Spark ``compression`` name."""
    try:
        return PARQUET_CODECS[compression.lower()]
    except KeyError:
        raise InvalidArgumentError(
            f"compression {compression!r} is not one of {', '.join(sorted(PARQUET_CODECS))}"
        ) from None


@dataclass(frozen=True, slots=True)
class ParquetSink:
    """Parquet files in Spark's layout: ``out/topic=T/partition=P/part-<task>-<run>.c000
    .<codec>.parquet`` (one file per task with rows, the ``topic``/``partition`` columns only in
    the directory names, timestamps as TIMESTAMP_MICROS UTC) and an empty ``_SUCCESS``."""

    staged: StagedDir
    run_id: str
    compression: str = "snappy"

    @classmethod
    def begin(
        cls, out: str | os.PathLike[str], *, overwrite: bool = False, compression: str = "snappy"
    ) -> ParquetSink:
        path = local_path(out)
        if path is None:
            raise InvalidArgumentError(
                f"--out {os.fspath(out)}: the local engine writes local paths "
                "only (use --engine spark for other filesystems)"
            )
        parquet_codec(compression)
        return cls(StagedDir.begin(path, overwrite), str(uuid.uuid4()), compression)

    def write_task(self, index: int, task: ReadTask, batches: Iterable[Any]) -> list[DataFile]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        codec, infix = parquet_codec(self.compression)
        directory = self.staged.staging / f"topic={task.topic}" / f"partition={task.partition}"
        path = directory / f"part-{index:05d}-{self.run_id}.c000{infix}.parquet"
        # Written under a hidden attempt name and renamed: a retried or speculative Spark attempt
        # of the same task never interleaves its bytes with another's (the last rename wins,
        # and every attempt writes the same rows).
        attempt = directory / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
        writer: Any = None
        pending: list[Any] = []
        pending_bytes = records = 0
        first = last = -1

        def flush() -> None:
            nonlocal writer, pending_bytes
            table = pa.Table.from_batches(pending).drop_columns(["topic", "partition"])
            if writer is None:
                # Never parents=True: a straggling Spark task of a failed job must not recreate
                # the staging dir that abort() removed.
                directory.parent.mkdir(exist_ok=True)
                directory.mkdir(exist_ok=True)
                writer = pq.ParquetWriter(
                    attempt, table.schema, compression=codec, use_dictionary=DICTIONARY_COLUMNS
                )
            writer.write_table(table)
            pending.clear()
            pending_bytes = 0

        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                offsets = batch.column("offset")
                first = offsets[0].as_py() if first < 0 else first
                last = offsets[-1].as_py()
                records += batch.num_rows
                pending.append(batch)
                pending_bytes += batch.nbytes
                if pending_bytes >= ROW_GROUP_BYTES:
                    flush()
            if pending:
                flush()
        except BaseException:
            if writer is not None:
                writer.close()
                attempt.unlink(missing_ok=True)
            raise
        if writer is None:
            return []  # like Spark: a task without rows writes no file
        writer.close()
        os.replace(attempt, path)
        return [DataFile(str(path), task.topic, task.partition, records, path.stat().st_size, first, last)]

    def commit(self, files: Sequence[DataFile]) -> None:
        (self.staged.staging / "_SUCCESS").write_bytes(b"")
        self.staged.commit()

    def abort(self) -> None:
        self.staged.abort()
