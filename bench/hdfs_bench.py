"""HDFS benchmark (issue #34): rlm's copy and read over WebHDFS vs bare fsspec ``WebHDFS`` writing
and reading the same files, to the same live HDFS (a MiniDFSCluster in its own JVM,
rlm/testing/hdfs_cluster.py), in the same run.

* **rlm copy**: one full pass (``RemoteLogManager.run_once``, the hdfs backend through the one
  retry seam): pin, CRC-verifying scan, the ``.log``, ``.index``, ``.timeindex``, epochs and
  entries objects, the manifest, the local index; fresh local state and a fresh root per run;
* **fsspec write**: ``WebHDFS.put_file`` of each segment's ``.log``, ``.index`` and ``.timeindex``;
* **rlm read**: every tiered ``.log`` object read whole through the backend;
* **fsspec read**: ``WebHDFS.cat_file`` of each ``.log`` fsspec wrote.

The contenders alternate (``--repeat`` rounds, best of each). MB/s = ``.log`` bytes / seconds.
Target (the issue's): rlm's copy ≥ 0.8 × fsspec's write.

    .venv/bin/python bench/hdfs_bench.py                     # 4 × 64 MiB
    .venv/bin/python bench/hdfs_bench.py --segments 2 --segment-mib 16 --no-record
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchlib import OUT, command_line, machine, record, rolled_segments
from rlm.config import load_settings
from rlm.formats import naming
from rlm.storage.registry import open_backend
from rlm.testing.configs import write_config
from rlm.testing.hdfs_cluster import HdfsCluster
from rlm.tiering.local import TieringMetrics
from rlm.tiering.manager import RemoteLogManager

SECTION = "## HDFS copy and read"
TARGET = 0.8
TOPIC = "hdfs"
INTRO = (
    "`bench/hdfs_bench.py`: one `rlm run --once`-equivalent pass over WebHDFS (hdfs backend: pin, "
    "CRC-verifying scan, upload, index objects, manifest, local index) vs fsspec `WebHDFS.put_file` "
    "of the same `.log`/`.index`/`.timeindex` files, and rlm's whole-object reads of the tiered "
    "`.log`s vs fsspec `cat_file`, to one live MiniDFSCluster (one DataNode) in its own JVM; "
    "alternating, best of each. Target: rlm's copy ≥ 0.8 × fsspec's write."
)


def reset_local(logs: Path, state: Path) -> None:
    for f in (logs / f"{TOPIC}-0").glob("*.remote*"):
        f.unlink()
    shutil.rmtree(state, ignore_errors=True)


def rlm_copy(work: Path, logs: Path, url: str, segments: int) -> tuple[float, Any]:
    """One pass into a fresh root; (seconds, the backend holding what it wrote)."""
    state = work / "state"
    reset_local(logs, state)
    options = {"url": url, "root": f"/rlm-{uuid.uuid4().hex[:8]}"}
    cfg = write_config(work / "rlm.toml", [logs], backend="hdfs", options=options, state_dir=str(state))
    backend = open_backend("hdfs", options)
    manager = RemoteLogManager(load_settings(cfg), backend, metrics=TieringMetrics())
    t = time.perf_counter()
    results = manager.run_once(gc=False)
    took = time.perf_counter() - t
    copied = sum(len(r.copied) for r in results)
    errors = [r.error for r in results if r.error]
    assert copied == segments and not errors, (copied, errors)
    return took, backend


def rlm_read(backend: Any) -> tuple[float, int]:
    keys = [o.key for o in backend.list("") if o.key.endswith(naming.LOG)]
    t = time.perf_counter()
    got = sum(len(backend.read(k)) for k in keys)
    return time.perf_counter() - t, got


def fsspec_write(fs: Any, files: list[Path], root: str) -> float:
    t = time.perf_counter()
    for log in files:
        for f in (log, log.with_suffix(naming.INDEX), log.with_suffix(naming.TIME_INDEX)):
            fs.put_file(str(f), f"{root}/{f.name}")
    return time.perf_counter() - t


def fsspec_read(fs: Any, files: list[Path], root: str) -> tuple[float, int]:
    t = time.perf_counter()
    got = sum(len(fs.cat_file(f"{root}/{f.name}")) for f in files)
    return time.perf_counter() - t, got


def measure(
    work: Path, logs: Path, files: list[Path], hdfs: HdfsCluster, args: argparse.Namespace
) -> dict[str, list[float]]:
    from fsspec.implementations.webhdfs import WebHDFS

    fs = WebHDFS(host="127.0.0.1", port=hdfs.http_port)
    size = sum(f.stat().st_size for f in files)
    fsspec_write(fs, files[:1], "/warm")  # warm-up (page cache, the JVM's code paths), not timed
    runs: dict[str, list[float]] = {"rlm copy": [], "fsspec write": [], "rlm read": [], "fsspec read": []}
    for i in range(args.repeat):
        for who in ("rlm", "fsspec") if i % 2 == 0 else ("fsspec", "rlm"):
            if who == "rlm":
                took, backend = rlm_copy(work, logs, hdfs.url, len(files))
                read, got = rlm_read(backend)
                backend.close()
                runs["rlm copy"].append(took)
            else:
                root = f"/fsspec-{uuid.uuid4().hex[:8]}"
                runs["fsspec write"].append(fsspec_write(fs, files, root))
                read, got = fsspec_read(fs, files, root)
            assert got == size, (who, got, size)
            runs[f"{who} read"].append(read)
            print(f"  round {i} {who}: read {size / read / 1e6:.0f} MB/s", flush=True)
        print(
            f"  round {i}: copy rlm {size / runs['rlm copy'][-1] / 1e6:.0f} MB/s, "
            f"fsspec {size / runs['fsspec write'][-1] / 1e6:.0f} MB/s",
            flush=True,
        )
    return runs


def table(size: int, runs: dict[str, list[float]]) -> str:
    def row(name: str, label: str) -> str:
        s = runs[name]
        return (
            f"| {label} | {min(s):.2f} | {size / min(s) / 1e6:,.1f} | {', '.join(f'{x:.2f}' for x in s)} |\n"
        )

    copy = min(runs["fsspec write"]) / min(runs["rlm copy"])
    read = min(runs["fsspec read"]) / min(runs["rlm read"])
    return (
        "| measurement | best s | MB/s | all runs (s) |\n|---|---|---|---|\n"
        + row("fsspec write", "fsspec `put_file` (.log/.index/.timeindex)")
        + row("rlm copy", "rlm pass (scan + upload + index + manifest)")
        + row("fsspec read", "fsspec `cat_file` of each .log")
        + row("rlm read", "rlm backend `read` of each tiered .log")
        + f"| **copy ratio** (rlm / fsspec, target ≥ {TARGET}) | | **{copy:.2f}** | |\n"
        + f"| **read ratio** (rlm / fsspec) | | **{read:.2f}** | |\n"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--segments", type=int, default=4)
    ap.add_argument("--segment-mib", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3, help="alternating rounds; the best of each is kept")
    ap.add_argument("--no-record", action="store_true", help="do not write BENCHMARKS.md")
    args = ap.parse_args(argv)
    work = OUT / "hdfs"
    logs = work / "logs"
    files = rolled_segments(logs, TOPIC, args.segments, args.segment_mib)
    size = sum(f.stat().st_size for f in files)
    print(f"{len(files)} segments, {size / 2**20:.0f} MiB")
    shutil.rmtree(work / "hdfs", ignore_errors=True)
    with HdfsCluster(work / "hdfs") as hdfs:
        runs = measure(work, logs, files, hdfs, args)
    result = table(size, runs)
    print(result)
    if not args.no_record:
        entry = (
            f"### {dt.date.today().isoformat()} — {args.segments} × {args.segment_mib} MiB segments\n\n"
            f"- machine: {machine()}\n"
            f"- command: `{command_line(argv)}` (MiniDFSCluster, one DataNode, in its own JVM; "
            f"alternating, best of {args.repeat})\n\n" + result
        )
        record(SECTION, entry, intro=INTRO)
        print("recorded in BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
