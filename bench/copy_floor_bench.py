"""What rlm's copy of a broker's segments costs, against the work its checks require (#35).

A live single-node broker (``rlm.testing.kafka_cluster``, Kafka from Maven jars) takes ``--mb`` MB
of 16 KiB records into one partition of ``--segment-mib`` MiB segments (the producer of
bench/kafka_rlm_bench.py) and is stopped. Then, alternating ``--rounds`` times, each on a fresh
hard-linked copy of its log dir:

* **copy**: ``RemoteLogManager.run_once`` (``rlm run --once``) tiering every rolled segment into a
  fresh ``local`` store (fsync on, as by default): CPU seconds of this process (utime + stime,
  every thread), and the file-system calls it made per segment (``os`` and ``open`` wrapped);
* **data**: only the data work rlm's checks require, by rlm's own functions, on the same segments:
  every batch's CRC-32C verified (``checksum_segment``), the ``.log`` read and written past the
  page cache (``FileStream`` into ``copy_to_fd``) with the CRC-32C of the bytes as sent, fsync;
* **unit costs** on the store's file system right after each copy: CPU per create (an empty file
  in a new directory) and per fsync (of a new 4 KiB file).

Reported: medians over the rounds; copy − data is what rlm spends beyond moving and checking the
bytes, and the file-system calls' estimated share of it (new inodes, counted as creates of a path
that did not exist and mkdirs, at the create's cost; fsyncs at the fsync's).

    .venv/bin/python bench/copy_floor_bench.py --record
"""

from __future__ import annotations

import argparse
import builtins
import collections
import datetime as dt
import io
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchlib import command_line, machine, print_table, record
from bench.kafka_rlm_sides import RECORD, MiB, payloads, produce
from rlm.config import load_settings
from rlm.storage.direct_write import copy_to_fd
from rlm.storage.filestream import FileStream
from rlm.storage.local import LocalBackend
from rlm.testing.configs import write_config
from rlm.testing.kafka_cluster import KafkaCluster
from rlm.tiering.copy.prepare import checksum_segment
from rlm.tiering.local import TieringMetrics
from rlm.tiering.manager import RemoteLogManager

SECTION = "## Copy: rlm's CPU against its data work"
TOPIC = "floor"
CALLS = ("create", "open", "fsync", "mkdir", "link", "rename", "unlink", "rmdir")


def cpu_s() -> float:
    """This process's CPU seconds, every thread, to the microsecond (``getrusage``: a create's cost
    is tens of µs, below the clock ticks of /proc's ``process_cpu_seconds``)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@contextmanager
def counted() -> Iterator[collections.Counter[str]]:
    """Count this process's file-system calls made through ``os`` and ``open`` meanwhile."""
    seen: collections.Counter[str] = collections.Counter()
    saved = {
        n: getattr(os, n) for n in ("open", "fsync", "mkdir", "link", "rename", "replace", "unlink", "rmdir")
    }
    saved_open = builtins.open
    lock = threading.Lock()  # the copy's upload threads call in too

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kw: Any) -> Any:
            op = {"replace": "rename"}.get(name, name)
            flags = args[1] if len(args) > 1 else kw.get("flags", 0)
            if name == "open" and flags & os.O_CREAT and "dir_fd" not in kw and not os.path.lexists(args[0]):
                op = "create"  # a new inode (an append to an existing file is an open)
            with lock:
                seen[op] += 1
            return fn(*args, **kw)

        return call

    def py_open(file: Any, mode: str = "r", *args: Any, **kw: Any) -> Any:
        named = isinstance(file, str | bytes | os.PathLike)  # not a descriptor (os.fdopen)
        new = named and any(c in mode for c in "wxa") and not os.path.lexists(file)
        with lock:
            seen["create" if new else "open"] += 1
        return saved_open(file, mode, *args, **kw)

    for name, fn in saved.items():
        setattr(os, name, wrap(name, fn))
    builtins.open = io.open = py_open  # pathlib opens through io.open
    try:
        yield seen
    finally:
        for name, fn in saved.items():
            setattr(os, name, fn)
        builtins.open = io.open = saved_open


def linked_copy(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, copy_function=os.link)


def copy_run(logs: Path, work: Path) -> tuple[float, int, collections.Counter[str]]:
    """One ``run_once`` into a fresh store: (CPU s, segments copied, file-system calls)."""
    linked_copy(logs, work / "logs")
    cfg = write_config(work / "rlm.toml", [work / "logs"], root=work / "store")
    manager = RemoteLogManager(
        load_settings(cfg), LocalBackend(root=str(work / "store")), metrics=TieringMetrics()
    )
    with counted() as calls:
        before = cpu_s()
        results = manager.run_once(gc=False)
        used = cpu_s() - before
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(f"the copy failed: {errors[0]}")
    return used, sum(len(r.copied) for r in results), calls


