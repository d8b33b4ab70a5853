"""rlm beside Kafka's own tiered storage (KIP-405's remote log manager with LocalTieredStorage).

Issue #35 item 3: two single-node KRaft brokers in one run (bench/kafka_rlm_sides.py says how each
is set up): **rlm** = a plain broker + ``rlm run`` (``local`` store, Kafka listener); **Kafka** = a
broker with ``remote.log.storage.system.enable`` and ``LocalTieredStorage`` writing into a folder.
Both tier on the same ``--task-interval-ms`` (rlm's ``task_interval_ms``, Kafka's
``remote.log.manager.task.interval.ms``), both brokers write their high-watermark checkpoint every
``--hw-checkpoint-ms`` (``replica.high.watermark.checkpoint.interval.ms``; Kafka's RLM copies a
segment once its in-memory last stable offset passes the next segment's base, rlm once the
checkpoint does or — with ``[cluster] bootstrap_servers``, set here — once the broker answers that
its high watermark does: docs/operations.md "The high watermark"; the readers' per-read check of
the broker's log start stays off, ``log_start_max_age_ms = -1``, as before). Every round produces the same
records into each broker (a confluent-kafka producer, acks=all, 16 KiB values from a fixed seed,
one partition, ``--segment-mib`` segments, ``--mb`` MB per topic), the sides' order alternating by
round (before each live phase both sides settle: ``sync``, then their processes quiet, at most
``--settle-s``, so the side measured second does not run beside the first one's writeback), and
measures:

* **Live tiering** (topic tiered from creation): the time from the producer's last ack until every
  segment rolled by then is tiered — each side's ListOffsets v9 ``-5`` (KIP-1005 latest tiered: the
  broker's highest offset in remote storage, which it raises once a copy's metadata is committed;
  rlm's highest tiered offset, on its listener) reaches the last offset before the active segment,
  polled every 50 ms — and the CPU seconds of (broker A + rlm) vs broker B from the first record
  produced to that moment (``/proc/<pid>/stat`` utime+stime, the bench's own producer not counted).
* **Copy** (a backlog): a second topic produced with tiering off (``remote.storage.enable=false``,
  which rlm follows too), then, once the broker's HW checkpoint covers every record, turned on (B:
  ``true``; A: the key deleted); from that call until everything rolled is tiered: MB/s copied and
  CPU seconds per MB on each side.
* **Bytes stored**: the files under each side's remote folder for the live topic once tiered.
* **Catch-up from the remote tier**: the live topic's local copies are cut first (A: the broker's
  ``retention.bytes`` = one segment after rlm tiered it; B: ``local.retention.bytes`` = one segment
  from creation) until the broker's log dir holds at most two segments; then each client reads
  offset 0 to the end, assigned: rlm through its listener (the store, then the broker's last local
  segments), Kafka through the broker's remote fetch (``RemoteLogReader``), same client settings on
  both (the clients' defaults but ``max.partition.fetch.bytes`` = ``--fetch-mib``), then a raw
  Fetch v12 loop on one connection asking the same bytes per request without decoding records
  (the server's time per request plus a round trip, no client decoding). Reported: MB/s (10^6
  bytes of record values over the time from ``assign`` to the last record) and the serving side's
  CPU per MB. Every decoded read of a round must see the same records (sha256 of the values).
  Before them, every reader reads the first quarter through each side, not timed: on a fresh
  broker the JVM compiles its remote read path during the first reads (a third of the broker's
  CPU went to its JIT compiler threads in the first catch-up of a trial run). Each reader's
  ceiling on this host comes last: the same reads of the backlog topic (the same records, never
  cut) from the plain broker's own disk.

Figures are medians over the rounds (min–max beside them); ratios are rlm / Kafka of the medians.

    .venv/bin/python bench/kafka_rlm_bench.py --record            # 400 MB, 2 rounds, to BENCHMARKS.md
    .venv/bin/python bench/kafka_rlm_bench.py --mb 40 --rounds 1   # a quick look
    .venv/bin/python bench/kafka_rlm_bench.py --store-fsync off    # rlm at LocalTieredStorage's durability
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchlib import command_line, machine, process_cpu_seconds, record
from bench.kafka_rlm_sides import LATEST_TIERED, READERS, RECORD, MiB, Offsets, Side, payloads, produce, sides
from rlm.testing.kafka_cluster import wait_until
from rlm.testing.sidecar import segment_bases
from tests.live.helpers import checkpointed_high_watermark

SECTION = "## Beside Kafka's own tiered storage (LocalTieredStorage)"

Figures = dict[str, list[float]]  # "<side>:<figure>" -> one value per round


#: Where ``--drop-caches`` writes (proc(5): 1 frees the clean page cache).
DROP_CACHES = "/proc/sys/vm/drop_caches"


def _wait_tiered(side: Side, topic: str, target: int, timeout: float = 300) -> float:
    """Until the side's latest tiered offset reaches ``target``: that monotonic time."""
    wire = Offsets(side.read_bootstrap)
    deadline = time.monotonic() + timeout
    try:
        while True:
            got = wire.ask(topic, LATEST_TIERED)
            now = time.monotonic()
            if got is not None and got >= target:
                return now
            if now > deadline:
                raise TimeoutError(f"{side.name}: {topic} tiered to {got}, not {target}, in {timeout:.0f} s")
            time.sleep(0.05)
    finally:
        wire.close()


