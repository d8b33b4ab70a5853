"""A grouped librdkafka consumer's catch-up: through rlm's listener vs the broker's own disk.

Issue #33's "Done when": one single-node KRaft broker (rlm/testing/kafka_cluster.py) and one
``rlm run`` beside it (rlm/testing/sidecar.py: local-folder store, groups relayed to the broker,
docs/kafka-listener.md §6), in one run, on the same records:

* a confluent-kafka (librdkafka) ``Consumer`` with a fresh ``group.id`` each read subscribes to a
  ``--partitions``-partition topic of 16 KiB random records (``--mib`` MiB in all, 8 MiB segments)
  and reads every record from the start (``auto.offset.reset=earliest``), then commits;
* **broker**: the topic at the broker's bootstrap, read from its own disk (page cache warm);
* **rlm, same offsets**: the same topic through rlm's listener, before any retention. rlm answers
  offsets the broker still holds from the broker's local segments (docs/kafka-listener.md §5), so
  this is the listener's own cost on the same files;
* **rlm, remote tier**: a twin topic produced with the same records in the same order, tiered,
  then cut by the broker's retention (``retention.bytes`` = one segment per partition): rlm serves
  all but its last segments from the store (the "tiered share" below says how much). The broker
  cannot serve these offsets at all any more; its baseline is the first topic's, same records.

A first broker read, not counted, lets the cluster create ``__consumer_offsets``. Rounds
alternate the readers' order; best of ``--rounds`` kept (and the median of the totals: on a shared
host the rounds vary more than the readers differ). "s" is from ``subscribe`` to the
last record (the group join included; the broker's initial rebalance delay is 0), "read s" from
the assignment to the last record (librdkafka fetches ahead of the application, so the first
record returned says nothing). Every reader must see the same records (a hash of the values per
partition), and the commit of each read must be the broker's end offsets (asked of the broker).

    .venv/bin/python bench/kafka_group_bench.py --mib 512             # to BENCHMARKS.md
    .venv/bin/python bench/kafka_group_bench.py --mib 32 --rounds 1 --no-record
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchlib import command_line, machine, record
from rlm.testing.kafka_cluster import KafkaCluster, wait_until
from rlm.testing.sidecar import Sidecar, run_sidecar, segment_bases
from tests.live.helpers import broker_end, broker_log_start, wait_tiered

SECTION = "## Grouped librdkafka catch-up: rlm's listener vs the broker's disk"
MiB = 1024 * 1024
RECORD = 16 * 1024
SEGMENT = 8 * MiB
TOPIC, TWIN = "grouped-bench", "grouped-bench-tiered"


@dataclass
class Read:
    total_s: float  # subscribe → last record
    read_s: float  # assignment (the group joined) → last record
    digests: dict[int, str]  # per partition, the values' hash in offset order


def _produce(bootstrap: str, topics: tuple[str, ...], partitions: int, mib: int) -> None:
    """``mib`` MiB of 16 KiB records spread over the partitions, the same records to each topic."""
    from confluent_kafka import Producer

    payloads = [os.urandom(RECORD - 8) for _ in range(64)]
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 1 << 20})
    for i in range(mib * MiB // RECORD):
        value = b"%08d" % i + payloads[i % 64]
        for topic in topics:
            while True:
                try:
                    p.produce(topic, value, key=b"k%d" % i, partition=i % partitions)
                    break
                except BufferError:
                    p.poll(0.01)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(300) == 0, "records not acknowledged"


def grouped_read(bootstrap: str, topic: str, ends: dict[int, int], group: str) -> Read:
    """Subscribe with ``group``, read every partition to its end, commit; the timings and hashes."""
    from confluent_kafka import Consumer

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.max.bytes": 64 * MiB,
            "max.partition.fetch.bytes": 16 * MiB,
        }
    )
    digests = {p: hashlib.sha256() for p in ends}
    left = sum(ends.values())
    start = time.monotonic()
    assigned: list[float] = []
    try:
        # librdkafka starts fetching once the assignment is taken (after this callback returns)
        c.subscribe([topic], on_assign=lambda _c, _parts: assigned.append(time.monotonic()))
        while left:
            # never more than are left: a consume waiting for records that will not come would
            # add its whole timeout to the read
            for m in c.consume(num_messages=min(1000, left), timeout=1.0):
                assert m.error() is None, m.error()
                digests[int(m.partition() or 0)].update(m.value() or b"")
                left -= 1
        took = time.monotonic()
        committed = {tp.partition: tp.offset for tp in c.commit(asynchronous=False)}
    finally:
        c.close()
    assert committed == ends, f"{group} committed {committed}, the ends are {ends}"
    return Read(took - start, took - assigned[0], {p: d.hexdigest() for p, d in digests.items()})


def prepare(kafka: KafkaCluster, rlm: Sidecar, partitions: int, mib: int) -> tuple[dict[int, int], float]:
    """Both topics produced and tiered, the twin cut by retention: the ends, and the twin's share
    of offsets only the store holds now."""
    for topic in (TOPIC, TWIN):
        kafka.create_topic(topic, partitions=partitions, configs={"segment.bytes": SEGMENT})
    _produce(kafka.bootstrap, (TOPIC, TWIN), partitions, mib)
    ends = {p: broker_end(kafka.bootstrap, TOPIC, p) for p in range(partitions)}
    assert ends == {p: broker_end(kafka.bootstrap, TWIN, p) for p in range(partitions)}
    log_dir = kafka.nodes[0].log_dir
    for topic in (TOPIC, TWIN):
        for p in range(partitions):
            last_rolled = segment_bases(log_dir / f"{topic}-{p}")[-1] - 1
            wait_tiered(rlm.url, topic, p, last_rolled, timeout=600)
    kafka.alter_topic(TWIN, {"retention.bytes": SEGMENT})

    def cut(p: int) -> int:
        got: int = wait_until(
            lambda: broker_log_start(kafka.bootstrap, TWIN, p), timeout=120, what="retention cutting the twin"
        )
        return got

    starts = {p: cut(p) for p in range(partitions)}
    return ends, sum(starts.values()) / sum(ends.values())


def measure(
    kafka: KafkaCluster, rlm: Sidecar, ends: dict[int, int], rounds: int
) -> tuple[dict[str, Read], dict[str, float]]:
    """Per reader: the best read, and the median of its total times."""
    readers = [
        ("broker", kafka.bootstrap, TOPIC),
        ("rlm, same offsets", rlm.kafka_bootstrap, TOPIC),
        ("rlm, remote tier", rlm.kafka_bootstrap, TWIN),
    ]
    grouped_read(kafka.bootstrap, TOPIC, ends, "bench-warm-up")  # creates __consumer_offsets
    best: dict[str, Read] = {}
    totals: dict[str, list[float]] = {name: [] for name, _, _ in readers}
    seen: set[tuple[tuple[int, str], ...]] = set()
    for r in range(rounds):
        order = readers if r % 2 == 0 else readers[::-1]
        for name, bootstrap, topic in order:
            got = grouped_read(bootstrap, topic, ends, f"bench-{r}-{time.monotonic_ns()}")
            print(f"round {r}: {name}: {got.total_s:.2f} s ({got.read_s:.2f} s reading)", flush=True)
            seen.add(tuple(sorted(got.digests.items())))
            totals[name].append(got.total_s)
            if name not in best or got.total_s < best[name].total_s:
                best[name] = got
    assert len(seen) == 1, f"the readers saw different records: {seen}"
    return best, {name: statistics.median(t) for name, t in totals.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=128, help="MiB of records in each topic")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-record", action="store_true", help="do not append to BENCHMARKS.md")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="group-bench-") as tmp:
        work = Path(tmp)
        with KafkaCluster(work / "k") as kafka:
            sections = {"kafka": {"coordinator_bootstrap": [kafka.bootstrap]}}
            topics = {"include": [TOPIC, TWIN]}
            with run_sidecar(kafka.nodes[0], work / "s", work / "r", topics=topics, sections=sections) as rlm:
                ends, tiered_share = prepare(kafka, rlm, args.partitions, args.mib)
                best, medians = measure(kafka, rlm, ends, args.rounds)
    entry = _report(best, medians, ends, tiered_share, args)
    print(entry)
    if not args.no_record:
        record(SECTION, entry, intro="\n\n".join(__doc__.split("\n\n")[1:4]))


def _report(
    best: dict[str, Read],
    medians: dict[str, float],
    ends: dict[int, int],
    tiered: float,
    args: argparse.Namespace,
) -> str:
    mb = sum(ends.values()) * RECORD / 1e6
    base = best["broker"]
    lines = [
        f"### {dt.datetime.now():%Y-%m-%d %H:%M} — {args.mib} MiB over {args.partitions} partitions "
        f"({sum(ends.values())} records of 16 KiB), 8 MiB segments, best of {args.rounds}",
        "",
        f"- machine: {machine()}",
        f"- command: `{command_line()}`",
        f"- tiered share of the twin (offsets below the broker's log start): {tiered:.0%}",
        "",
        "| reader | s | read s | MB/s (read) | s / broker | read s / broker | median s | median / broker |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, got in best.items():
        lines.append(
            f"| {name} | {got.total_s:.2f} | {got.read_s:.2f} | {mb / got.read_s:.0f} | "
            f"**{got.total_s / base.total_s:.2f}** | {got.read_s / base.read_s:.2f} | "
            f"{medians[name]:.2f} | {medians[name] / medians['broker']:.2f} |"
        )
    return "\n".join([*lines, ""])


if __name__ == "__main__":
    main()
