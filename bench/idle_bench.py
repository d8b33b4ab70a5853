"""rlm idle beside a live Kafka broker: CPU and RSS of the sidecar against the broker's own (#35 item 5).

One single-node KRaft broker (rlm/testing/kafka_cluster.py, the pinned runtime of ``make kafka``)
holds ``--partitions`` partitions (topics of at most 1000 partitions each), one rolled segment per
partition (at most ``--max-rolled`` of them: Kafka keeps every segment's ``.log`` open, and the
open-file limit here is 20 000; the others hold only their active segment): one record is
produced to every partition, ``segment.ms`` passes, one more record rolls the first segment.
One ``rlm run`` beside it (rlm/testing/sidecar.py: local-folder store) at the
default pass interval (30 s) tiers every rolled segment. Then nothing is produced, and for
``--seconds`` the bench samples both processes' CPU (``/proc/<pid>/stat`` utime+stime) and RSS
(``VmRSS``). Reported: each one's CPU as a share of one core over the same window, their ratio
(rlm / broker; the target is ≤ 1), and the RSS. The daemon's GC runs every 15 minutes at the
default graces, outside that window: the bench then runs one ``rlm gc`` on the same config (a
process of its own, beside the daemon, as an operator would) and reports its CPU seconds and
that cost spread over the daemon's GC interval (``GC / 15 min``), which the "rlm CPU" column
excludes.

    .venv/bin/python bench/idle_bench.py --partitions 1000 --record
    .venv/bin/python bench/idle_bench.py --partitions 10000 --seconds 180 --record
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchlib import command_line, machine, process_cpu_seconds, record
from rlm.config import load_settings
from rlm.testing.kafka_cluster import KafkaCluster, wait_until
from rlm.testing.sidecar import run_sidecar
from rlm.tiering.expire.gc_schedule import GcSchedule

SECTION = "## Idle beside a live Kafka broker"
PER_TOPIC = 1000
#: rlm's own defaults where the test configs (rlm.testing.configs) differ: GC then runs every
#: 15 minutes, not every pass (rlm/tiering/expire/gc_schedule.py)
_DEFAULTS = {"gc_grace_ms": 3_600_000}
GC_INTERVAL_S = 900  # the daemon's GC interval at the default graces (gc_grace_ms / 4)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _topics(partitions: int) -> dict[str, int]:
    out: dict[str, int] = {}
    left, i = partitions, 0
    while left > 0:
        out[f"idle-{i}"] = min(PER_TOPIC, left)
        left -= out[f"idle-{i}"]
        i += 1
    return out


def _produce_one_each(bootstrap: str, topics: dict[str, int], limit: int | None = None) -> None:
    """One record to each partition (the first ``limit`` partitions, topic by topic, if given)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20})
    left = sum(topics.values()) if limit is None else limit
    for topic, count in topics.items():
        for part in range(min(count, left)):
            while True:
                try:
                    p.produce(topic, b"x" * 100, partition=part)
                    break
                except BufferError:
                    p.poll(0.05)
        left -= min(count, left)
        p.poll(0)
    left = p.flush(300)
    if left:
        raise RuntimeError(f"{left} records not acked")


def _tiered_partitions(url: str) -> int:
    with urllib.request.urlopen(url + "/v1/partitions", timeout=60) as resp:
        rows = json.load(resp)
    return sum(1 for r in rows if int(r["highest_tiered_offset"]) >= 0)


def run(
    partitions: int, seconds: float, interval_ms: int, max_rolled: int, gc_grace_ms: int
) -> dict[str, float]:
    topics = _topics(partitions)
    rolled = min(partitions, max_rolled)
    with tempfile.TemporaryDirectory(prefix="rlm-idle-") as tmp:
        work = Path(tmp)
        heap = "384m" if partitions <= 2000 else "1g"
        with KafkaCluster(work / "kafka", heap=heap) as kafka:
            kafka.start()
            for topic, count in topics.items():
                kafka.create_topic(topic, partitions=count, configs={"segment.ms": 2000}, timeout=300)
            _produce_one_each(kafka.bootstrap, topics)
            time.sleep(2.5)
            _produce_one_each(kafka.bootstrap, topics, rolled)  # rolls their first segments
            for topic in topics:
                kafka.alter_topic(topic, {"segment.ms": None})  # the default (7 days): no more rolls
            broker = kafka.nodes[0]
            assert broker.proc is not None
            tiering = _DEFAULTS | {"task_interval_ms": interval_ms, "gc_grace_ms": gc_grace_ms}
            with run_sidecar(broker, work / "store", work / "rlm", tiering=tiering) as rlm:
                started = time.monotonic()
                wait_until(
                    lambda: _tiered_partitions(rlm.url) >= rolled,
                    timeout=1800,
                    what=f"{rolled} partitions tiered",
                    interval=5,
                )
                tiered_s = time.monotonic() - started
                time.sleep(interval_ms / 1000 + 5)  # one more pass: the first idle one
                if gc_grace_ms < _DEFAULTS["gc_grace_ms"]:
                    _wait_clean_gc(rlm.config, time.time() * 1000, gc_grace_ms)
                pids = {"broker": broker.proc.pid, "rlm": rlm.daemon.proc.pid}
                cpu0 = {k: process_cpu_seconds(p) for k, p in pids.items()}
                t0 = time.monotonic()
                time.sleep(seconds)
                elapsed = time.monotonic() - t0
                cpu = {k: (process_cpu_seconds(p) - cpu0[k]) / elapsed for k, p in pids.items()}
                rss = {k: _rss_mib(p) for k, p in pids.items()}
                gc_cpu = _gc_cpu_seconds(rlm.config)
    return {
        "partitions": partitions,
        "rolled": rolled,
        "tiered_s": tiered_s,
        "window_s": elapsed,
        "broker_cpu": cpu["broker"],
        "rlm_cpu": cpu["rlm"],
        "ratio": cpu["rlm"] / cpu["broker"] if cpu["broker"] else float("inf"),
        "broker_rss": rss["broker"],
        "rlm_rss": rss["rlm"],
        "gc_cpu_s": gc_cpu,
    }


