"""Checkpoint-cache benchmark: ``offsets_for_times`` over P partitions of one log dir, with the
read path's checkpoint cache (rlm/logdir/checkpoint_cache.py, docs/read-path.md) against the same
readers parsing the three checkpoint files on every partition's lookup (the behaviour before the
cache; each file lists every partition, so that costs O(P²)).

P partitions of a few small segments each are written with LogWriter into one log dir (local
store, nothing tiered: the lookups are local). Both variants answer the same query on the same
readers, alternating, best of ``--rounds``; their answers are checked identical. Reported: ms per
whole ``offsets_for_times`` call and the ratio uncached / cached.

    .venv/bin/python bench/checkpoint_bench.py --partitions 100 1000 --record
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.benchlib import command_line, machine, record  # noqa: E402
from rlm.logdir.checkpoint_cache import CheckpointCache  # noqa: E402
from rlm.logdir.discovery import LogDirCheckpoints, read_checkpoints  # noqa: E402

SECTION = "## Checkpoint cache: offsets-for-times over P partitions"
T0 = 1_700_000_000_000


class ParseEveryTime(CheckpointCache):
    """The baseline: every ``get`` parses the files again (no cache)."""

    def get(self, log_dir: Path) -> LogDirCheckpoints:
        return read_checkpoints(log_dir)


def generate(logs: Path, partitions: int) -> None:
    """``partitions`` partitions of topic ``bench`` (3 segments of 10 batches × 5 records), their
    checkpoint files aged so that the cache may keep them (as a broker's between flushes)."""
    from rlm.formats.records import RecordSpec
    from rlm.fsutil import SETTLE_NS
    from rlm.logdir.writer import LogWriter

    for p in range(partitions):
        with LogWriter(logs, "bench", p, segment_bytes=2_000, clock=lambda: T0) as w:
            for i in range(30):
                w.append([RecordSpec(T0 + i * 10 + r, b"k", b"v" * 40) for r in range(5)])
    old = time.time_ns() - 10 * SETTLE_NS
    for name in os.listdir(logs):
        if name.endswith("checkpoint"):
            os.utime(logs / name, ns=(old, old))


def measure(partitions: int, rounds: int, work: Path) -> tuple[float, float]:
    """Best ms per ``offsets_for_times`` call: (cached, uncached)."""
    from rlm.config import settings_from_mapping
    from rlm.storage.local import LocalBackend
    from rlm.tiering.read import TieredReaders

    logs = work / f"logs-{partitions}"
    generate(logs, partitions)
    raw = {"log": {"dirs": [str(logs)]}, "remote": {"backend": "local", "options": {"root": str(work)}}}
    readers = TieredReaders(settings_from_mapping(raw), LocalBackend(root=str(work / "store")))
    variants = {"cached": readers.resources.checkpoints, "uncached": ParseEveryTime()}
    best = {name: float("inf") for name in variants}
    answers = {}
    target = T0 + 150  # inside every partition's range: a real timestamp lookup per partition
    for _ in range(rounds):
        for name, cache in variants.items():
            readers.resources.checkpoints = cache
            start = time.perf_counter()
            rows = readers.offsets_for_times(target)
            best[name] = min(best[name], (time.perf_counter() - start) * 1000)
            answers[name] = [(r.partition, r.offset, r.timestamp) for r in rows]
    if answers["cached"] != answers["uncached"]:
        raise SystemExit("the cached and uncached answers differ")
    return best["cached"], best["uncached"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--record", action="store_true", help="append the results to BENCHMARKS.md")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlm-cpbench-") as tmp:
        for p in args.partitions:
            cached, uncached = measure(p, args.rounds, Path(tmp))
            rows.append(f"| {p} | {cached:.1f} | {uncached:.1f} | **{uncached / cached:.2f} ×** |")
            print(rows[-1], flush=True)
    table = "\n".join(
        [
            "| partitions | cached ms | uncached ms | uncached / cached |",
            "|---|---|---|---|",
            *rows,
        ]
    )
    print(table)
    if args.record:
        load = os.getloadavg()[0]
        entry = (
            f"\n### {dt.date.today().isoformat()} — best of {args.rounds}, load average {load:.1f}\n\n"
            f"- machine: {machine()}\n- command: `{command_line()}`\n\n{table}\n"
        )
        record(SECTION, entry)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
