"""Key prefix spread bench (docs/key-spread.md): what ``[remote] prefix_spread`` costs in store
requests and time, against spread 0 measured in the same run on the same log dir.

P partitions x about S segments (``rlm.cli.generate``) are tiered by a manager in this process on
a fresh store per setting (SeaweedFS by default, ``--store local`` for a folder), the store's
requests counted *below* the spread mapping (:class:`rlm.testing.counting.CountingBackend` under
:class:`rlm.storage.spread.SpreadBackend`: every physical request). Reported per setting: the
layout check when the store is opened, the first (copy) pass, an idle pass, and a whole-store
listing as ``rlm rewrap`` makes (``remote_state.store_manifest_keys``) — requests, requests per segment, and
wall time as a ratio to spread 0.

    .venv/bin/python bench/spread_bench.py                       # SeaweedFS, spreads 0 1 2
    .venv/bin/python bench/spread_bench.py --store local --partitions 200 --record
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent.parent))  # after PYTHONPATH, as the other benches

from bench.benchlib import command_line, machine, print_table, record, s3_server
from rlm.cli.generate import generate_log_dir
from rlm.config import settings_from_mapping
from rlm.storage.registry import create_backend
from rlm.storage.spread import open_spread
from rlm.testing.counting import CountingBackend
from rlm.tiering.local import TieringMetrics
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.store import store_manifest_keys

BUCKET = "rlm-spread-bench"


def _measure(counting: CountingBackend, work: Any) -> tuple[int, float]:
    before = counting.total
    start = time.perf_counter()
    work()
    return counting.total - before, time.perf_counter() - start


def run_one(spread: int, logs: Path, name: str, options: dict[str, Any]) -> dict[str, Any]:
    """Tier ``logs`` (a private copy) into the store ``options`` names with ``spread``."""
    counting = CountingBackend(create_backend(name, options))
    store: Any = None

    def open_it() -> None:
        nonlocal store
        store = open_spread(counting, spread)

    row: dict[str, Any] = {"spread": spread}
    row["open"], _ = _measure(counting, open_it)
    settings = settings_from_mapping(
        {
            "log": {"dirs": [str(logs)], "eligibility": "rolled"},
            "remote": {"backend": name, "options": options, "prefix_spread": spread},
            "tiering": {"gc_grace_ms": 3_600_000},
            "topics": {"follow_kafka_configs": False},
        }
    )
    manager = RemoteLogManager(settings, store, metrics=TieringMetrics())
    copied: list[int] = []
    row["copy"], row["copy_s"] = _measure(
        counting, lambda: copied.append(sum(len(r.copied) for r in manager.run_once()))
    )
    row["segments"] = copied[0]
    row["idle"], row["idle_s"] = _measure(counting, manager.run_once)
    found: list[int] = []
    row["list_all"], row["list_all_s"] = _measure(
        counting, lambda: found.append(sum(1 for _ in store_manifest_keys(store, None)))
    )
    assert found[0] == row["segments"], (found, row)
    store.close()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", choices=["seaweedfs", "local"], default="seaweedfs")
    ap.add_argument("--partitions", type=int, default=100)
    ap.add_argument("--records", type=int, default=400, help="records per partition")
    ap.add_argument("--segment-bytes", type=int, default=16 * 1024)
    ap.add_argument("--spreads", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--record", action="store_true", help="append the result to BENCHMARKS.md")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rlm-spread-bench-"))
    try:
        source = work / "source"
        generate_log_dir(
            source,
            [("spread.bench", args.partitions)],
            seed=1,
            records=args.records,
            segment_bytes=args.segment_bytes,
        )
        rows = []
        with _server(args.store, work) as server:
            for run, spread in enumerate(args.spreads):  # a setting may repeat (order effects)
                logs = work / f"logs-{run}"
                shutil.copytree(source, logs)
                name, options = _store(args.store, server, work, run)
                rows.append(run_one(spread, logs, name, options))
        _report(rows, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _server(kind: str, work: Path) -> Any:
    import contextlib

    return s3_server("seaweedfs", work, BUCKET) if kind == "seaweedfs" else contextlib.nullcontext()


def _store(kind: str, server: Any, work: Path, run: int) -> tuple[str, dict[str, Any]]:
    if kind == "local":
        return "local", {"root": str(work / f"store-{run}")}
    endpoint, _pid = server
    return "s3", {
        "bucket": BUCKET,
        "prefix": f"run-{run}",
        "endpoint_url": endpoint,
        "path_style": True,
        "region": "us-east-1",
        "access_key_id": "any",
        "secret_access_key": "any",
    }


def _report(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    base = next(r for r in rows if r["spread"] == 0)  # the first spread-0 run
    head = (
        "| spread | open | copy pass | per segment | idle pass | whole-store listing | "
        "copy time / spread 0 | idle time / spread 0 | listing time / spread 0 |"
    )
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        lines.append(
            f"| {r['spread']} | {r['open']} | {r['copy']} | {r['copy'] / max(1, r['segments']):.2f} | "
            f"{r['idle']} | {r['list_all']} | {r['copy_s'] / base['copy_s']:.2f} | "
            f"{r['idle_s'] / base['idle_s']:.2f} | {r['list_all_s'] / base['list_all_s']:.2f} |"
        )
    table = print_table(lines)
    if args.record:
        cmd = command_line()
        entry = (
            f"### {dt.datetime.now(dt.UTC):%Y-%m-%d} — {args.partitions} partitions, "
            f"{base['segments']} segments, {args.store}\n\n- machine: {machine()}\n"
            f"- command: `{cmd}`\n- store requests (counted below the mapping) "
            "and wall times as ratios to spread 0, same run:\n\n" + table + "\n"
        )
        record("## Key prefix spread", entry, intro="`bench/spread_bench.py` (docs/key-spread.md).")


if __name__ == "__main__":
    main()
