"""``rlm export``, ``rlm verify``, ``rlm rebuild-index --spark-master``
(docs/cli.md, docs/export.md): Spark jobs.

pyspark is imported only when one of these commands runs. Spark's console progress bar shows on
a terminal; piped output stays quiet (JSON on stdout, one-line errors on stderr).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import TypedDict

import click

from rlm.cli.common import config_option, load, require_dirs
from rlm.cli.errors import EXIT_FAILURE, handle_errors
from rlm.config import Settings
from rlm.daemon.logs import configure

_MASTER_HELP = "Spark master URL (default local[*]; local tasks need executors on this host)."


class _ExportRange(TypedDict):
    """The keyword arguments both export engines share (what to read and how large a task is)."""

    partitions: list[int] | None
    start: int | None
    end: int | None
    target_bytes: int
    isolation: str


def _emit(doc: object) -> None:
    sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")


def _quiet_py4j() -> None:
    logging.getLogger("py4j").setLevel(logging.ERROR)


_ENGINE_HELP = (
    "local: one process with pyarrow, no JVM (the sidecar default); spark: a Spark job "
    "(large exports, clusters). Default: local, or spark when --spark-master is given "
    "(docs/export.md)."
)


@click.command("export")
@config_option
@click.option("--topic", "topics", required=True, multiple=True, help="Topic to export (repeatable).")
@click.option(
    "--partition",
    "partitions",
    type=click.IntRange(0),
    multiple=True,
    help="Only these partitions (repeatable; default all).",
)
@click.option(
    "--from-timestamp",
    "start",
    type=click.IntRange(0),
    default=None,
    help="First record timestamp included (ms since the epoch).",
)
@click.option(
    "--to-timestamp",
    "end",
    type=click.IntRange(0),
    default=None,
    help="Record timestamps from this one on are excluded (half-open range).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Output directory (Parquet); iceberg: the embedded catalog's directory (docs/iceberg.md).",
)
@click.option("--engine", type=click.Choice(["local", "spark"]), default=None, help=_ENGINE_HELP)
@click.option(
    "--spark-master",
    default=None,
    help="Spark master URL; implies --engine spark (default with --engine spark: local[*]; "
    "local tasks need executors on this host).",
)
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists (default: refuse).")
@click.option(
    "--task-mib",
    type=click.IntRange(1, 1024),
    default=32,
    show_default=True,
    help="Target MiB read per task (both engines).",
)
@click.option(
    "--parallelism",
    type=click.IntRange(1),
    default=None,
    help="--engine local: tasks run at once (default: the CPU count).",
)
@click.option(
    "--isolation",
    type=click.Choice(["read_uncommitted", "read_committed"]),
    default="read_uncommitted",
    show_default=True,
    help="read_committed: leave out aborted transactions, stop at the last stable offset "
    "(docs/transactions.md).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["parquet", "iceberg"]),
    default="parquet",
    show_default=True,
    help="iceberg: an Apache Iceberg table ([iceberg] config, docs/iceberg.md).",
)
@click.option(
    "--incremental", is_flag=True, help="iceberg: export only offsets beyond those the table already holds."
)
@handle_errors
def export(
    config_path: Path,
    topics: tuple[str, ...],
    partitions: tuple[int, ...],
    start: int | None,
    end: int | None,
    out: Path | None,
    engine: str | None,
    spark_master: str | None,
    overwrite: bool,
    task_mib: int,
    parallelism: int | None,
    isolation: str,
    fmt: str,
    incremental: bool,
) -> None:
    """Export records of both tiers to Parquet with Spark's Kafka source schema, partitioned by
    topic/partition, time range [--from-timestamp, --to-timestamp); or (--format iceberg) append
    them to an Iceberg table partitioned by topic and day, one snapshot per run (docs/iceberg.md).

    Both engines plan the same tasks and write the same rows and layout
    (OUT/topic=T/partition=P/part-*.parquet). A local OUT is built in a staging dir next to it
    and renamed into place at the end: a failed export leaves OUT as it was."""
    engine = engine or ("spark" if spark_master is not None else "local")
    if engine == "local" and spark_master is not None:
        raise click.UsageError("--spark-master needs --engine spark")
    if engine == "spark" and parallelism is not None:
        raise click.UsageError("--parallelism applies to --engine local (Spark: the master's cores)")
    configure("text", logging.WARNING)
    settings = load(config_path)
    require_dirs(settings)
    from rlm.jobs.plan import check_time_range

    check_time_range(start, end)
    if fmt == "iceberg":
        _export_iceberg(
            settings,
            list(topics),
            list(partitions) or None,
            start,
            end,
            out,
            engine,
            spark_master,
            overwrite,
            task_mib,
            parallelism,
            isolation,
            incremental,
        )
        return
    if out is None or incremental:
        raise click.UsageError(
            "--format parquet needs --out" if out is None else "--incremental is for --format iceberg"
        )
    common: _ExportRange = {
        "partitions": list(partitions) or None,
        "start": start,
        "end": end,
        "target_bytes": task_mib * 1024 * 1024,
        "isolation": isolation,
    }
    if engine == "local":
        from rlm.jobs.export_local import export_local

        result = export_local(
            settings, list(topics), out, overwrite=overwrite, parallelism=parallelism, **common
        )
    else:
        _quiet_py4j()
        from rlm.jobs import export as run_export
        from rlm.jobs import spark_session

        spark = spark_session(spark_master or "local[*]", "rlm export")
        result = run_export(
            spark,
            settings,
            list(topics),
            str(out),
            mode="overwrite" if overwrite else "errorifexists",
            **common,
        )
    _emit(result.to_json())


def _export_iceberg(
    settings: Settings,
    topics: list[str],
    partitions: list[int] | None,
    start: int | None,
    end: int | None,
    out: Path | None,
    engine: str,
    spark_master: str | None,
    overwrite: bool,
    task_mib: int,
    parallelism: int | None,
    isolation: str,
    incremental: bool,
) -> None:
    """``--format iceberg``: by offsets only (docs/iceberg.md), so no time range and no overwrite."""
    if start is not None or end is not None:
        raise click.UsageError(
            "--format iceberg exports by offset: filter on the table's "
            "day(timestamp) partitions instead of --from/--to-timestamp"
        )
    if overwrite:
        raise click.UsageError("--format iceberg appends to its table: drop the table to start over")
    from rlm.jobs.iceberg import IcebergTarget, export_iceberg, local_engine, spark_engine

    target = IcebergTarget.from_settings(settings, out)
    if engine == "local":
        run = local_engine(parallelism)
    else:
        _quiet_py4j()
        from rlm.jobs import spark_session

        run = spark_engine(spark_session(spark_master or "local[*]", "rlm export"))
    result = export_iceberg(
        settings,
        topics,
        target,
        run,
        partitions=partitions,
        incremental=incremental,
        target_bytes=task_mib * 1024 * 1024,
        isolation=isolation,
    )
    _emit(result.to_json())


@click.command("verify")
@config_option
@click.option("--deep", is_flag=True, help="Read every object: all batch CRCs, object sizes and CRC-32C.")
@click.option("--topic", "topics", multiple=True, help="Only these topics (repeatable; default all).")
@click.option(
    "--report",
    "report_path",
    type=click.Path(path_type=Path),
    default=None,
    help="Write the JSON report here instead of stdout.",
)
@click.option("--spark-master", default="local[*]", show_default=True, help=_MASTER_HELP)
@handle_errors
def verify(
    config_path: Path, deep: bool, topics: tuple[str, ...], report_path: Path | None, spark_master: str
) -> None:
    """Scrub the store and the local index sets; exit 1 when a problem is found, 0 when clean."""
    configure("text", logging.WARNING)
    _quiet_py4j()
    settings = load(config_path)
    require_dirs(settings)
    from rlm.jobs import spark_session
    from rlm.jobs import verify as run_verify

    spark = spark_session(spark_master, "rlm verify")
    report = run_verify(spark, settings, deep=deep, topics=list(topics) or None)
    doc = json.dumps(report.to_json(), indent=None, separators=(",", ":"))
    if report_path is None:
        sys.stdout.write(doc + "\n")
    else:
        report_path.write_text(doc + "\n")
    for line in report.summary_lines():
        click.echo(line, err=True)
    if not report.ok:
        raise SystemExit(EXIT_FAILURE)


@click.command("rebuild-index")
@config_option
@click.option(
    "--spark-master",
    default=None,
    help="Run as a Spark job on this master (e.g. local[*]); default: in-process.",
)
@click.option("--quiet", is_flag=True, help="No progress bar (in-process rebuild).")
@click.pass_context
@handle_errors
def rebuild_index(ctx: click.Context, config_path: Path, spark_master: str | None, quiet: bool) -> None:
    """Rebuild every local remote-index set from the remote manifests alone."""
    if spark_master is None:  # the in-process command (rlm.cli.run), unchanged
        from rlm.cli.run import rebuild_index as in_process

        ctx.invoke(in_process, config_path=config_path, quiet=quiet)
        return
    configure("text", logging.WARNING)
    _quiet_py4j()
    settings = load(config_path)
    require_dirs(settings)
    from rlm.jobs import rebuild_index as run_rebuild
    from rlm.jobs import spark_session

    _emit(run_rebuild(spark_session(spark_master, "rlm rebuild-index"), settings))
