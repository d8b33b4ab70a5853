"""rlm beside a live Kafka broker: copy lag behind a producer, and catch-up through rlm's listener.

Issue #29's "Done when": one single-node KRaft broker (rlm/testing/kafka_cluster.py, the pinned
runtime of ``make kafka``) and one ``rlm run`` beside it (rlm/testing/sidecar.py: local-folder
store, a pass every second), in one run:

* **Copy lag** at each ``--rates`` MB/s (10^6 bytes): a confluent-kafka (librdkafka) producer writes
  16 KiB random records, uncompressed, acks=all, to a fresh topic with ``--segment-mib`` segments for
  ``--seconds``; every 0.5 s the bench samples the broker's high watermark (ListOffsets latest) and
  rlm's ``highest_tiered_offset`` (``GET /v1/partitions``). Reported: the produce rate reached, the
  tiered rate over the same window, their ratio (1.00 = rlm kept up), offsets behind the high
  watermark (median and max; the broker's active segment can never be tiered, so about one segment's
  records is the floor — the "segment" column gives it — and a rolled segment is committed for rlm
  only once the broker's ``replication-offset-checkpoint``, written every 5 s by default, passes it),
  the time from the producer's last ack
  until everything rolled was tiered, and rlm's CPU seconds per MB tiered (``/proc/<pid>/stat``
  utime+stime of the daemon over the window).
* **Catch-up**: the same librdkafka consumer reads the whole first (slowest) topic from offset 0,
  once from the broker (its own disk, page cache warm) and once through rlm's Kafka listener (the same bytes:
  rlm serves local segments from the broker's disk, the rest from the store); rounds alternate the
  order, best kept; record counts and a hash of every value must be equal. The ratio is rlm's time
  over the broker's.

    .venv/bin/python bench/live_kafka_bench.py --record        # 5, 20, 50 MB/s, to BENCHMARKS.md
    .venv/bin/python bench/live_kafka_bench.py --rates 5 --seconds 5 --rounds 1
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchlib import command_line, machine, process_cpu_seconds, record
from rlm.testing.kafka_cluster import KafkaCluster, wait_until
from rlm.testing.sidecar import Sidecar, run_sidecar

SECTION = "## Beside a live Kafka broker: copy lag and catch-up"
MiB = 1024 * 1024
RECORD = 16 * 1024


@dataclass
class LagRun:
    rate_mb: float
    produced_mb_s: float
    tiered_mb_s: float
    behind_median: int
    behind_max: int
    per_segment: int
    drain_s: float
    cpu_s_per_mb: float


def _tiered(url: str, topic: str) -> int:
    with urllib.request.urlopen(url + "/v1/partitions", timeout=10) as resp:
        rows = json.load(resp)
    row = next(r for r in rows if r["topic"] == topic and r["partition"] == 0)
    return int(row["highest_tiered_offset"])


def _high_watermark(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-hw"})
    try:
        return int(c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1])
    finally:
        c.close()


def _produce(bootstrap: str, topic: str, rate_mb: float, seconds: float, done: threading.Event) -> float:
    """Produce at about ``rate_mb`` MB/s for ``seconds``; returns the MB/s actually acked."""
    from confluent_kafka import Producer

    payloads = [os.urandom(RECORD) for _ in range(64)]
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 1 << 20})
    per_tick = max(1, int(rate_mb * 1e6 / RECORD / 20))  # 20 ticks a second
    sent = 0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        tick = time.monotonic()
        for i in range(per_tick):
            while True:
                try:
                    p.produce(topic, payloads[(sent + i) % 64], partition=0)
                    break
                except BufferError:
                    p.poll(0.01)
        sent += per_tick
        p.poll(0)
        time.sleep(max(0.0, 0.05 - (time.monotonic() - tick)))
    p.flush(120)
    elapsed = time.monotonic() - start
    done.set()
    return sent * RECORD / 1e6 / elapsed


def copy_lag(kafka: KafkaCluster, rlm: Sidecar, topic: str, rate: float, seconds: float) -> LagRun:
    kafka.create_topic(topic, configs={"segment.bytes": 4 * MiB})
    url = rlm.url
    wait_until(lambda: _tiered(url, topic) >= -1, timeout=60, what=f"rlm sees {topic}")
    pid = rlm.daemon.proc.pid
    done = threading.Event()
    result: list[float] = []
    producer = threading.Thread(
        target=lambda: result.append(_produce(kafka.bootstrap, topic, rate, seconds, done))
    )
    cpu0, t0, tiered0 = process_cpu_seconds(pid), time.monotonic(), _tiered(url, topic)
    producer.start()
    behind: list[int] = []
    while not done.is_set():
        hw = _high_watermark(kafka.bootstrap, topic)
        behind.append(max(0, hw - 1 - _tiered(url, topic)))
        time.sleep(0.5)
    producer.join()
    acked = time.monotonic()
    hw = _high_watermark(kafka.bootstrap, topic)
    per_segment = 4 * MiB // (RECORD + 80)
    # everything rolled is tiered: within one segment of the high watermark
    wait_until(lambda: _tiered(url, topic) >= hw - per_segment - 2, timeout=300, what="rlm draining")
    drained = time.monotonic()
    tiered_mb = (_tiered(url, topic) - tiered0) * RECORD / 1e6
    cpu = process_cpu_seconds(pid) - cpu0
    return LagRun(
        rate,
        result[0],
        tiered_mb / (drained - t0),
        int(statistics.median(behind)) if behind else 0,
        max(behind, default=0),
        per_segment,
        drained - acked,
        cpu / max(tiered_mb, 1e-9),
    )


def _consume_all(bootstrap: str, topic: str, end: int) -> tuple[float, int, str]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 64 * MiB,
            "max.partition.fetch.bytes": 16 * MiB,
        }
    )
    digest = hashlib.sha256()
    count = 0
    start = time.monotonic()
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        while count < end:
            for m in c.consume(num_messages=1000, timeout=1.0):
                if m.error() is None:
                    digest.update(m.value() or b"")
                    count += 1
    finally:
        c.close()
    return time.monotonic() - start, count, digest.hexdigest()


def catch_up(kafka: KafkaCluster, rlm: Sidecar, topic: str, rounds: int) -> dict[str, float]:
    end = _high_watermark(kafka.bootstrap, topic)
    best = {"broker": float("inf"), "rlm": float("inf")}
    seen: set[tuple[int, str]] = set()
    for r in range(rounds):
        order = [("broker", kafka.bootstrap), ("rlm", rlm.kafka_bootstrap)]
        for name, bootstrap in order if r % 2 == 0 else order[::-1]:
            took, count, digest = _consume_all(bootstrap, topic, end)
            seen.add((count, digest))
            best[name] = min(best[name], took)
    assert len(seen) == 1, f"broker and rlm served different records: {seen}"
    best["mb"] = end * RECORD / 1e6
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", type=float, nargs="+", default=[5, 20, 50], help="MB/s")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--record", action="store_true", help="append the results to BENCHMARKS.md")
    args = ap.parse_args()
    runs: list[LagRun] = []
    with tempfile.TemporaryDirectory(prefix="live-bench-") as tmp:
        work = Path(tmp)
        with KafkaCluster(work / "k") as kafka, run_sidecar(kafka.nodes[0], work / "s", work / "r") as rlm:
            for rate in args.rates:
                runs.append(copy_lag(kafka, rlm, f"lag-{int(rate)}", rate, args.seconds))
                print(runs[-1], flush=True)
            caught = catch_up(kafka, rlm, f"lag-{int(args.rates[0])}", args.rounds)
            print(caught, flush=True)
    entry = _report(runs, caught, args)
    print(entry)
    if args.record:
        record(SECTION, entry, intro=__doc__.split("\n\n")[1])


def _report(runs: list[LagRun], caught: dict[str, float], args: argparse.Namespace) -> str:
    lines = [
        f"### {dt.datetime.now():%Y-%m-%d %H:%M} — {args.seconds:.0f} s per rate, 16 KiB records, "
        "4 MiB segments",
        "",
        f"- machine: {machine()}",
        f"- command: `{command_line()}`",
        "",
        "| target MB/s | produced MB/s | tiered MB/s | tiered / produced | offsets behind HW median / max"
        " | records per segment | drain s | rlm CPU s per MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r.rate_mb:g} | {r.produced_mb_s:.1f} | {r.tiered_mb_s:.1f} | "
            f"**{r.tiered_mb_s / r.produced_mb_s:.2f}** | {r.behind_median} / {r.behind_max} | "
            f"{r.per_segment} | {r.drain_s:.1f} | {r.cpu_s_per_mb:.3f} |"
        )
    mb = caught["mb"]
    lines += [
        "",
        f"Catch-up of the {mb:.0f} MB topic, same librdkafka consumer, best of {args.rounds}:",
        "",
        "| reader | s | MB/s | time / broker |",
        "|---|---|---|---|",
        f"| broker (its own disk) | {caught['broker']:.2f} | {mb / caught['broker']:.0f} | 1.00 |",
        f"| rlm's Kafka listener | {caught['rlm']:.2f} | {mb / caught['rlm']:.0f} | "
        f"**{caught['rlm'] / caught['broker']:.2f}** |",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
