"""Executor side of the Iceberg export (docs/iceberg.md): read one :class:`~rlm.jobs.plan.ReadTask`,
write its records as Parquet data files, one file per ``(topic, day)``, and say what was written.

No pyspark and no catalog here (pyarrow and pyiceberg's FileIO only), so the same code runs in a
Spark Python worker and in the single-process engine. Files are written through pyiceberg's
``PyArrowFileIO`` with the catalog's properties, so they land where the table lives (a local
warehouse, S3, HDFS) with the credentials/endpoints the catalog is configured with.

Why one file per topic and day: the driver registers the files with pyiceberg's ``add_files``,
which infers each file's partition (``topic``, ``day(timestamp)``) from its column statistics; a
file whose rows span two days has no single partition and would be refused.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from rlm.jobs.decode import arrow_schema, read_task_bytes, task_to_arrow
from rlm.jobs.plan import BackendSpec, ReadTask

#: Every data file rlm writes is named ``rlm-<attempt>-<task>-<n>.parquet``: the attempt (one
#: export run) tells a crashed run's unreferenced files apart (docs/iceberg.md, orphans).
FILE_PREFIX = "rlm-"
_US_PER_DAY = 86_400_000_000


@dataclass(frozen=True, slots=True)
class WriteJob:
    """What every writer of one export run needs, as plain data (pickled to executors).

    ``data_location``: the table's data directory URI (``<table location>/data``);
    ``io_properties``: the catalog's FileIO properties (endpoints, credentials);
    ``attempt``: this run's id (hex), part of every file name.
    """

    spec: BackendSpec
    io_properties: dict[str, str]
    data_location: str
    attempt: str
    compression: str = "snappy"


@dataclass(frozen=True, slots=True)
class WrittenFile:
    """One data file written: its URI, partition (topic, ``day`` = days since 1970-01-01 UTC) and
    the Kafka partition, record count and offset range of its rows."""

    path: str
    topic: str
    partition: int
    day: int
    records: int
    min_offset: int
    max_offset: int


def day_path(day: int) -> str:
    """Iceberg's human form of a ``day`` partition value (``2024-01-31``)."""
    return (datetime.date(1970, 1, 1) + datetime.timedelta(days=day)).isoformat()


def write_task(job: WriteJob, index: int, task: ReadTask) -> list[WrittenFile]:
    """Read ``task`` and write its records, split by UTC day, under ``job.data_location``
    (``topic=<t>/timestamp_day=<date>/rlm-<attempt>-<index>-<n>.parquet``). Rows keep offset order
    within a file. A task without records writes nothing."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    batches = list(task_to_arrow(task, read_task_bytes(task, job.spec)))
    if not batches:
        return []
    rows = pa.Table.from_batches(batches, schema=arrow_schema())
    # Floor division: a record without a timestamp (-1 ms, v0 messages) is on 1969-12-31, as in
    # Iceberg's day transform.
    days = rows.column("timestamp").cast(pa.int64()).to_numpy() // _US_PER_DAY
    io = _file_io(job.io_properties)
    out = []
    for n, day in enumerate(int(d) for d in np.unique(days)):
        part = rows.filter(pa.array(days == day))
        path = (f"{job.data_location}/topic={quote(task.topic, safe='')}/timestamp_day={day_path(day)}/"
                f"{FILE_PREFIX}{job.attempt}-{index:06d}-{n:03d}.parquet")
        _write_parquet(io, path, part, job.compression)
        offsets = part.column("offset")
        out.append(WrittenFile(path, task.topic, task.partition, day, part.num_rows,
                               pc.min(offsets).as_py(), pc.max(offsets).as_py()))
    return out


def write_tasks_local(job: WriteJob, tasks: Sequence[ReadTask]) -> list[WrittenFile]:
    """The in-process writer: every task in order, in this process (no JVM)."""
    return [f for i, task in enumerate(tasks) for f in write_task(job, i, task)]


def read_data_files(io_properties: dict[str, str], paths: Iterable[str]) -> Iterator[Any]:
    """Arrow batches (schema :func:`~rlm.jobs.decode.arrow_schema`, columns by name) of rlm data
    files, read through the catalog's FileIO (the read side of ``spark_read_table``)."""
    import pyarrow.parquet as pq

    schema = arrow_schema()
    io = _file_io(io_properties)
    for path in paths:
        with io.new_input(path).open() as stream:
            for batch in pq.ParquetFile(stream).iter_batches(columns=schema.names):
                yield batch.cast(schema)


def _file_io(properties: dict[str, str]) -> Any:
    from pyiceberg.io.pyarrow import PyArrowFileIO

    return PyArrowFileIO(properties)


def _write_parquet(io: Any, path: str, rows: Any, compression: str) -> None:
    import pyarrow.parquet as pq

    scheme, netloc, local = io.parse_location(path)
    fs = io.fs_by_scheme(scheme, netloc)
    fs.create_dir(local.rsplit("/", 1)[0], recursive=True)  # object stores: a no-op
    # Plain column names, no field ids: the table's name mapping maps them (what add_files needs).
    with io.new_output(path).create(overwrite=True) as stream:
        pq.write_table(rows, stream, compression=compression)