def data_run(logs: Path, work: Path) -> float:
    """The data work alone on every rolled ``.log``: CPU s."""
    out = work / "data"
    out.mkdir()
    before = cpu_s()
    for i, log in enumerate(sorted((logs / f"{TOPIC}-0").glob("*.log"))[:-1]):
        checksum_segment(log)
        fd = os.open(out / str(i), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            with FileStream(log) as stream:
                copy_to_fd(cast(BinaryIO, stream), fd, direct=True)
                stream.crc32c()
            os.fsync(fd)
        finally:
            os.close(fd)
    return cpu_s() - before


def unit_costs(work: Path, n: int = 200) -> tuple[float, float]:
    """CPU seconds per create (empty file) and per fsync (a new 4 KiB file) under ``work``."""
    d = work / "units"
    d.mkdir()
    before = cpu_s()
    for i in range(n):
        os.close(os.open(d / f"c{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    created = (cpu_s() - before) / n
    fds = [os.open(d / f"f{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644) for i in range(n)]
    for fd in fds:
        os.write(fd, bytes(4096))
    before = cpu_s()
    for fd in fds:
        os.fsync(fd)
    synced = (cpu_s() - before) / n
    for fd in fds:
        os.close(fd)
    return created, synced


def broker_log_dir(work: Path, args: argparse.Namespace) -> Path:
    """A stopped broker's log dir holding ``args.mb`` MB in ``args.segment_mib`` MiB segments."""
    kafka = KafkaCluster(
        work / "kafka", broker_config={"replica.high.watermark.checkpoint.interval.ms": 1000}
    )
    kafka.start()
    try:
        kafka.create_topic(TOPIC, configs={"segment.bytes": args.segment_mib * MiB})
        produce(kafka.bootstrap, TOPIC, args.mb * 1_000_000 // RECORD, payloads())
        time.sleep(2.5)  # the high-watermark checkpoint covers every record
    finally:
        kafka.close()
    return kafka.nodes[0].log_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=400, help="MB produced (default 400)")
    ap.add_argument("--segment-mib", type=int, default=8, help="segment.bytes in MiB (default 8)")
    ap.add_argument("--rounds", type=int, default=7, help="copy and data runs, alternated (default 7)")
    ap.add_argument("--record", action="store_true", help="append the results to BENCHMARKS.md")
    args = ap.parse_args()
    copies, datas, creates, fsyncs = [], [], [], []
    calls: collections.Counter[str] = collections.Counter()
    with tempfile.TemporaryDirectory(prefix="copy-floor-") as tmp:
        logs = broker_log_dir(Path(tmp), args)
        segments = 0
        for r in range(args.rounds):
            work = Path(tmp) / f"round-{r}"
            work.mkdir()
            used, segments, calls = copy_run(logs, work)
            copies.append(used)
            created, synced = unit_costs(work)
            creates.append(created)
            fsyncs.append(synced)
            datas.append(data_run(logs, work))
            shutil.rmtree(work)
            print(f"round {r}: copy {used:.3f} CPU s ({segments} segments), data {datas[-1]:.3f}", flush=True)
    copy, data = statistics.median(copies), statistics.median(datas)
    per = {op: calls[op] / segments for op in CALLS}
    inodes = per["create"] + per["mkdir"]  # a directory's inode is allocated as a file's
    fs = (inodes * statistics.median(creates) + per["fsync"] * statistics.median(fsyncs)) * segments
    rows = [
        "| figure | median (min–max) |",
        "|---|---|",
        f"| copy (`run_once`), CPU s | {copy:.3f} ({min(copies):.3f}–{max(copies):.3f}) |",
        f"| data work alone, CPU s | {data:.3f} ({min(datas):.3f}–{max(datas):.3f}) |",
        f"| copy − data, CPU s | {copy - data:.3f} |",
        f"| CPU per create, µs | {statistics.median(creates) * 1e6:.0f} |",
        f"| CPU per fsync, µs | {statistics.median(fsyncs) * 1e6:.0f} |",
        f"| the copy's new inodes (files, directories) and fsyncs × their unit cost, CPU s | {fs:.3f} |",
    ]
    table = print_table(rows)
    counts = ", ".join(f"{op} {per[op]:.1f}" for op in CALLS)
    print(f"file-system calls of the copy per segment ({segments} segments): {counts}")
    if args.record:
        entry = (
            f"### {dt.datetime.now():%Y-%m-%d %H:%M} — {args.mb} MB, {args.segment_mib} MiB segments, "
            f"{args.rounds} rounds\n\n- machine: {machine()}\n- command: `{command_line()}`\n\n"
            f"{table}\n\nFile-system calls of the copy per segment ({segments} segments): {counts}.\n"
        )
        record(SECTION, entry, intro=__doc__.split("\n\n    .venv")[0].strip() if __doc__ else "")


if __name__ == "__main__":
    main()
