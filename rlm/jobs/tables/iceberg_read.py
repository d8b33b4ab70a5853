"""Reading an exported Iceberg table back into Spark (docs/iceberg.md): WITHOUT the Iceberg Spark
runtime jar, the driver plans the current snapshot's data files with pyiceberg and executors read
them with :func:`rlm.jobs.tables.iceberg_files.read_data_files` (:func:`spark_read_table`); WITH
it, Spark opens the catalog itself (:func:`spark_catalog_conf`). The writing side is
:mod:`rlm.jobs.tables.iceberg`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlm.errors import InvalidArgumentError, TableError
from rlm.jobs.reading import KAFKA_SCHEMA_DDL
from rlm.jobs.tables.iceberg_files import read_data_files

if TYPE_CHECKING:
    from rlm.jobs.tables.iceberg import IcebergTarget

__all__ = ["SPARK_CATALOG_CLASS", "SPARK_EXTENSIONS", "spark_catalog_conf", "spark_read_table"]

#: Spark's Iceberg catalog and SQL extensions (the ``CALL <catalog>.system.*`` procedures), both in
#: ``org.apache.iceberg:iceberg-spark-runtime-<spark>_2.13``.
SPARK_CATALOG_CLASS = "org.apache.iceberg.spark.SparkCatalog"
SPARK_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"


def spark_catalog_conf(target: IcebergTarget) -> dict[str, str]:
    """The Spark configuration that opens ``target``'s SQLite catalog (the embedded default,
    ``catalog.db``) with Spark's own Iceberg runtime: Iceberg's JDBC catalog on the same database
    (``org.xerial:sqlite-jdbc`` on the classpath), under the Spark catalog name
    ``target.catalog_name`` — the JDBC catalog keys its rows by its name, as pyiceberg's SQL
    catalog does — so the table is ``<catalog_name>.<namespace>.<table>`` in Spark SQL.
    ``spark.sql.extensions`` is fixed when the session starts; the ``spark.sql.catalog.*`` keys
    may be set on a running session. The catalog does not cache tables, so a running session sees
    each rlm commit at once. Other catalogs: :class:`InvalidArgumentError` (configure
    Spark's Iceberg catalog for them as its documentation says; docs/iceberg.md)."""
    props = target.properties
    uri = props.get("uri", "")
    if props.get("type") != "sql" or not uri.startswith("sqlite:///"):
        raise InvalidArgumentError(
            f"spark_catalog_conf covers the SQLite catalog only, not {props.get('type')!r} at "
            f"{uri.split(':', 1)[0]!r}: configure Spark's Iceberg catalog by hand (docs/iceberg.md)"
        )
    prefix = f"spark.sql.catalog.{target.catalog_name}"
    conf = {
        "spark.sql.extensions": SPARK_EXTENSIONS,
        prefix: SPARK_CATALOG_CLASS,
        f"{prefix}.type": "jdbc",
        # SQLAlchemy's sqlite:///<path>: the path follows the third slash (absolute: a fourth).
        f"{prefix}.uri": "jdbc:sqlite:" + uri.removeprefix("sqlite:///"),
        # Spark's catalog caches a table's metadata (30 s by default): a running session would
        # not see rlm's next snapshot until REFRESH TABLE.
        f"{prefix}.cache-enabled": "false",
    }
    if "warehouse" in props:
        conf[f"{prefix}.warehouse"] = props["warehouse"]
    return conf


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
