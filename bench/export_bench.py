"""Export throughput: Spark ``local[2]`` (rlm.jobs.export) vs one Python process (same plan, same
decoder, pyarrow tables, ``pq.write_table``) over the same tiered segments.

    .venv/bin/python bench/export_bench.py --partitions 8 --mib 32 --runs 2,4,8

Generates ``--partitions`` LogWriter partitions of ~``--mib`` MiB (snappy batches of 100 records,
200-600 byte values, headers on some records), tiers every rolled segment to a local store, then for
each count in ``--runs`` exports that many partitions both ways and prints records/s and MB/s (MB of
segment bytes planned). The SparkSession is started and warmed up once, outside the timings.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rlm.config import settings_from_mapping
from rlm.formats.compression import Compression
from rlm.formats.records import Header, RecordSpec
from rlm.jobs import export, plan_read, spark_session
from rlm.jobs.decode import arrow_schema, read_task_bytes, task_to_arrow
from rlm.jobs.plan import BackendSpec
from rlm.logdir.writer import LogWriter
from rlm.storage.registry import create_backend
from rlm.tiering.manager import RemoteLogManager

START_TS = 1_700_000_000_000


def generate(log_dir: Path, partitions: int, mib: int) -> None:
    for p in range(partitions):
        rng = random.Random(p)
        words = [rng.randbytes(8).hex().encode() for _ in range(500)]
        ts = START_TS
        with LogWriter(log_dir, "bench", p, segment_bytes=8 * 1024 * 1024, clock=lambda: START_TS) as w:
            while w.log_end_offset == 0 or _size(w) < mib * 1024 * 1024:
                specs = []
                for _ in range(100):
                    ts += 3
                    value = b" ".join(rng.choices(words, k=rng.randint(12, 36)))
                    headers = (Header("trace", rng.randbytes(8)),) if rng.random() < 0.3 else ()
                    specs.append(RecordSpec(ts, str(rng.randint(0, 9999)).encode(), value, headers))
                w.append(specs, compression=Compression.SNAPPY)
            w.roll()


def _size(w: LogWriter) -> int:
    return sum(f.stat().st_size for f in w.path.glob("*.log"))


def single_process(settings: object, parts: list[int], out: Path) -> int:
    plan = plan_read(settings, ["bench"], parts)  # type: ignore[arg-type]
    spec = BackendSpec.from_settings(settings)  # type: ignore[arg-type]
    records = 0
    for pp in plan.partitions:
        batches = [b for t in pp.tasks for b in task_to_arrow(t, read_task_bytes(t, spec))]
        table = pa.Table.from_batches(batches, schema=arrow_schema()).drop_columns(["topic", "partition"])
        d = out / "topic=bench" / f"partition={pp.partition}"
        d.mkdir(parents=True)
        pq.write_table(table, d / "part-0.parquet", compression="snappy")
        records += table.num_rows
    return records


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--mib", type=int, default=32)
    ap.add_argument("--runs", default="2,4,8")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="rlm-export-bench-"))
    log_dir, store = work / "logs", work / "store"
    settings = settings_from_mapping({"log": {"dirs": [str(log_dir)]},
                                      "remote": {"backend": "local", "options": {"root": str(store)}}})
    if not log_dir.exists():
        log_dir.mkdir(parents=True)
        t = time.perf_counter()
        generate(log_dir, args.partitions, args.mib)
        print(f"generated {args.partitions} x {args.mib} MiB in {time.perf_counter() - t:.1f}s",
              file=sys.stderr)
        RemoteLogManager(settings, create_backend("local", {"root": str(store)})).run_once()
    t = time.perf_counter()
    spark = spark_session(args.master, "rlm export bench", progress=False, conf={"spark.ui.enabled": "false"})
    start_s = time.perf_counter() - t
    # Warm-up (JVM JIT, Python workers): one small job outside the timings.
    export(spark, settings, ["bench"], str(work / "out-warmup"), partitions=[0], end=START_TS + 30_000,
           mode="overwrite")
    results = []
    for n in [int(x) for x in args.runs.split(",")]:
        parts = list(range(n))
        plan = plan_read(settings, ["bench"], parts)
        mb = sum(t.size for t in plan.tasks) / 1e6
        remote = sum(t.size for t in plan.tasks if t.source == "remote") / 1e6
        row: dict[str, object] = {"partitions": n, "tasks": len(plan.tasks), "segment_MB": round(mb, 1),
                                  "remote_MB": round(remote, 1)}
        for name in ("single_process", "spark"):
            out = work / f"out-{name}-{n}"
            shutil.rmtree(out, ignore_errors=True)
            t = time.perf_counter()
            if name == "spark":
                records = export(spark, settings, ["bench"], str(out), partitions=parts).records
            else:
                records = single_process(settings, parts, out)
            secs = time.perf_counter() - t
            row[name] = {"seconds": round(secs, 2), "records": records,
                         "records_per_s": round(records / secs), "MB_per_s": round(mb / secs, 1)}
        sp, one = row["spark"], row["single_process"]
        assert isinstance(sp, dict) and isinstance(one, dict) and sp["records"] == one["records"]
        row["speedup"] = round(one["seconds"] / sp["seconds"], 2)
        results.append(row)
        print(json.dumps(row), flush=True)
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    print(json.dumps({"machine": {"nproc": os.cpu_count(), "ram_gib": round(mem, 1),
                                  "python": platform.python_version()},
                      "spark_session_start_s": round(start_s, 1), "master": args.master}))
    spark.stop()


if __name__ == "__main__":
    main()
