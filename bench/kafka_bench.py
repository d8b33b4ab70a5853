"""Kafka listener bench: consumer catch-up throughput through ``rlm run``'s Kafka listener vs the
HTTP API's ``/records/stream`` on the same tiered data, in the same run (issue #17 "Done when";
docs/kafka-listener.md).

A partition of ``--segments`` × ``--segment-mib`` MiB (~16 KiB v2 batches, Kafka's default
``batch.size``; ``bench.benchlib``) is tiered to a local-folder store by ``rlm run --once`` and its
local segments deleted, so every byte comes from the remote tier. One real ``rlm run`` serves both
the HTTP API and the Kafka listener. Each contender reads the whole partition once per round, rounds
alternating the order (``--rounds``, best kept), after one unmeasured warm-up read:

* **HTTP stream, raw** (baseline): one ``GET .../records/stream`` from offset 0 (urllib3);
* **Kafka Fetch loop, raw**: Fetch v12 requests (1 MiB, kafka-python's protocol classes) on one
  connection, each from the last batch's next offset — the listener's cost without a consumer's;
* **kafka-python KafkaConsumer**: ``assign`` + ``seek_to_beginning``, every record decoded into a
  ConsumerRecord (pure Python);
* **aiokafka consumer**: ``getmany`` until the end (its C record parser);
* **HTTP stream + kafka-python decode**: the baseline's bytes decoded with kafka-python's
  ``MemoryRecords``, the same per-record work the KafkaConsumer does, to separate transport from
  decoding.

Record counts must equal the partition's; raw contenders' bytes are hashed and must be equal.

    .venv/bin/python bench/kafka_bench.py                       # 4 × 16 MiB, records to BENCHMARKS.md
    .venv/bin/python bench/kafka_bench.py --segments 1 --segment-mib 4 --rounds 1 --no-record
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchlib import machine, record, template_batch, write_rolled_partition
from rlm.testing.daemon import free_port, run_daemon

SECTION = "## Kafka listener catch-up"
TOPIC = "kbench"
REPO = Path(__file__).resolve().parent.parent


def _rlm(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLM_")}
    return subprocess.run(
        [sys.executable, "-m", "rlm", *args], capture_output=True, text=True, check=True, env=env, cwd=REPO
    )


def _prepare(work: Path, segments: int, segment_mib: int) -> tuple[Path, int, tuple[int, int]]:
    """Tier ``segments`` rolled segments and delete their local copies: (config, log end offset,
    (HTTP port, Kafka port) the config serves on)."""
    ports = (free_port(), free_port())
    logs = work / "logs"
    end = write_rolled_partition(logs, TOPIC, segments, segment_mib, template_batch(16, 1000))
    config = work / "rlm.toml"
    config.write_text(
        "\n".join(
            [
                "[log]",
                f"dirs = {json.dumps([str(logs)])}",
                'eligibility = "rolled"',
                "[remote]",
                'backend = "local"',
                "[remote.options]",
                f"root = {json.dumps(str(work / 'store'))}",
                "[tiering]",
                "task_interval_ms = 600000",
                "[server]",
                f"port = {ports[0]}",
                "[kafka]",
                f'listen = "127.0.0.1:{ports[1]}"',
            ]
        )
        + "\n"
    )
    _rlm("run", "--config", str(config), "--once", "--quiet")
    part = logs / f"{TOPIC}-0"
    for f in part.iterdir():  # every rolled segment is tiered: delete the local copies
        if f.suffix in (".log", ".index", ".timeindex") and int(f.stem) < end:
            f.unlink()
    return config, end, ports


@dataclass(frozen=True)
class Served:
    """The daemon under test: its HTTP API's base URL and its Kafka listener's port on 127.0.0.1."""

    url: str
    port: int


# -- contenders: each returns (records, bytes, digest or "") ----------------------------------------


def http_stream(daemon: Served, end: int, decode: bool = False) -> tuple[int, int, str]:
    import urllib3

    http = urllib3.PoolManager()
    resp = http.request(
        "GET", f"{daemon.url}/v1/topics/{TOPIC}/partitions/0/records/stream?offset=0", preload_content=False
    )
    digest, size, data = hashlib.sha256(), 0, bytearray()
    for chunk in resp.stream(1 << 20):
        digest.update(chunk)
        size += len(chunk)
        if decode:
            data += chunk
    resp.release_conn()
    records = _decode_count(bytes(data)) if decode else -1
    return records, size, digest.hexdigest()


def _decode_count(data: bytes) -> int:
    from kafka.record.memory_records import MemoryRecords

    n, recs = 0, MemoryRecords(data)
    while (batch := recs.next_batch()) is not None:
        for r in batch:
            n += r.value is not None
    return n


def kafka_fetch_loop(daemon: Served, end: int) -> tuple[int, int, str]:
    size, digest = fetch_loop(daemon.port, end)
    return -1, size, digest


def fetch_loop(port: int, end: int, **request: int) -> tuple[int, str]:
    """Raw Fetch v12 requests from offset 0 to ``end`` (``request``: fetch_request's byte limits);
    (bytes read, sha256 of them). Also bench/kafka_bounds_bench.py's raw reader."""
    from kafka.protocol.consumer import FetchResponse

    from rlm.testing.kafka_wire import fetch_request

    digest, size, offset, corr = hashlib.sha256(), 0, 0, 0
    with socket.create_connection(("127.0.0.1", port)) as sock:
        reader = sock.makefile("rb")
        while offset < end:
            corr += 1
            req = fetch_request([(TOPIC, 0, offset)], **request)
            req.with_header(correlation_id=corr, client_id="bench")
            sock.sendall(bytes(req.encode(version=12, header=True, framed=True)))
            frame = reader.read(int.from_bytes(reader.read(4), "big"))
            answer = FetchResponse.decode(frame, version=12, header=True).responses[0].partitions[0]
            data = bytes(answer.records)
            digest.update(data)
            size += len(data)
            offset = _next_offset(data)
    return size, digest.hexdigest()


def _next_offset(data: bytes) -> int:
    """After the last whole batch of ``data`` (v2, big-endian: baseOffset int64 @0, batchLength
    int32 @8, lastOffsetDelta int32 @23)."""
    pos, nxt = 0, 0
    while pos + 12 <= len(data):
        length = int.from_bytes(data[pos + 8 : pos + 12], "big")
        base = int.from_bytes(data[pos : pos + 8], "big")
        nxt = base + int.from_bytes(data[pos + 23 : pos + 27], "big") + 1
        pos += 12 + length
    return nxt


def kafka_python_consumer(daemon: Served, end: int) -> tuple[int, int, str]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=f"127.0.0.1:{daemon.port}",
        group_id=None,
        enable_auto_commit=False,
        fetch_max_bytes=8 << 20,
        max_partition_fetch_bytes=4 << 20,
    )
    tp = TopicPartition(TOPIC, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning()
    n, size = 0, 0
    while consumer.position(tp) < end:
        for msgs in consumer.poll(timeout_ms=1000, max_records=100_000).values():
            n += len(msgs)
            size += sum(len(m.value) + len(m.key or b"") for m in msgs)
    consumer.close()
    return n, size, ""


def aiokafka_consumer(daemon: Served, end: int) -> tuple[int, int, str]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def run() -> tuple[int, int]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=f"127.0.0.1:{daemon.port}",
            enable_auto_commit=False,
            fetch_max_bytes=8 << 20,
            max_partition_fetch_bytes=4 << 20,
        )
        await consumer.start()
        tp = TopicPartition(TOPIC, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        n, size = 0, 0
        try:
            while await consumer.position(tp) < end:
                for msgs in (await consumer.getmany(timeout_ms=1000, max_records=100_000)).values():
                    n += len(msgs)
                    size += sum(len(m.value) + len(m.key or b"") for m in msgs)
        finally:
            await consumer.stop()
        return n, size

    n, size = asyncio.run(run())
    return n, size, ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--segments", type=int, default=4)
    ap.add_argument("--segment-mib", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rlm-kafka-bench-"))
    try:
        config, end, (http_port, kafka_port) = _prepare(work, args.segments, args.segment_mib)
        log = work / "rlm.log"

        def listening() -> bool:
            return "Kafka listener on" in log.read_text()

        with run_daemon(config, http_port, log, cwd=REPO, ready=listening) as daemon:
            rows = _measure(Served(daemon.url, kafka_port), end, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _report(rows, args, end)


Contender = Callable[[Served, int], tuple[int, int, str]]


def _measure(daemon: Served, end: int, rounds: int) -> dict[str, tuple[float, int, int, str]]:
    contenders: dict[str, Contender] = {
        "HTTP /records/stream, raw bytes": http_stream,
        "Kafka Fetch v12 loop, raw bytes": kafka_fetch_loop,
        "kafka-python KafkaConsumer (records decoded)": kafka_python_consumer,
        "aiokafka consumer (records decoded)": aiokafka_consumer,
        "HTTP stream + kafka-python decode": lambda d, e: http_stream(d, e, decode=True),
    }
    best: dict[str, tuple[float, int, int, str]] = {}
    names = list(contenders)
    http_stream(daemon, end)  # warm-up, not measured: every contender then reads from a warm cache
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            n, size, digest = contenders[name](daemon, end)
            took = time.perf_counter() - t0
            if n >= 0 and n != end:
                raise AssertionError(f"{name}: {n} records, the partition has {end}")
            if name not in best or took < best[name][0]:
                best[name] = (took, n, size, digest)
            print(f"round {r + 1}: {name}: {took:.2f} s", flush=True)
    raw = [best[n] for n in ("HTTP /records/stream, raw bytes", "Kafka Fetch v12 loop, raw bytes")]
    if raw[0][2:] != raw[1][2:]:
        raise AssertionError(f"the listener and the HTTP stream served different bytes: {raw}")
    return best


def _report(rows: dict[str, tuple[float, int, int, str]], args: argparse.Namespace, end: int) -> None:
    base_s = rows["HTTP /records/stream, raw bytes"][0]
    total_mb = rows["HTTP /records/stream, raw bytes"][2] / 1e6
    lines = ["| reader | seconds | records/s | batch MB/s | vs HTTP stream |", "|---|---|---|---|---|"]
    for name, (took, _n, _size, _d) in rows.items():
        lines.append(
            f"| {name} | {took:.2f} | {end / took:,.0f} | {total_mb / took:.1f} | **{base_s / took:.2f}x** |"
        )
    table = "\n".join(lines)
    print(table)
    if args.no_record:
        return
    cmd = "python bench/kafka_bench.py" + (
        f" --segments {args.segments} --segment-mib {args.segment_mib} --rounds {args.rounds}"
    )
    entry = (
        f"### {dt.date.today()} — {args.segments} × {args.segment_mib} MiB remote-only (~16 KiB "
        f"batches, {end} records), local-folder store, one `rlm run`\n\n"
        f"`{cmd}` ({machine()}; best of {args.rounds} rounds, same daemon, same run):\n\n"
        f"{table}\n"
    )
    record(
        SECTION,
        entry,
        intro="Consumer catch-up through `rlm run`'s Kafka listener vs the HTTP "
        "stream on the same remote-only partition (bench/kafka_bench.py; docs/kafka-listener.md). "
        '"batch MB/s" is the partition\'s record-batch bytes over the time to read them all.',
    )


if __name__ == "__main__":
    main()
