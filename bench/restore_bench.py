"""``rlm restore`` throughput (docs/restore.md) against a plain sequential download of the same
``.log`` objects, measured in the same run on the same store.

P partitions x S rolled segments of M MiB (``benchlib.write_rolled_partition``: snappy-free v2
batches, the brokers' index files) are tiered by a manager in this process into SeaweedFS (default)
or a local folder, every local segment is deleted, then, per round: the **baseline** reads every
tiered ``segment.log`` whole, one object after another, into a file (what ``aws s3 cp`` of the
objects would do, no checks); then ``restore`` with each ``--parallelism`` writes the partition
dirs (ranged reads, CRC-32C checks, index objects, checkpoints, fsync and rename). Reported: MiB/s
of segment bytes and the ratio to the baseline of the same round.

``--latency-ms L`` adds L ms before every read of both readers (a wrapper around the backend): a
local SeaweedFS answers in well under a millisecond, a cloud store's first byte takes tens of ms,
and that is where reading several segments at once pays (``--parallelism``).

    .venv/bin/python bench/restore_bench.py                                  # SeaweedFS
    .venv/bin/python bench/restore_bench.py --latency-ms 30 --parallelism 1 4 8 --record
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import logging
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent.parent))  # after PYTHONPATH, as the other benches

from bench.benchlib import (
    command_line,
    machine,
    print_table,
    record,
    s3_server,
    template_batch,
    write_rolled_partition,
)
from rlm.config import Settings, settings_from_mapping
from rlm.formats import naming
from rlm.jobs.restore import restore
from rlm.logdir.discovery import list_segments
from rlm.storage.api import StorageBackend
from rlm.storage.registry import open_backend
from rlm.storage.wrapper import WrappingBackend
from rlm.tiering.local import TieringMetrics
from rlm.tiering.manager import RemoteLogManager

BUCKET = "rlm-restore-bench"
TOPIC = "restore.bench"


class DelayedReads(WrappingBackend):
    """Sleeps ``latency_s`` before every read (a store's time to first byte); the rest passes."""

    name = "delayed"

    def __init__(self, inner: StorageBackend, latency_s: float) -> None:
        super().__init__()
        self.inner = inner
        self.latency_s = latency_s

    def _read(self, key: str, start: int, end: int | None) -> bytes:
        time.sleep(self.latency_s)
        return super()._read(key, start, end)


def _baseline(backend: StorageBackend, keys: list[str], out: Path) -> float:
    """Seconds to read every key whole, in order, into files under ``out``."""
    out.mkdir(parents=True)
    start = time.perf_counter()
    for n, key in enumerate(keys):
        (out / f"{n}.log").write_bytes(backend.read(key))
    return time.perf_counter() - start


def _restore(settings: Settings, backend: StorageBackend, out: Path, parallelism: int) -> float:
    start = time.perf_counter()
    restore(settings, backend, TOPIC, out, parallelism=parallelism)
    return time.perf_counter() - start


def _setup(work: Path, args: argparse.Namespace, store: tuple[str, dict[str, Any]]) -> Settings:
    logs = work / "logs"
    logs.mkdir()
    template = template_batch(100, 300)
    for p in range(args.partitions):
        # write_rolled_partition writes <topic>-0: write each under its own name, then rename
        write_rolled_partition(work / f"w{p}", TOPIC, args.segments, args.segment_mib, template)
        (work / f"w{p}" / f"{TOPIC}-0").rename(logs / f"{TOPIC}-{p}")
    hw = {(TOPIC, p): list_segments(logs / f"{TOPIC}-{p}")[-1].base_offset for p in range(args.partitions)}
    (logs / "replication-offset-checkpoint").write_text(
        "0\n" + str(len(hw)) + "\n" + "".join(f"{t} {p} {o}\n" for (t, p), o in sorted(hw.items()))
    )
    name, options = store
    settings = settings_from_mapping(
        {
            "log": {"dirs": [str(logs)]},
            "remote": {"backend": name, "options": options},
            "tiering": {"gc_grace_ms": 3_600_000},
            "topics": {"follow_kafka_configs": False},
        }
    )
    results = RemoteLogManager(settings, open_backend(name, options), metrics=TieringMetrics()).run_once()
    assert all(r.error is None for r in results), [r.error for r in results]
    for p in range(args.partitions):
        for seg in list_segments(logs / f"{TOPIC}-{p}")[:-1]:
            for suffix in (naming.LOG, naming.INDEX, naming.TIME_INDEX):
                (logs / f"{TOPIC}-{p}" / naming.segment_file_name(seg.base_offset, suffix)).unlink()
    return settings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", choices=["seaweedfs", "local"], default="seaweedfs")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--segments", type=int, default=4)
    ap.add_argument("--segment-mib", type=int, default=16)
    ap.add_argument("--parallelism", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, default=0.0, help="added before every read")
    ap.add_argument("--record", action="store_true", help="append the result to BENCHMARKS.md")
    args = ap.parse_args()
    logging.getLogger("rlm").setLevel(logging.ERROR)  # benchlib's sparse indexes are rebuilt: noise
    work = Path(tempfile.mkdtemp(prefix="rlm-restore-bench-"))
    try:
        server = (
            s3_server("seaweedfs", work, BUCKET)
            if args.store == "seaweedfs"
            else contextlib.nullcontext(None)
        )
        with server as endpoint:
            store = _store(args.store, endpoint, work)
            settings = _setup(work, args, store)
            backend: StorageBackend = open_backend(*store)
            if args.latency_ms:
                backend = DelayedReads(backend, args.latency_ms / 1000)
            keys = sorted(i.key for i in backend.list("") if i.key.endswith("/segment.log"))
            total = sum(backend.head(k).size for k in keys) / 2**20
            times: dict[str, list[float]] = {"baseline": [], **{f"p{n}": [] for n in args.parallelism}}
            for r in range(args.rounds):
                times["baseline"].append(_baseline(backend, keys, work / f"base-{r}"))
                for n in args.parallelism:
                    times[f"p{n}"].append(_restore(settings, backend, work / f"out-{r}-{n}", n))
                for path in work.glob("*-*"):
                    if path.name.startswith(("base-", "out-")):
                        shutil.rmtree(path)
        _report(args, len(keys), total, times)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _store(kind: str, endpoint: Any, work: Path) -> tuple[str, dict[str, Any]]:
    if kind == "local":
        return "local", {"root": str(work / "store")}
    url, _pid = endpoint
    return "s3", {
        "bucket": BUCKET,
        "prefix": "bench",
        "endpoint_url": url,
        "path_style": True,
        "region": "us-east-1",
        "access_key_id": "any",
        "secret_access_key": "any",
    }


