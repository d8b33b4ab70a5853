"""Store requests per partition per hour, idle and under load, single broker and cluster (#35 item 4).

Two managers (rlm.tiering.manager, in this process) share one log dir of ``--partitions``
partitions, as two replicas of the same log would (byte-identical here): node 1 leads every
partition (``[cluster] leadership = "static"``), node 2 follows; each has its own
:class:`~rlm.testing.counting.CountingBackend` over one local-folder store. A simulated hour is
``3600 / --interval`` passes of each manager with the clock moved by the interval between them,
and GC every 15 minutes on the leader (the daemon's interval at the default graces) — the daemon's
schedule, without its threads. The log dir is written by
:class:`~rlm.logdir.writer.LogWriter`:

* **idle**: nothing is written for three hours (after every segment was tiered and each manager
  passed twice), each reported: the first holds what a partition costs while it goes quiet, the
  second the GC that finds it clean (only once its idle mark is ``gc_grace_ms`` old, 1 h by
  default), the third what every later idle hour costs;
* **load**: every pass one batch is appended to every partition and the high watermark raised
  (the broker's checkpoint), and every 8th pass every partition rolls a segment (a copy).

Single broker: node 1 alone, no ``[cluster]`` section. Reported: requests per partition per
hour for each role, by operation. ``--base REV`` runs the same hour on another commit (a git
worktree, this script copied in), in the same run.

    .venv/bin/python bench/request_hours.py --record
    .venv/bin/python bench/request_hours.py --base 4e053db --record
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SECTION = "## Store requests per partition-hour (cluster mode)"
TOPIC = "hours"
GC_EVERY_S = 900


class _Clock:
    def __init__(self) -> None:
        self.ms = int(time.time() * 1000)

    def __call__(self) -> int:
        return self.ms


def _writers(logs: Path, partitions: int) -> list[Any]:
    from rlm.logdir.writer import LogWriter

    return [LogWriter(logs, TOPIC, p, segment_bytes=64 * 1024) for p in range(partitions)]


def _append(writers: list[Any], *, roll: bool) -> None:
    from rlm.formats.records import RecordSpec

    for w in writers:
        w.append([RecordSpec(int(time.time() * 1000), b"k", bytes(300)) for _ in range(4)])
        if roll:
            w.roll()
        w.high_watermark = w.log_end_offset
        w.write_checkpoints()


def _manager(work: Path, node: int, partitions: int, cluster: bool, clock: _Clock) -> tuple[Any, Any]:
    from rlm.config import load_settings
    from rlm.storage.local import LocalBackend
    from rlm.testing.configs import write_config
    from rlm.testing.counting import CountingBackend
    from rlm.tiering.local.metrics import TieringMetrics
    from rlm.tiering.manager import RemoteLogManager

    cfg = write_config(
        work / f"node-{node}.toml",
        [work / "logs"],
        root=work / "store",
        gc_grace_ms=3_600_000,
        state_dir=str(work / f"state-{node}"),
    )
    if cluster:
        leaders = "".join(f'"{TOPIC}-{p}" = 1\n' for p in range(partitions))
        with cfg.open("a") as fh:
            fh.write(f'[cluster]\nnode_id = {node}\nleadership = "static"\n[cluster.leaders]\n{leaders}')
    counting = CountingBackend(LocalBackend(root=str(work / "store")))
    return RemoteLogManager(load_settings(cfg), counting, metrics=TieringMetrics(), clock_ms=clock), counting


def _hour(
    nodes: list[tuple[Any, Any]], clock: _Clock, interval_s: int, writers: list[Any] | None
) -> list[dict[str, int]]:
    """One simulated hour of passes (and GC on the first node); the requests each node made."""
    before = [collections.Counter(c.calls) for _m, c in nodes]
    passes = 3600 // interval_s
    for i in range(passes):
        if writers is not None:
            _append(writers, roll=i % 8 == 7)
            time.sleep(0.12)  # past the settle time of what was written (rlm/tiering/idle.py)
        clock.ms += interval_s * 1000
        for mgr, _c in nodes:
            results = mgr.run_once(gc=False)
            errors = [r.error for r in results if r.error]
            if errors:
                raise RuntimeError(errors[0])
        if (i * interval_s) % GC_EVERY_S == 0:
            nodes[0][0].collect_garbage()
    return [dict(collections.Counter(c.calls) - b) for (_m, c), b in zip(nodes, before, strict=True)]


def scenario(partitions: int, interval_s: int, cluster: bool) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="rlm-hours-"))
    try:
        writers = _writers(work / "logs", partitions)
        _append(writers, roll=True)
        _append(writers, roll=True)
        time.sleep(0.12)
        clock = _Clock()
        nodes = [_manager(work, 1, partitions, cluster, clock)]
        if cluster:
            nodes.append(_manager(work, 2, partitions, cluster, clock))
        for _ in range(4):  # copy, then idle: marks (and the leader's idle note) made
            clock.ms += interval_s * 1000
            for mgr, _c in nodes:
                mgr.run_once(gc=False)
            time.sleep(0.12)
        first = _hour(nodes, clock, interval_s, None)
        second = _hour(nodes, clock, interval_s, None)
        idle = _hour(nodes, clock, interval_s, None)
        load = _hour(nodes, clock, interval_s, writers)
        for w in writers:
            w.close()
        return {"first": first, "second": second, "idle": idle, "load": load}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(partitions: int, interval_s: int) -> dict[str, Any]:
    return {
        "single": scenario(partitions, interval_s, cluster=False),
        "cluster": scenario(partitions, interval_s, cluster=True),
    }


def _per(calls: dict[str, int], partitions: int) -> str:
    total = sum(calls.values()) / partitions
    ops = ", ".join(f"{op} {n / partitions:.2f}" for op, n in sorted(calls.items()) if n)
    return f"**{total:.2f}**" + (f" ({ops})" if ops else "")


def _rows(label: str, got: dict[str, Any], partitions: int) -> list[str]:
    s, c = got["single"], got["cluster"]
    nodes = [("single broker", s, 0), ("cluster leader", c, 0), ("cluster follower", c, 1)]
    return [
        f"| {label} | {name} | "
        + " | ".join(_per(g[h][i], partitions) for h in ("first", "second", "idle", "load"))
        + " |"
        for name, g, i in nodes
    ]


def _at_base(rev: str, args: argparse.Namespace) -> dict[str, Any]:
    """The same hours on commit ``rev``: a worktree of it, this script run there."""
    root = Path(__file__).resolve().parent.parent
    tree = Path(tempfile.mkdtemp(prefix="rlm-hours-base-")) / "tree"
    subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", str(tree), rev], check=True)
    try:
        for so in (root / "rlm/formats/records").glob("*.so"):
            shutil.copy(so, tree / "rlm/formats/records" / so.name)
        shutil.copy(Path(__file__), tree / "bench" / "request_hours.py")
        cmd = [
            sys.executable,
            str(tree / "bench/request_hours.py"),
            "--json",
            "--partitions",
            str(args.partitions),
            "--interval",
            str(args.interval),
        ]
        out = subprocess.run(
            cmd,
            check=True,
            capture_output=True,
            text=True,
            cwd=tree,
            env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        )
        return json.loads(out.stdout.splitlines()[-1])
    finally:
        subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(tree)], check=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", type=int, default=100)
    ap.add_argument("--interval", type=int, default=30, help="pass interval, seconds (rlm's default 30)")
    ap.add_argument("--base", help="also run the hours on this commit, in the same run")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON line only")
    ap.add_argument("--record", action="store_true", help="append the table to BENCHMARKS.md")
    args = ap.parse_args(argv)
    now = run(args.partitions, args.interval)
    if args.json:
        print(json.dumps(now))
        return 0
    from bench.benchlib import command_line, machine, record

    rows = [
        "| commit | node | 1st idle hour | 2nd idle hour | every idle hour after | an hour under load |",
        "|---|---|---|---|---|---|",
    ]
    if args.base:
        rows += _rows(f"before ({args.base})", _at_base(args.base, args), args.partitions)
    rows += _rows("now", now, args.partitions)
    table = "\n".join(rows) + "\n"
    print(table)
    if args.record:
        entry = (
            f"### {time.strftime('%Y-%m-%d')} — {args.partitions} partitions, a pass every "
            f"{args.interval} s, GC every 15 min on the leader\n\n- machine: {machine()}\n"
            f"- command: `{command_line()}`\n- requests per partition per hour, by operation\n\n{table}"
        )
        record(SECTION, entry, intro=__doc__.split("\n\n", 1)[1].split("\n\n    ")[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
