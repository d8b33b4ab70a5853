"""Do the Kafka listener's bounds (issue #31: the Fetch response bound, the long poll that re-checks
offsets, decoding and encoding in the thread pool, chunked writes) cost anything on the normal
catch-up path? Consumer catch-up through two ``rlm run`` daemons in the same run, on the same data:
this checkout's and a git worktree of ``--base`` (default ``main``: the code before the change),
the compiled extensions copied into it (docs/kafka-listener.md §9).

The data is bench/kafka_bench.py's: ``--segments`` × ``--segment-mib`` MiB of ~16 KiB batches,
tiered to a local-folder store and the local segments deleted (every byte from the remote tier),
plus the active segment in the log dir. Both daemons serve the same log dir and store (their
tiering passes are 10 minutes apart, and there is nothing new to copy). Each round reads the
whole partition through each daemon with each contender, the daemons' order alternating:

* **Fetch v12 loop** (raw bytes): one connection, Fetch with ``max_bytes`` 50 MiB and
  ``partition_max_bytes`` 1 MiB — the consumers' defaults — from the last batch's next offset;
* **confluent-kafka Consumer** (librdkafka, C): ``assign`` from offset 0, ``consume`` until the end.

The best of ``--rounds`` per daemon and contender; the ratio is new / base seconds (1.00 = the
same; below 1 the new code is faster).

    .venv/bin/python bench/kafka_bounds_bench.py                 # 4 × 16 MiB, records to BENCHMARKS.md
    .venv/bin/python bench/kafka_bounds_bench.py --segments 1 --segment-mib 4 --rounds 1 --no-record
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchlib import machine, record
from bench.kafka_bench import TOPIC, _prepare, fetch_loop
from rlm.testing.daemon import free_port, run_daemon

SECTION = "## Kafka listener bounds on the catch-up path"
REPO = Path(__file__).resolve().parent.parent


def raw_fetch_loop(port: int, end: int) -> tuple[int, str]:
    """Raw Fetch requests as a consumer sends them by default; (bytes, sha256 of them)."""
    return fetch_loop(port, end, max_bytes=50 << 20, partition_max_bytes=1 << 20)


def confluent_consumer(port: int, end: int) -> tuple[int, str]:
    """librdkafka's consumer from offset 0 to ``end``; (value bytes, record count as text)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "unused", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    n, size, deadline = 0, 0, time.monotonic() + 300
    try:
        while n < end and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, timeout=1.0):
                if msg.error() is None:
                    n += 1
                    size += len(msg.value() or b"")
    finally:
        consumer.close()
    if n != end:
        raise AssertionError(f"confluent-kafka read {n} records, the partition has {end}")
    return size, str(n)


Contender = Callable[[int, int], tuple[int, str]]
CONTENDERS: dict[str, Contender] = {
    "Fetch v12 loop (50 MiB / 1 MiB per partition), raw bytes": raw_fetch_loop,
    "confluent-kafka Consumer": confluent_consumer,
}


@contextlib.contextmanager
def base_checkout(ref: str, work: Path) -> Iterator[Path]:
    """A git worktree of ``ref`` with this checkout's compiled extensions; removed at the end."""
    path = work / "base"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), ref], check=True)
    try:
        for so in (REPO / "rlm" / "formats" / "records").glob("*.so"):
            shutil.copy2(so, path / "rlm" / "formats" / "records" / so.name)
        yield path
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], check=False)


def _config_for(config: Path, dest: Path, state: Path | None) -> tuple[Path, int, int]:
    """``config`` on fresh HTTP and Kafka ports, with ``state`` as its state dir (one daemon per
    state dir: the second gets a copy of the first's): (path, HTTP port, Kafka port)."""
    http, kafka = free_port(), free_port()
    lines = []
    for line in config.read_text().splitlines():
        if line.startswith("port = "):
            line = f"port = {http}"
        elif line.startswith("listen = "):
            line = f'listen = "127.0.0.1:{kafka}"'
        elif line == "[tiering]" and state is not None:
            line += f'\nstate_dir = "{state}"'
        lines.append(line)
    dest.write_text("\n".join(lines) + "\n")
    return dest, http, kafka


def measure(ports: dict[str, int], end: int, rounds: int) -> dict[tuple[str, str], float]:
    best: dict[tuple[str, str], float] = {}
    seen: dict[str, tuple[int, str]] = {}
    for port in ports.values():
        raw_fetch_loop(port, end)  # warm-up, unmeasured: both daemons then read from a warm page cache
    for r in range(rounds):
        order = list(ports) if r % 2 == 0 else list(ports)[::-1]
        for contender, run in CONTENDERS.items():
            for daemon in order:
                t0 = time.perf_counter()
                got = run(ports[daemon], end)
                took = time.perf_counter() - t0
                if seen.setdefault(contender, got) != got:
                    raise AssertionError(f"{contender}: the daemons served different bytes")
                best[(daemon, contender)] = min(took, best.get((daemon, contender), took))
                print(f"round {r + 1}: {daemon}: {contender}: {took:.2f} s", flush=True)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--segments", type=int, default=4)
    ap.add_argument("--segment-mib", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--base", default="main")
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rlm-kafka-bounds-bench-"))
    try:
        config, end, _ports = _prepare(work, args.segments, args.segment_mib)
        with base_checkout(args.base, work) as base, contextlib.ExitStack() as stack:
            ports = {}
            state = work / "base.rlm-state"
            shutil.copytree(work / "logs.rlm-state", state, symlinks=True)
            for name, cwd in (("new", REPO), ("base", base)):
                cfg, http, kafka = _config_for(
                    config, work / f"{name}.toml", state if name == "base" else None
                )
                log = work / f"{name}.log"
                stack.enter_context(
                    run_daemon(
                        cfg, http, log, cwd=cwd, ready=lambda log=log: "Kafka listener on" in log.read_text()
                    )
                )
                ports[name] = kafka
            best = measure(ports, end, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(best, args, end)


def report(best: dict[tuple[str, str], float], args: argparse.Namespace, end: int) -> None:
    mb = args.segments * args.segment_mib * (1 << 20) / 1e6
    lines = [
        f"| reader | {args.base} (s) | with the bounds (s) | MB/s with the bounds | new / {args.base} |",
        "|---|---|---|---|---|",
    ]
    for contender in CONTENDERS:
        old, new = best[("base", contender)], best[("new", contender)]
        lines.append(f"| {contender} | {old:.2f} | {new:.2f} | {mb / new:.0f} | **{new / old:.2f}** |")
    table = "\n".join(lines)
    print(table)
    if args.no_record:
        return
    base = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", args.base],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    cmd = (
        f"python bench/kafka_bounds_bench.py --segments {args.segments} --segment-mib {args.segment_mib} "
        f"--rounds {args.rounds} --base {args.base}"
    )
    entry = (
        f"### {dt.date.today()} — {args.segments} × {args.segment_mib} MiB remote-only ({end} records), "
        f"two `rlm run` on the same data: `{args.base}` ({base}) and this checkout\n\n"
        f"`{cmd}` ({machine()}; best of {args.rounds} rounds, the daemons' order alternating):\n\n"
        f"{table}\n"
    )
    record(
        SECTION,
        entry,
        intro="Catch-up through the Kafka listener with issue #31's bounds vs the code before them, "
        "same run, same data (bench/kafka_bounds_bench.py; docs/kafka-listener.md §9).",
    )


if __name__ == "__main__":
    main()
