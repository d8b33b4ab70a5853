"""Measuring reads for catchup_bench and protect_bench: the CPU seconds each process role spends
(client = this process, plus the pids in CPU_PIDS, read from /proc), one measurement's Result,
timed and parallel readers, the best-of-rounds bookkeeping, and the SeaweedFS store a run reads
from (started, its pid accounted as "store", removed afterwards).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.benchlib import run_threads

#: processes whose CPU time each measurement reports: "store" (weed), "server" (the API process)
CPU_PIDS: dict[str, int] = {}


def cpu_snapshot() -> dict[str, float]:
    """CPU seconds (user + system) so far: this process (the client side) and each of CPU_PIDS."""

    out = {"client": time.process_time()}
    for role, pid in CPU_PIDS.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[role] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return out


@dataclass
class Result:
    name: str
    seconds: float
    nbytes: int
    digest: str | None = None
    cpu: dict[str, float] | None = None  # CPU seconds by role during the measurement

    @property
    def mbps(self) -> float:
        return self.nbytes / self.seconds / 1e6


def keep_best(best: dict[str, Result], r: Result) -> None:
    """Print ``r``'s throughput; keep it in ``best`` when it is the fastest of its name so far."""
    print(f"  {r.name}: {r.mbps:.1f} MB/s ({r.seconds:.2f} s)", file=sys.stderr)
    if r.name not in best or r.seconds < best[r.name].seconds:
        best[r.name] = r


@contextmanager
def weed_store(prefix: str, bucket: str) -> Iterator[tuple[Path, Any]]:
    """A temporary directory and a SeaweedFS server in it holding ``bucket`` (its pid accounted as
    CPU role "store"): (directory, server). Both go away on exit."""
    from rlm.testing.seaweed import SeaweedServer

    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    weed = SeaweedServer(tmp / "weed").start()
    try:
        assert weed.proc is not None
        CPU_PIDS["store"] = weed.proc.pid
        weed.make_bucket(bucket)
        yield tmp, weed
    finally:
        CPU_PIDS.pop("store", None)
        weed.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def cpu_since(before: dict[str, float]) -> dict[str, float]:
    after = cpu_snapshot()
    return {role: after[role] - before[role] for role in before if role in after}


def timed(name: str, fn: Callable[[], list[bytes]]) -> Result:
    cpu = cpu_snapshot()
    t = time.perf_counter()
    chunks = fn()
    seconds = time.perf_counter() - t
    used = cpu_since(cpu)
    digest = hashlib.sha256()
    for c in chunks:
        digest.update(c)
    return Result(name, seconds, sum(len(c) for c in chunks), digest.hexdigest(), used)


def parallel(name: str, fns: list[Callable[[], list[bytes]]]) -> Result:
    """Run ``fns`` in threads at once; aggregate bytes / wall time; digest of the parts in order."""
    outs: list[list[bytes]] = [[] for _ in fns]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            outs[i] = fns[i]()
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    cpu = cpu_snapshot()
    seconds = run_threads(threads)
    used = cpu_since(cpu)
    if errors:
        raise errors[0]
    digest = hashlib.sha256()
    for chunks in outs:
        for c in chunks:
            digest.update(c)
    return Result(name, seconds, sum(len(c) for o in outs for c in o), digest.hexdigest(), used)