def _known(side: Side, topic: str) -> None:
    """Until the side answers ListOffsets for ``topic`` (rlm: it has read the new topic)."""

    def answers() -> bool:
        wire = Offsets(side.read_bootstrap)
        try:
            return wire.ask(topic, -1) is not None
        finally:
            wire.close()

    wait_until(answers, timeout=60, what=f"{side.name} serving {topic}")


def _last_rolled(side: Side, topic: str) -> int:
    """The last offset before the active segment: what "everything rolled is tiered" must reach."""
    return segment_bases(side.log_dir / f"{topic}-0")[-1] - 1


def settle(both: list[Side], args: argparse.Namespace, out: Figures) -> None:
    """Before a side's live phase: the file system's dirty pages written (``sync``), then until the
    processes of both sides together used under ``--settle-cores`` of a core in each of two 0.5 s
    windows — the side before done with its own work, which on this 2-core host would otherwise
    run beside the next side's measurement — at most ``--settle-s`` seconds (0: no wait). Kafka's
    deferred deletions (a retained segment's files go ``file.delete.delay.ms``, 60 s, after its
    retention) are not waited for: a few unlinks, charged to the broker that makes them.
    ``--drop-caches`` (root only): after the ``sync``, the clean page cache is dropped too, so no
    side's live phase reclaims the pages the other side's writes left (Kafka's side writes its log
    and ``LocalTieredStorage``'s copies through the page cache, rlm's store writes past it)."""
    if args.settle_s <= 0:
        return
    t0 = time.monotonic()
    os.sync()
    if args.drop_caches:
        Path(DROP_CACHES).write_text("1")  # 1: the clean page cache only
    pids = [pid for side in both for pid in side.pids]
    quiet = 0
    while quiet < 2 and time.monotonic() - t0 < args.settle_s:
        cpu0 = sum(process_cpu_seconds(pid) for pid in pids)
        time.sleep(0.5)
        used = (sum(process_cpu_seconds(pid) for pid in pids) - cpu0) / 0.5
        quiet = quiet + 1 if used < args.settle_cores else 0
    out["settle s"].append(time.monotonic() - t0)


def live(side: Side, topic: str, args: argparse.Namespace, out: Figures) -> None:
    side.create(topic, tiered=True, segment=args.segment_mib * MiB)
    _known(side, topic)
    each0, t0 = side.cpu_each(), time.monotonic()
    acked = produce(side.bootstrap, topic, args.records, args.values)
    target = _last_rolled(side, topic)
    done = _wait_tiered(side, topic, target)
    each = [b - a for a, b in zip(each0, side.cpu_each(), strict=True)]
    cpu = sum(each)
    out[f"{side.name}:live broker cpu s"].append(each[0])
    out[f"{side.name}:produce MB/s"].append(args.records * RECORD / 1e6 / (acked - t0))
    out[f"{side.name}:lag s"].append(done - acked)
    out[f"{side.name}:live cpu s"].append(cpu)
    out[f"{side.name}:live cpu s/MB"].append(cpu / (args.records * RECORD / 1e6))
    out[f"{side.name}:stored MB"].append(side.stored(topic) / 1e6)
    out[f"{side.name}:tiered MB"].append((target + 1) * RECORD / 1e6)
    print(
        f"{side.name}: live {topic}: tiered {done - acked:.2f} s after the last ack, {cpu:.1f} CPU s",
        flush=True,
    )


def drain(side: Side, topic: str, args: argparse.Namespace, out: Figures) -> None:
    side.create(topic, tiered=False, segment=args.segment_mib * MiB)
    produce(side.bootstrap, topic, args.records, args.values)
    target = _last_rolled(side, topic)
    # a copy, not a wait for the broker's next HW checkpoint (rlm's signal; Kafka's RLM reads the
    # HW in memory): both brokers' checkpoint covers every record before tiering is turned on
    wait_until(
        lambda: checkpointed_high_watermark(side.log_dir, topic, 0) >= args.records,
        timeout=60,
        what=f"{side.name}: {topic} checkpointed",
    )
    cpu0, t0 = side.cpu(), time.monotonic()
    side.enable(topic)
    done = _wait_tiered(side, topic, target)
    cpu, mb = side.cpu() - cpu0, (target + 1) * RECORD / 1e6
    out[f"{side.name}:copy MB/s"].append(mb / (done - t0))
    out[f"{side.name}:copy cpu s/MB"].append(cpu / mb)
    print(f"{side.name}: copied {mb:.0f} MB of {topic} in {done - t0:.2f} s, {cpu:.1f} CPU s", flush=True)


