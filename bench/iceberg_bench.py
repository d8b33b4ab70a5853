"""Iceberg export cost (docs/iceberg.md): the Parquet export vs ``--format iceberg`` over the same
tiered segments, on the Spark and the local engine, plus the incremental runs a daily job does.

    .venv/bin/python bench/iceberg_bench.py --partitions 4 --mib 16

Generates the export bench's partitions (bench/export_bench.py: snappy ~16 KiB batches of ~300 B
values, headers on some), tiers them, then times, one after the other on one SparkSession (warmed up first):
the Parquet export (Spark), a full Iceberg export with Spark executors writing, the same on the
local engine, an incremental no-op run, and an incremental run after the high watermark moved
by ~10 % of each partition (the new records only). Prints one JSON line per step and appends a
summary to BENCHMARKS.md (``--no-record`` to skip).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import machine, record
from export_bench import START_TS, generate

from rlm.config import settings_from_mapping
from rlm.formats.checkpoint import format_offset_checkpoint, parse_offset_checkpoint
from rlm.jobs import export, plan_read, spark_session
from rlm.jobs.tables.iceberg import IcebergTarget, export_iceberg, local_engine, spark_engine
from rlm.storage.registry import open_backend
from rlm.tiering.manager import RemoteLogManager


def _step(name: str, fn: Any) -> dict[str, Any]:
    """Run one export; MB = segment bytes that export planned (read)."""
    t = time.perf_counter()
    result = fn()
    secs = time.perf_counter() - t
    records, mb = result.records, result.bytes_planned / 1e6
    row = {
        "step": name,
        "seconds": round(secs, 2),
        "records": records,
        "segment_MB": round(mb, 1),
        "records_per_s": round(records / secs),
        "MB_per_s": round(mb / secs, 1),
    }
    print(json.dumps(row), flush=True)
    return row


def _move_high_watermarks(log_dir: Path, fraction: float) -> None:
    """Hold back the last ``fraction`` of every partition (the 'new' data of the next day)."""
    path = log_dir / "replication-offset-checkpoint"
    entries = parse_offset_checkpoint(path.read_text()).entries
    path.write_text(format_offset_checkpoint({k: int(v * (1 - fraction)) for k, v in entries.items()}))
    path.with_suffix(".full").write_text(format_offset_checkpoint(entries))


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--no-record", action="store_true")
    return ap.parse_args()


def setup(work: Path, args: argparse.Namespace) -> tuple[Any, float]:
    """Generate ``--partitions`` × ``--mib`` of topic bench, tier it to a local store, then pull the
    high watermarks back by 10 % (the incremental step moves them forward again): (settings,
    MB of segments the read plan covers)."""
    log_dir, store = work / "logs", work / "store"
    settings = settings_from_mapping(
        {
            "log": {"dirs": [str(log_dir)]},
            "remote": {"backend": "local", "options": {"root": str(store)}},
            "topics": {"follow_kafka_configs": False},
            "cluster": {"leadership": "always"},
        }
    )
    log_dir.mkdir(parents=True)
    generate(log_dir, args.partitions, args.mib)
    RemoteLogManager(settings, open_backend("local", {"root": str(store)})).run_once()
    _move_high_watermarks(log_dir, 0.1)
    return settings, sum(t.size for t in plan_read(settings, ["bench"]).tasks) / 1e6


def measure(spark: Any, settings: Any, work: Path) -> list[dict[str, Any]]:
    """Parquet export vs Iceberg full (Spark and local engines), an incremental no-op, and an
    incremental run after the high watermarks move up by the held-back 10 %."""
    export(spark, settings, ["bench"], str(work / "warmup"), partitions=[0], end=START_TS + 30_000)
    target = IcebergTarget.from_settings(settings, work / "ice-spark")
    local = IcebergTarget.from_settings(settings, work / "ice-local")

    def incremental() -> Any:
        return export_iceberg(settings, ["bench"], target, spark_engine(spark), incremental=True)

    rows = [
        _step("parquet (spark)", lambda: export(spark, settings, ["bench"], str(work / "parquet"))),
        _step(
            "iceberg full (spark engine)",
            lambda: export_iceberg(settings, ["bench"], target, spark_engine(spark)),
        ),
        _step(
            "iceberg full (local engine)", lambda: export_iceberg(settings, ["bench"], local, local_engine())
        ),
        _step("iceberg incremental no-op", incremental),
    ]
    log_dir = work / "logs"
    full = log_dir / "replication-offset-checkpoint.full"
    (log_dir / "replication-offset-checkpoint").write_text(full.read_text())
    rows.append(_step("iceberg incremental +10 %", incremental))
    return rows


def report(args: argparse.Namespace, mb: float, rows: list[dict[str, Any]]) -> None:
    lines = [
        f"`python bench/iceberg_bench.py --partitions {args.partitions} --mib {args.mib}` "
        f"({args.master}; {machine()}; {mb:.1f} MB of segments):",
        "",
        "| step | seconds | records | segment MB read | records/s | MB/s |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['step']} | {r['seconds']} | {r['records']} | {r['segment_MB']} | "
        f"{r['records_per_s']} | {r['MB_per_s']} |"
        for r in rows
    ]
    record("## Iceberg export", "\n".join(lines) + "\n")


def main() -> None:
    args = parse_args()
    work = Path(tempfile.mkdtemp(prefix="rlm-iceberg-bench-"))
    settings, mb = setup(work, args)
    spark = spark_session(
        args.master, "rlm iceberg bench", progress=False, conf={"spark.ui.enabled": "false"}
    )
    rows = measure(spark, settings, work)
    spark.stop()
    print(json.dumps({"segment_MB": round(mb, 1), "master": args.master}), file=sys.stderr)
    if not args.no_record:
        report(args, mb, rows)


if __name__ == "__main__":
    main()
