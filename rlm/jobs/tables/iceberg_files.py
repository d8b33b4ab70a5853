"""Worker side of the Iceberg export (docs/iceberg.md): write one task's records as Parquet data
files, one file per ``(topic, day)``, and say what was written (:class:`~rlm.jobs.tables.sink.DataFile`);
read such files back for Spark.

No pyspark and no catalog here (pyarrow and pyiceberg's FileIO only), so the same code runs in a
Spark Python worker and in the local engine's workers. Files are written through pyiceberg's
``PyArrowFileIO`` with the catalog's properties, so they land where the table lives (a local
warehouse, S3, HDFS) with the credentials/endpoints the catalog is configured with.

Why one file per topic and day: the driver registers the files with pyiceberg's ``add_files``,
which infers each file's partition (``topic``, ``day(timestamp)``) from its column statistics; a
file whose rows span two days has no single partition and would be refused.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import quote

from rlm.jobs.reading import ReadTask, arrow_schema
from rlm.jobs.tables.sink import DataFile

__all__ = ["FILE_PREFIX", "day_path", "file_io", "read_data_files", "write_day_files"]

#: Every data file rlm writes is named ``rlm-<attempt>-<task>-<n>.parquet``: the attempt (one
#: export run) tells a crashed run's unreferenced files apart (docs/iceberg.md, orphans).
FILE_PREFIX = "rlm-"
_US_PER_DAY = 86_400_000_000


def day_path(day: int) -> str:
    """Iceberg's human form of a ``day`` partition value (days since 1970-01-01: ``2024-01-31``)."""
    return (datetime.date(1970, 1, 1) + datetime.timedelta(days=day)).isoformat()


def write_day_files(
    io_properties: dict[str, str],
    data_location: str,
    attempt: str,
    index: int,
    task: ReadTask,
    batches: Iterable[Any],
    compression: str = "snappy",
) -> list[DataFile]:
    """Write the task's Arrow batches, split by UTC day, under ``data_location`` (the table's
    ``<location>/data``): ``topic=<t>/timestamp_day=<date>/rlm-<attempt>-<index>-<n>.parquet``,
    through the catalog's FileIO (``io_properties``). Rows keep offset order within a file; a
    task without records writes nothing. The task's rows are held in memory (one task is at most
    ``--task-mib`` of segment bytes)."""
    import numpy as np
    import pyarrow as pa

    batches = [b for b in batches if b.num_rows]
    if not batches:
        return []
    rows = pa.Table.from_batches(batches, schema=arrow_schema())
    # Floor division: a record without a timestamp (-1 ms, v0 messages) is on 1969-12-31, as in
    # Iceberg's day transform.
    days = rows.column("timestamp").cast(pa.int64()).to_numpy() // _US_PER_DAY
    io = file_io(io_properties)
    out = []
    for n, day in enumerate(int(d) for d in np.unique(days)):
        part = rows.filter(pa.array(days == day))
        path = (
            f"{data_location}/topic={quote(task.topic, safe='')}/timestamp_day={day_path(day)}/"
            f"{FILE_PREFIX}{attempt}-{index:06d}-{n:03d}.parquet"
        )
        size = _write_parquet(io, path, part, compression)
        offsets = part.column("offset")
        out.append(
            DataFile(
                path, task.topic, task.partition, part.num_rows, size, offsets[0].as_py(), offsets[-1].as_py()
            )
        )
    return out


def read_data_files(io_properties: dict[str, str], paths: Iterable[str]) -> Iterator[Any]:
    """Arrow batches (schema :func:`~rlm.jobs.reading.decode.arrow_schema`, columns by name) of rlm data
    files, read through the catalog's FileIO (the read side of
    :func:`rlm.jobs.tables.iceberg_read.spark_read_table`)."""
    import pyarrow.parquet as pq

    schema = arrow_schema()
    io = file_io(io_properties)
    for path in paths:
        with io.new_input(path).open() as stream:
            for batch in pq.ParquetFile(stream).iter_batches(columns=schema.names):
                yield batch.cast(schema)


def file_io(properties: dict[str, str]) -> Any:
    """pyiceberg's pyarrow FileIO for the catalog's properties (endpoints, credentials)."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    return PyArrowFileIO(properties)


def _write_parquet(io: Any, path: str, rows: Any, compression: str) -> int:
    """Write ``rows`` to ``path``; the file's size in bytes."""
    import pyarrow.parquet as pq

    scheme, netloc, local = io.parse_location(path)
    fs = io.fs_by_scheme(scheme, netloc)
    fs.create_dir(local.rsplit("/", 1)[0], recursive=True)  # object stores: a no-op
    # Plain column names, no field ids: the table's name mapping maps them (what add_files needs).
    with io.new_output(path).create(overwrite=True) as stream:
        pq.write_table(rows, stream, compression=compression)
        return int(stream.tell())