def catch_up(order: list[Side], topic: str, local: str, args: argparse.Namespace, out: Figures) -> None:
    """Every reader from offset 0 through each side's read endpoint, after the local cut; then
    the clients' ceiling here: the same reads of ``local`` (same records, never cut) from the
    plain broker's own disk."""
    end = args.records
    seen: set[tuple[int, str]] = set()
    for side in order:
        side.cut_local(topic, args.segment_mib * MiB)
        out[f"{side.name}:remote share"].append(segment_bases(side.log_dir / f"{topic}-0")[0] / end)
    for read in READERS.values():  # not timed: the broker's JIT compiles its remote path here
        for side in order:
            read(side.read_bootstrap, topic, end // 4, args.fetch_mib * MiB)
    for client, read in READERS.items():
        for side in order:
            cpu0 = side.cpu()
            got = read(side.read_bootstrap, topic, end, args.fetch_mib * MiB)
            cpu = side.cpu() - cpu0
            assert got.count == end, f"{side.name}: {client} read {got.count} of {end}"
            if got.digest:
                seen.add((got.count, got.digest))
            mb = got.count * RECORD / 1e6
            out[f"{side.name}:{client} MB/s"].append(mb / got.seconds)
            out[f"{side.name}:{client} cpu s/MB"].append(cpu / mb)
            print(
                f"{side.name}: {client}: {mb / got.seconds:.0f} MB/s, {cpu / mb * 1000:.1f} CPU ms/MB",
                flush=True,
            )
        plain = next(side for side in order if side.rlm)
        got = read(plain.bootstrap, local, end, args.fetch_mib * MiB)
        out[f"broker disk:{client} MB/s"].append(got.count * RECORD / 1e6 / got.seconds)
        if got.digest:
            seen.add((got.count, got.digest))
    assert len(seen) == 1, f"the reads differ: {seen}"


def run(args: argparse.Namespace) -> Figures:
    out: Figures = defaultdict(list)
    broker = {"replica.high.watermark.checkpoint.interval.ms": args.hw_checkpoint_ms}
    with (
        tempfile.TemporaryDirectory(prefix="kafka-rlm-bench-") as tmp,
        sides(Path(tmp), args.task_interval_ms, broker, store_fsync=args.store_fsync == "on") as (a, b),
    ):
        for r in range(args.rounds):
            order = [a, b] if r % 2 == 0 else [b, a]
            for side in order:
                settle(order, args, out)
                live(side, f"live-{r}", args, out)
            for side in order:
                drain(side, f"backlog-{r}", args, out)
            catch_up(order, f"live-{r}", f"backlog-{r}", args, out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=400, help="MB (10^6 bytes) of 16 KiB records per topic")
    ap.add_argument("--segment-mib", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--task-interval-ms", type=int, default=1000, help="both sides' tiering pass interval")
    ap.add_argument("--hw-checkpoint-ms", type=int, default=5000, help="both brokers' HW checkpoint interval")
    ap.add_argument("--fetch-mib", type=int, default=1, help="both clients' max.partition.fetch.bytes")
    ap.add_argument(
        "--store-fsync",
        choices=("on", "off"),
        default="on",
        help="rlm's local store option fsync (default on; off: the durability of LocalTieredStorage, "
        "which copies with Files.copy and never forces a file or directory)",
    )
    ap.add_argument(
        "--settle-s",
        type=float,
        default=30,
        help="before each live phase, wait at most this long for both sides to go quiet (0: no wait)",
    )
    ap.add_argument(
        "--settle-cores", type=float, default=0.15, help="quiet: both sides' processes under this CPU share"
    )
    ap.add_argument(
        "--drop-caches",
        action="store_true",
        help="settling also drops the clean page cache (/proc/sys/vm/drop_caches; root only)",
    )
    ap.add_argument("--record", action="store_true", help="append the results to BENCHMARKS.md")
    args = ap.parse_args()
    if args.drop_caches and not os.access(DROP_CACHES, os.W_OK):
        ap.error(f"--drop-caches needs write access to {DROP_CACHES} (root)")
    args.records = args.mb * 1_000_000 // RECORD
    args.values = payloads()
    load = os.getloadavg()[0]
    out = run(args)
    entry = _report(out, args, load)
    print(entry)
    if args.record:
        intro = __doc__.split("\n\n", 1)[1].rsplit("\n\n", 1)[0]
        record(SECTION, entry, intro=intro.replace("``", "`"))  # Markdown there


ROWS = [
    ("produce MB/s", "producer, MB/s acked (context)", "{:.0f}"),
    ("lag s", "**tiered after the last ack**, s", "{:.2f}"),
    ("live cpu s", "CPU s, produce + tier (broker [+ rlm])", "{:.1f}"),
    ("live cpu s/MB", "CPU ms per MB, produce + tier", "{:.1f}"),
    ("live broker cpu s", "of it the broker process, CPU s", "{:.1f}"),
    ("copy MB/s", "**copy** of a backlog, MB/s", "{:.0f}"),
    ("copy cpu s/MB", "CPU ms per MB copied", "{:.2f}"),
    ("stored MB", "bytes stored for the live topic, MB", "{:.1f}"),
    ("remote share", "offsets read from the remote tier", "{:.0%}"),
    ("confluent-kafka MB/s", "**catch-up, confluent-kafka**, MB/s", "{:.0f}"),
    ("confluent-kafka cpu s/MB", "serving CPU ms per MB, confluent-kafka", "{:.2f}"),
    ("kafka-python MB/s", "**catch-up, kafka-python**, MB/s", "{:.0f}"),
    ("kafka-python cpu s/MB", "serving CPU ms per MB, kafka-python", "{:.2f}"),
    ("raw Fetch MB/s", "catch-up, raw Fetch loop (no decoding), MB/s", "{:.0f}"),
    ("raw Fetch cpu s/MB", "serving CPU ms per MB, raw Fetch loop", "{:.2f}"),
]
_MS = {key for key, _, _ in ROWS if key.endswith("s/MB")}


def _cell(values: list[float], fmt: str, scale: float) -> str:
    med = statistics.median(values) * scale
    if len(values) == 1 or "%" in fmt:
        return fmt.format(med)
    return f"{fmt.format(med)} ({fmt.format(min(values) * scale)}–{fmt.format(max(values) * scale)})"


def _report(out: Figures, args: argparse.Namespace, load: float) -> str:
    lines = [
        f"### {dt.datetime.now():%Y-%m-%d %H:%M} — {args.mb} MB of 16 KiB records per topic, one partition, "
        f"{args.segment_mib} MiB segments, {args.rounds} rounds",
        "",
        f"- machine: {machine()}; 1-minute load average at the start: {load:.2f}",
        f"- command: `{command_line()}`",
        f"- both sides: task interval {args.task_interval_ms} ms, HW checkpoint every "
        f"{args.hw_checkpoint_ms} ms, clients' max.partition.fetch.bytes {args.fetch_mib} MiB; rlm's "
        f"local store fsync {args.store_fsync}"
        + ("" if args.store_fsync == "on" else " (LocalTieredStorage's durability: it never forces)"),
        "",
        "| figure | rlm (plain broker + rlm run) | Kafka (broker + RLM) | rlm / Kafka |",
        "|---|---|---|---|",
    ]
    for key, label, fmt in ROWS:
        rv, kv = out.get(f"rlm:{key}"), out.get(f"kafka:{key}")
        if not rv or not kv:
            continue
        scale = 1000.0 if key in _MS else 1.0
        km = statistics.median(kv)
        ratio = statistics.median(rv) / km if km else float("nan")
        lines.append(f"| {label} | {_cell(rv, fmt, scale)} | {_cell(kv, fmt, scale)} | {ratio:.2f} |")
    ceiling = [
        f"{client} {_cell(out[f'broker disk:{client} MB/s'], '{:.0f}', 1.0)}"
        for client in READERS
        if out.get(f"broker disk:{client} MB/s")
    ]
    pairs = list(zip(out.get("rlm:live cpu s", []), out.get("kafka:live cpu s", []), strict=True))
    ratios = [(i, r / k) for i, (r, k) in enumerate(pairs) if k]
    by_round = ", ".join(f"{x:.2f}" + ("" if i % 2 else "*") for i, x in ratios)
    if ratios:  # each round's sides ran minutes apart on the same host: the paired figure
        by_round += f" (median {statistics.median(x for _, x in ratios):.2f})"
    settled = out.get("settle s")
    lines += [
        "",
        f"CPU produce + tier, rlm / Kafka by round (* rlm's side went first): {by_round}"
        + (
            "; both sides settled before each live phase (`--settle-s`"
            + (", page cache dropped" if args.drop_caches else "")
            + f"): {_cell(settled, '{:.1f}', 1.0)} s."
            if settled
            else "; no settling before the live phases."
        ),
        "",
        "Each reader's ceiling here, MB/s — the same records from the plain broker's own disk "
        "(the backlog topic, never cut; page cache warm): " + ", ".join(ceiling) + ".",
    ]
    return "\n".join([*lines, ""])


if __name__ == "__main__":
    main()
