"""``rlm export``, ``rlm verify``, ``rlm rebuild-index`` (docs/cli.md, docs/export.md): the jobs
over both tiers, on the local engine or Spark.

pyspark is imported only when a command runs on Spark. Spark's console progress bar shows on a
terminal; piped output stays quiet (JSON on stdout, one-line errors on stderr).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from rlm.cli.common import (
    build_manager,
    config_option,
    load,
    partition_progress,
    require_dirs,
    settings_for_tool,
)
from rlm.cli.errors import EXIT_FAILURE, handle_errors
from rlm.cli.output import emit_json, json_line
from rlm.config import Settings
from rlm.daemon.logs import configure

__all__ = ["ExportOptions", "export", "rebuild_index", "verify"]

_MASTER_HELP = "Spark master URL (default local[*]; local tasks need executors on this host)."


def _quiet_py4j() -> None:
    logging.getLogger("py4j").setLevel(logging.ERROR)


def _job_settings(config_path: Path) -> Settings:
    """A job's settings, validated, with its log dirs present; warnings-only logs."""
    configure("text", logging.WARNING)
    settings = load(config_path)
    require_dirs(settings)
    return settings


def _spark(master: str | None, app_name: str) -> Any:
    """A Spark session on ``master`` (default local[*]), py4j's chatter silenced."""
    _quiet_py4j()
    from rlm.jobs import spark_session

    return spark_session(master or "local[*]", app_name)


_ENGINE_HELP = (
    "local: one process with pyarrow, no JVM (the sidecar default); spark: a Spark job "
    "(large exports, clusters). Default: local, or spark when --spark-master is given "
    "(docs/export.md)."
)


@dataclass(frozen=True, slots=True)
class ExportOptions:
    """``rlm export``'s options once checked against each other: ``engine`` resolved (local or
    spark), ``partitions`` None for all, ``target_bytes`` read per task (``--task-mib`` in bytes)."""

    topics: list[str]
    partitions: list[int] | None
    start: int | None
    end: int | None
    out: str | None  # as typed: a URI (hdfs://, s3a://) must not go through Path (hdfs:/h:8020/x)
    engine: str
    spark_master: str | None
    overwrite: bool
    target_bytes: int
    parallelism: int | None
    isolation: str
    incremental: bool


def _export_engine(engine: str | None, spark_master: str | None, parallelism: int | None) -> str:
    """``--engine`` as given or implied by ``--spark-master``; options of the other engine are
    usage errors."""
    engine = engine or ("spark" if spark_master is not None else "local")
    if engine == "local" and spark_master is not None:
        raise click.UsageError("--spark-master needs --engine spark")
    if engine == "spark" and parallelism is not None:
        raise click.UsageError("--parallelism applies to --engine local (Spark: the master's cores)")
    return engine


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
    type=click.Path(path_type=str),
    default=None,
    help="Output directory (Parquet; --engine spark: also hdfs://, s3a://… URIs); iceberg: the "
    "embedded catalog's directory (docs/iceberg.md).",
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
    out: str | None,
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
    opts = ExportOptions(
        list(topics),
        list(partitions) or None,
        start,
        end,
        out,
        _export_engine(engine, spark_master, parallelism),
        spark_master,
        overwrite,
        task_mib * 1024 * 1024,
        parallelism,
        isolation,
        incremental,
    )
    settings = _job_settings(config_path)
    from rlm.jobs.reading import check_time_range

    check_time_range(start, end)
    emit_json(_export_iceberg(settings, opts) if fmt == "iceberg" else _export_parquet(settings, opts))


def _export_parquet(settings: Settings, opts: ExportOptions) -> dict[str, Any]:
    """``--format parquet`` (the default): OUT written by the local engine or by Spark; the
    result's JSON (docs/export.md)."""
    if opts.out is None or opts.incremental:
        raise click.UsageError(
            "--format parquet needs --out" if opts.out is None else "--incremental is for --format iceberg"
        )
    if opts.engine == "local":
        from rlm.jobs.tables import export_local

        local = export_local(
            settings,
            opts.topics,
            opts.out,
            partitions=opts.partitions,
            start=opts.start,
            end=opts.end,
            target_bytes=opts.target_bytes,
            overwrite=opts.overwrite,
            isolation=opts.isolation,
            parallelism=opts.parallelism,
        )
        return local.to_json()
    from rlm.jobs import export as run_export

    spark = run_export(
        _spark(opts.spark_master, "rlm export"),
        settings,
        opts.topics,
        opts.out,
        partitions=opts.partitions,
        start=opts.start,
        end=opts.end,
        target_bytes=opts.target_bytes,
        mode="overwrite" if opts.overwrite else "errorifexists",
        isolation=opts.isolation,
    )
    return spark.to_json()


def _export_iceberg(settings: Settings, opts: ExportOptions) -> dict[str, Any]:
    """``--format iceberg``: by offsets only (docs/iceberg.md), so no time range and no overwrite;
    the result's JSON."""
    if opts.start is not None or opts.end is not None:
        raise click.UsageError(
            "--format iceberg exports by offset: filter on the table's "
            "day(timestamp) partitions instead of --from/--to-timestamp"
        )
    if opts.overwrite:
        raise click.UsageError("--format iceberg appends to its table: drop the table to start over")
    from rlm.jobs.tables import IcebergTarget, export_iceberg, local_engine, spark_engine

    target = IcebergTarget.from_settings(settings, None if opts.out is None else Path(opts.out))
    if opts.engine == "local":
        run = local_engine(opts.parallelism)
    else:
        run = spark_engine(_spark(opts.spark_master, "rlm export"))
    result = export_iceberg(
        settings,
        opts.topics,
        target,
        run,
        partitions=opts.partitions,
        incremental=opts.incremental,
        target_bytes=opts.target_bytes,
        isolation=opts.isolation,
    )
    return result.to_json()


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
    settings = _job_settings(config_path)
    from rlm.jobs import verify as run_verify

    report = run_verify(_spark(spark_master, "rlm verify"), settings, deep=deep, topics=list(topics) or None)
    if report_path is None:
        emit_json(report.to_json())
    else:
        report_path.write_text(json_line(report.to_json()))
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
@handle_errors
def rebuild_index(config_path: Path, spark_master: str | None, quiet: bool) -> None:
    """Rebuild every local remote-index set from the remote manifests alone."""
    if spark_master is None:  # in-process, a progress bar per partition
        manager = build_manager(settings_for_tool(config_path))
        with partition_progress(manager, "rebuild-index", quiet) as step:
            rebuilt = manager.rebuild_index(on_partition=step)
        emit_json(rebuilt)
        return
    settings = _job_settings(config_path)
    from rlm.jobs import rebuild_index as run_rebuild

    emit_json(run_rebuild(_spark(spark_master, "rlm rebuild-index"), settings))