def _report(args: argparse.Namespace, segments: int, mib: float, times: dict[str, list[float]]) -> None:
    base = statistics.median(times["baseline"])
    lines = ["| reader | median s | MiB/s | time / baseline |", "|---|---|---|---|"]
    for name, values in times.items():
        label = (
            "baseline: sequential whole-object GETs"
            if name == "baseline"
            else f"rlm restore --parallelism {name[1:]}"
        )
        med = statistics.median(values)
        lines.append(f"| {label} | {med:.2f} | {mib / med:.0f} | {med / base:.2f} |")
    table = print_table(lines)
    if args.record:
        cmd = command_line()
        entry = (
            f"### {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} — {args.partitions} partitions x "
            f"{args.segments} segments x {args.segment_mib} MiB ({segments} objects, {mib:.0f} MiB), "
            f"{args.store}, {args.latency_ms:g} ms added per read, median of {args.rounds} rounds"
            f"\n\n- machine: {machine()}\n"
            f"- command: `{cmd}`\n\n" + table + "\n"
        )
        record(
            "## Restore",
            entry,
            intro="`bench/restore_bench.py` (docs/restore.md): `rlm restore` "
            "vs a plain sequential download of the same `.log` objects, same run, same store.",
        )


if __name__ == "__main__":
    main()