def _wait_clean_gc(config: Path, idle_ms: float, grace_ms: int) -> None:
    """With GC inside the window: wait until the daemon's GC that finds the idle partitions clean
    has finished — one that started once their idle marks were ``grace_ms`` old (rlm/tiering/idle.py
    ``collect_unless_idle``), so the window holds only the GCs that pass over them. Runs do not
    overlap (one at a time), so the second to finish after ``idle_ms + grace_ms`` started after it.
    At 10 000 partitions one GC that looks everywhere takes longer than its interval: a fixed wait
    put it inside the window."""
    schedule = GcSchedule.of(load_settings(config))
    first: list[int] = []

    def finished_after(ms: float) -> bool:
        last = schedule.last_ms()
        if last is None or last < ms:
            return False
        first.append(last)
        return True

    wait_until(
        lambda: finished_after(idle_ms + grace_ms), timeout=3600, what="a GC a grace after idle", interval=2
    )
    wait_until(lambda: finished_after(first[0] + 1), timeout=3600, what="the GC after it", interval=2)


def _gc_cpu_seconds(config: Path) -> float:
    """CPU seconds (user + system) of one ``rlm gc`` over the daemon's config."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(
        [sys.executable, "-m", "rlm", "gc", "--config", str(config), "--quiet"], check=True, timeout=3600
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _report(rows: list[dict[str, float]]) -> str:
    lines = [
        "| partitions | with a rolled segment | all tiered after | window | broker CPU | rlm CPU "
        "| **rlm / broker** | broker RSS | rlm RSS | one `rlm gc` | GC / 15 min |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {int(r['partitions'])} | {int(r['rolled'])} | {r['tiered_s']:.0f} s | {r['window_s']:.0f} s "
            f"| {100 * r['broker_cpu']:.2f} % | {100 * r['rlm_cpu']:.2f} % | **{r['ratio']:.2f}** "
            f"| {r['broker_rss']:.0f} MiB | {r['rlm_rss']:.0f} MiB "
            f"| {r['gc_cpu_s']:.1f} s CPU | {100 * r['gc_cpu_s'] / GC_INTERVAL_S:.2f} % |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, nargs="+", default=[1000])
    ap.add_argument("--seconds", type=float, default=180.0, help="the idle window measured")
    ap.add_argument("--interval-ms", type=int, default=30000, help="rlm's task_interval_ms (default: rlm's)")
    ap.add_argument(
        "--max-rolled",
        type=int,
        default=4000,
        help="partitions given a rolled segment (the rest only an active one): Kafka keeps every "
        "segment's .log open, and this host's open-file limit is 20 000",
    )
    ap.add_argument(
        "--gc-grace-ms",
        type=int,
        default=_DEFAULTS["gc_grace_ms"],
        help="rlm's gc_grace_ms; shorter than the default 1 h, the daemon's GC (every grace / 4) runs "
        "inside the window and its CPU is part of rlm's (the window starts once a GC that found the "
        "idle partitions clean finished)",
    )
    ap.add_argument("--record", action="store_true", help="append the result to BENCHMARKS.md")
    args = ap.parse_args()
    rows = [
        run(p, args.seconds, args.interval_ms, args.max_rolled, args.gc_grace_ms) for p in args.partitions
    ]
    table = _report(rows)
    print(table)
    if args.record:
        gc_every = max(args.interval_ms, args.gc_grace_ms / 4) / 1000
        entry = (
            f"{machine()}\n\n`{command_line()}`\n\nCPU as a share of one core over the window, "
            f"rlm at task_interval_ms = {args.interval_ms}, gc_grace_ms = {args.gc_grace_ms} (the "
            f"daemon's GC every {gc_every:.0f} s), nothing produced.\n\n{table}\n"
        )
        record(SECTION, entry)


if __name__ == "__main__":
    main()
