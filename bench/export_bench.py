"""Export throughput, side by side in one run over the same tiered segments (docs/export.md):

* ``baseline`` — one plain process: aiokafka's C record parser (``aiokafka.record``,
  ``DefaultRecordBatch``) decodes the planned byte ranges, pyarrow builds the same columns,
  ``pq.write_table`` writes one snappy file per partition;
* ``rlm_1proc`` — ``rlm export --engine local --parallelism 1`` (rlm's decoder, one process:
  the "single process" figure of earlier runs);
* ``local`` — ``rlm export --engine local`` (``--parallelism`` default: the CPU count; thread
  workers with the compiled decoder), and ``local_processes``, the same on process workers;
* ``spark`` — ``rlm export --engine spark`` on ``--master`` (default ``local[2]``);
* ``cluster`` — the same on a standalone cluster: ``--spark-master spark://...``, or
  ``--cluster`` to start one here (rlm.testing.spark_cluster: master + 2 workers, 1 core each).

    .venv/bin/python bench/export_bench.py                       # 4 partitions x 64 MiB
    .venv/bin/python bench/export_bench.py --cluster --record    # + a cluster, BENCHMARKS.md

Workload (#15): ``--partitions`` LogWriter partitions of ``--mib`` MiB of segments, snappy
batches of ~16 KiB (uncompressed) of ~300 B values, a header on 30 % of records; every rolled
segment tiered to a local store, so every contender reads the same remote objects by the same
plan. Rows must be identical across contenders (count + SHA-256 over every column, sorted by
partition and offset; checked outside the timings). Each contender runs ``--repeat`` times,
alternating; the best run counts. Spark sessions start and warm up outside the timings.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from aiokafka.record.memory_records import MemoryRecords  # C implementation (aiokafka._crecords)

from bench.benchlib import command_line, machine, record
from rlm.config import Settings, settings_from_mapping
from rlm.formats.compression import Compression
from rlm.formats.records import Header, RecordSpec
from rlm.jobs import export, export_local, plan_read, spark_session
from rlm.jobs.reading.decode import arrow_schema, read_task_bytes
from rlm.jobs.reading.plan import BackendSpec
from rlm.logdir.writer import LogWriter
from rlm.storage.registry import open_backend
from rlm.tiering.manager import RemoteLogManager

START_TS = 1_700_000_000_000
TOPIC = "bench"
BATCH_BYTES = 16 * 1024  # Kafka's default batch.size


def generate(log_dir: Path, partitions: int, mib: int) -> None:
    """Snappy batches of ~16 KiB of ~300 B values (words, so they compress like text)."""
    for p in range(partitions):
        rng = random.Random(p)
        words = [rng.randbytes(rng.randint(3, 8)).hex().encode() for _ in range(2000)]
        ts = START_TS
        with LogWriter(log_dir, TOPIC, p, segment_bytes=16 * 1024 * 1024, clock=lambda: START_TS) as w:
            while w.log_end_offset == 0 or _size(w) < mib * 1024 * 1024:
                specs, size = [], 0
                while size < BATCH_BYTES - 400:
                    ts += 3
                    value = b" ".join(rng.choices(words, k=rng.randint(18, 40)))
                    headers = (Header("trace", rng.randbytes(16)),) if rng.random() < 0.3 else ()
                    key = str(rng.randint(0, 99999)).encode()
                    specs.append(RecordSpec(ts, key, value, headers))
                    size += len(value) + len(key) + 12 + (30 if headers else 0)
                w.append(specs, compression=Compression.SNAPPY)
            w.roll()


def _size(w: LogWriter) -> int:
    return sum(f.stat().st_size for f in w.path.glob("*.log"))


def baseline(settings: Settings, parts: list[int], out: Path) -> int:
    """aiokafka's C parser + pyarrow + pq.write_table, one process, the same plan."""
    plan = plan_read(settings, [TOPIC], parts)
    spec = BackendSpec.from_settings(settings)
    schema = arrow_schema()
    records = 0
    for pp in plan.partitions:
        keys: list[Any] = []
        values: list[Any] = []
        offsets: list[int] = []
        stamps: list[int] = []
        types: list[int] = []
        headers: list[Any] = []
        for task in pp.tasks:
            batches = MemoryRecords(read_task_bytes(task, spec))
            lo, hi = task.min_offset, task.max_offset
            while (batch := batches.next_batch()) is not None:
                if not batch.validate_crc():
                    raise RuntimeError(f"CRC mismatch at offset {batch.base_offset}")
                if batch.is_control_batch:
                    continue
                ts_type = batch.timestamp_type
                for r in batch:
                    if lo <= r.offset <= hi:
                        keys.append(r.key)
                        values.append(r.value)
                        offsets.append(r.offset)
                        stamps.append(r.timestamp * 1000)
                        types.append(ts_type)
                        headers.append(r.headers or None)
        table = pa.table(
            {
                "key": pa.array(keys, pa.binary()),
                "value": pa.array(values, pa.binary()),
                "offset": pa.array(offsets, pa.int64()),
                "timestamp": pa.array(stamps, pa.int64()).cast(schema.field("timestamp").type),
                "timestampType": pa.array(types, pa.int32()),
                "headers": pa.array(headers, schema.field("headers").type),
            }
        )
        d = out / f"topic={TOPIC}" / f"partition={pp.partition}"
        d.mkdir(parents=True)
        pq.write_table(table, d / "part-0.parquet", compression="snappy")
        records += table.num_rows
    return records


