"""Reading an exported Iceberg table back into Spark WITHOUT the Iceberg Spark runtime jar
(docs/iceberg.md): the driver plans the current snapshot's data files with pyiceberg, executors
read them with :func:`rlm.jobs.tables.iceberg_files.read_data_files`. The writing side is
:mod:`rlm.jobs.tables.iceberg`.
"""

from __future__ import annotations

from typing import Any

from rlm.errors import TableError
from rlm.jobs.reading import KAFKA_SCHEMA_DDL
from rlm.jobs.tables.iceberg_files import read_data_files

__all__ = ["spark_read_table"]


def spark_read_table(spark: Any, table: Any) -> Any:
    """The table's current snapshot as a Spark DataFrame (Spark's Kafka schema), WITHOUT the
    Iceberg Spark runtime: pyiceberg plans the snapshot's data files on the driver, and executors
    read exactly those Parquet files (one Spark partition per file) through pyiceberg's FileIO with
    the catalog's properties, as rlm's jobs read the store — no Hadoop S3A jars. rlm's tables hold
    data files only; a table with delete files (another engine's) is refused rather than read wrong.
    With the runtime jar, Spark's own Iceberg reader does the same (docs/iceberg.md)."""
    tasks = list(table.scan().plan_files())
    if any(t.delete_files for t in tasks):
        raise TableError(f"table {table.name()} has delete files: read it with the Iceberg Spark runtime")
    paths = [t.file.file_path for t in tasks]
    if not paths:
        return spark.createDataFrame([], KAFKA_SCHEMA_DDL)
    props = dict(table.io.properties)
    rdd = spark.sparkContext.parallelize([(p,) for p in paths], len(paths))
    return spark.createDataFrame(rdd, "path string").mapInArrow(
        lambda batches: read_data_files(props, (p for b in batches for p in b.column(0).to_pylist())),
        KAFKA_SCHEMA_DDL,
    )
