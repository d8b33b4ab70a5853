"""An export on a Hadoop filesystem (``hdfs://``, ``s3a://``), seen through a Spark session's own
connectors: its file layout (:func:`hadoop_layout`, what ``tests.jobs.helpers.layout`` says of a
local one) and its rows read back by Spark (:func:`spark_rows`).

Run as a module, it is the driver of the s3a test (tests/spark/test_export_connectors.py)::

    python -m tests.spark.hadoop_paths RESULT_DIR -- export --config F --out s3a://b/p ...

It runs the CLI's ``rlm export`` in this process — Spark configured only by ``PYSPARK_SUBMIT_ARGS``,
as docs/export.md tells users — then reads ``--out`` back through the same Spark application (the
S3A jars are on its classpath, not on the test process's) into ``RESULT_DIR/rows.parquet`` and
``RESULT_DIR/files.json`` (:func:`hadoop_files`). One JVM instead of two saves the test a Spark
start (about 8 s)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from tests.jobs.helpers import PART_FILE, table_rows


def hadoop_files(spark: Any, out: str) -> list[str]:
    """Every file under ``out`` (relative paths, sorted), listed by Hadoop's FileSystem for its
    scheme; [] when ``out`` holds none or is absent."""
    jvm = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(out)
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
    if not fs.exists(path):
        return []
    root = fs.makeQualified(path).toString().rstrip("/") + "/"
    found = []
    files = fs.listFiles(path, True)
    while files.hasNext():
        found.append(files.next().getPath().toString().removeprefix(root))
    return sorted(found)


def layout_of(files: list[str]) -> dict[str, int]:
    """``tests.jobs.helpers.layout`` of these relative paths: ``{partition dir: part files}`` plus
    the root's other files (``_SUCCESS``); asserts every data file has Spark's name form."""
    found: dict[str, int] = {}
    for rel in files:
        parent, _, name = rel.rpartition("/")
        if name.endswith(".parquet"):
            assert PART_FILE.fullmatch(name), name
            found[parent] = found.get(parent, 0) + 1
        else:
            found[rel] = 0
    return found


def part_files(files: list[str]) -> list[str]:
    """The data files as ``topic=T/partition=P/part-NNNNN`` (the run's uuid left out), sorted: what
    two exports of one plan name alike."""
    return sorted(re.sub(r"-[0-9a-f-]{36}\.c000\..*$", "", f) for f in files if f.endswith(".parquet"))


def local_files(out: Path) -> list[str]:
    """:func:`hadoop_files` of a local ``out`` (hidden files, such as Hadoop's ``.crc``, left out)."""
    return sorted(
        str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and not p.name.startswith(".")
    )


def hadoop_layout(spark: Any, out: str) -> dict[str, int]:
    """:func:`layout_of` :func:`hadoop_files`."""
    return layout_of(hadoop_files(spark, out))


def spark_rows(spark: Any, out: str) -> list[tuple[Any, ...]]:
    """Every row under ``out`` as Spark reads it back, in ``tests.jobs.helpers.sorted_rows``'
    form (the schema given, so an export without rows reads as none)."""
    from rlm.jobs.reading import KAFKA_SCHEMA_DDL

    return table_rows(spark.read.schema(KAFKA_SCHEMA_DDL).parquet(out).toArrow())


def main(argv: list[str]) -> int:
    """``RESULT_DIR -- <rlm args>``: the CLI, then the read-back (see the module doc)."""
    import pyarrow.parquet as pq
    from pyspark.sql import SparkSession

    from rlm.cli.main import main as rlm_main
    from rlm.jobs.reading import KAFKA_SCHEMA_DDL

    result, args = Path(argv[0]), argv[2:]
    rlm_main(args, standalone_mode=False)  # a failure raises SystemExit(1), as the CLI exits
    spark = SparkSession.getActiveSession()  # the one the CLI started
    assert spark is not None
    out = args[args.index("--out") + 1]
    pq.write_table(spark.read.schema(KAFKA_SCHEMA_DDL).parquet(out).toArrow(), result / "rows.parquet")
    (result / "files.json").write_text(json.dumps(hadoop_files(spark, out)))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