def digest(out: Path) -> tuple[int, str]:
    """(rows, SHA-256 of every column) of an export dir, rows sorted by (partition, offset)."""
    h = hashlib.sha256()
    rows = 0
    for d in sorted(out.glob(f"topic={TOPIC}/partition=*"), key=lambda p: int(p.name.split("=")[1])):
        table = pq.read_table(d).sort_by("offset")
        rows += table.num_rows
        h.update(d.name.encode())
        for name in ("offset", "timestamp", "timestampType", "key", "value", "headers"):
            for chunk in table.column(name).chunks:
                h.update(repr(chunk.to_pylist()).encode())
    return rows, h.hexdigest()


def _spark_runs(
    results: dict[str, Any],
    name: str,
    master: str,
    conf: dict[str, str] | None,
    settings: Settings,
    work: Path,
    parts: list[int],
    repeat: int,
) -> None:
    """The Spark contender on ``master``: session start and a warm-up job (JIT, Python workers)
    outside the timings. (Its CPU is in the JVM and Python workers: not counted.)"""
    spark = spark_session(
        master,
        "rlm export bench",
        progress=False,
        conf={"spark.ui.enabled": "false", "spark.driver.memory": "2g", **(conf or {})},
    )
    try:
        export(
            spark,
            settings,
            [TOPIC],
            str(work / "out-warmup"),
            partitions=[0],
            end=START_TS + 30_000,
            mode="overwrite",
        )
        more = run_contenders(
            settings,
            work,
            parts,
            repeat,
            {name: lambda s, p, o: export(spark, s, [TOPIC], str(o), partitions=p).records},
        )
    finally:
        spark.stop()
    results["best"].update(more["best"])
    results["digests"].update(more["digests"])


def cpu_seconds() -> float:
    """User + system CPU of this process and its reaped children (the local engine's process
    workers are reaped when its pool shuts down; Spark's JVM and Python workers are not)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def run_contenders(
    settings: Settings,
    work: Path,
    parts: list[int],
    repeat: int,
    contenders: dict[str, Callable[[Settings, list[int], Path], int]],
) -> dict[str, Any]:
    """Best-of-``repeat`` seconds per contender (alternating), the CPU seconds of that run, and
    each one's row digest."""
    best: dict[str, float] = {}
    cpu: dict[str, float] = {}
    digests: dict[str, tuple[int, str]] = {}
    for _ in range(repeat):
        for name, run in contenders.items():
            out = work / f"out-{name}"
            shutil.rmtree(out, ignore_errors=True)
            t, c = time.perf_counter(), cpu_seconds()
            records = run(settings, parts, out)
            secs, used = time.perf_counter() - t, cpu_seconds() - c
            if secs < best.get(name, secs + 1):
                best[name], cpu[name] = secs, used
            print(f"{name}: {records} records in {secs:.2f}s ({used:.2f} CPU s)", file=sys.stderr, flush=True)
            if name not in digests:
                digests[name] = digest(out)
                assert digests[name][0] == records, (name, digests[name], records)
    return {"best": best, "cpu": cpu, "digests": digests}


def _cluster_master(args: argparse.Namespace, work: Path) -> tuple[str | None, Any]:
    """The standalone cluster's master URL: ``--spark-master``, or a 2-worker cluster started
    here (``--cluster``; rlm.testing.spark_cluster, 1 core + 1 GiB per worker)."""
    if args.spark_master:
        return args.spark_master, None
    if not args.cluster:
        return None, None
    import rlm
    from rlm.testing.spark_cluster import SparkCluster

    # The executors import rlm from where this run does ("rlm installed on the executors").
    source = str(Path(rlm.__file__).resolve().parent.parent)
    cluster = SparkCluster(work / "cluster", workers=2, executor_env={"PYTHONPATH": source}).start()
    return cluster.master_url, cluster


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--mib", type=int, default=64, help="segment MiB per partition")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--master", default="local[2]", help="the Spark contender's master")
    ap.add_argument("--spark-master", default=None, help="also run on this standalone cluster")
    ap.add_argument("--cluster", action="store_true", help="start a 2-worker standalone cluster")
    ap.add_argument("--no-spark", action="store_true", help="baseline and local engine only")
    ap.add_argument("--workdir", default=None, help="reuse generated data (kept between runs)")
    ap.add_argument("--record", action="store_true", help="append the result to BENCHMARKS.md")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="rlm-export-bench-"))
    log_dir, store = work / "logs", work / "store"
    settings = settings_from_mapping(
        {
            "log": {"dirs": [str(log_dir)]},
            "remote": {"backend": "local", "options": {"root": str(store)}},
            "cluster": {"leadership": "always"},
        }
    )
    if not log_dir.exists():
        log_dir.mkdir(parents=True)
        t = time.perf_counter()
        generate(log_dir, args.partitions, args.mib)
        print(
            f"generated {args.partitions} x {args.mib} MiB in {time.perf_counter() - t:.1f}s", file=sys.stderr
        )
        RemoteLogManager(settings, open_backend("local", {"root": str(store)})).run_once()
    parts = list(range(args.partitions))
    plan = plan_read(settings, [TOPIC], parts)
    assert {t.source for t in plan.tasks} == {"remote"}, "every planned byte is tiered"
    mb = sum(t.size for t in plan.tasks) / 1e6
    contenders: dict[str, Callable[[Settings, list[int], Path], int]] = {
        "baseline": baseline,
        "rlm_1proc": lambda s, p, o: export_local(s, [TOPIC], o, partitions=p, parallelism=1).records,
        "local": lambda s, p, o: export_local(s, [TOPIC], o, partitions=p).records,
        # the same on process workers (the default, with the compiled decoder: threads)
        "local_processes": lambda s, p, o: export_local(s, [TOPIC], o, partitions=p, pool="process").records,
    }
    results = run_contenders(settings, work, parts, args.repeat, contenders)
    if not args.no_spark:
        _spark_runs(results, "spark", args.master, None, settings, work, parts, args.repeat)
    master, cluster = _cluster_master(args, work)
    try:
        if master is not None:
            _spark_runs(
                results,
                "cluster",
                master,
                {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"},
                settings,
                work,
                parts,
                args.repeat,
            )
    finally:
        if cluster is not None:
            cluster.stop()
    report(results, mb, len(plan.tasks), args)


def report(results: dict[str, Any], mb: float, tasks: int, args: argparse.Namespace) -> None:
    best, digests, cpu = results["best"], results["digests"], results["cpu"]
    identical = len(set(digests.values())) == 1
    rows = next(iter(digests.values()))[0]
    base = best["baseline"]
    table = [
        "| contender | seconds | records/s | MB/s | vs baseline | CPU s (this process + workers) |",
        "|---|---|---|---|---|---|",
    ]
    for name, secs in best.items():
        used = f"{cpu[name]:.2f}" if name in cpu else "n/a (JVM)"
        table.append(
            f"| {name} | {secs:.2f} | {rows / secs:,.0f} | {mb / secs:.1f} | **{base / secs:.2f}** | {used} |"
        )
    doc = {
        "partitions": args.partitions,
        "segment_MB": round(mb, 1),
        "tasks": tasks,
        "records": rows,
        "rows_identical": identical,
        "digest": next(iter(digests.values()))[1][:16],
        "seconds": {k: round(v, 2) for k, v in best.items()},
        "vs_baseline": {k: round(base / v, 2) for k, v in best.items()},
        "cpu_seconds": {k: round(v, 2) for k, v in cpu.items()},
    }
    if "spark" in best:
        doc["spark_vs_rlm_1proc"] = round(best["rlm_1proc"] / best["spark"], 2)
    doc["load_average"] = [round(x, 1) for x in os.getloadavg()]  # the host is shared
    print(json.dumps(doc))
    print("\n".join(table))
    if not identical:
        sys.exit(f"rows differ between contenders: {digests}")
    if args.record:
        entry = (
            f"### {time.strftime('%Y-%m-%d')} — {args.partitions} partitions x {args.mib} MiB, "
            f"{rows:,} records, {tasks} tasks\n\n- machine: {machine()}\n- command: "
            f"`{command_line()}`\n"
            f"- rows identical across contenders: {identical} (sha256 {doc['digest']}…); "
            f"load average after the run: {doc['load_average']}\n\n" + "\n".join(table) + "\n"
        )
        record("## Export: engines vs the aiokafka-C + pyarrow baseline (`bench/export_bench.py`)", entry)


if __name__ == "__main__":
    main()
