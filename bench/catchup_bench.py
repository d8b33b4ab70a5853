"""Catch-up bench: a consumer reading the remote tier through rlm's HTTP API vs plain boto3 ranged
GETs of the same objects, on a real S3 server (SeaweedFS's ``weed server``, started here), in the
same run (issue #14 "Done when"; docs/streaming.md).

A partition of ``--segments`` × ``--segment-mib`` MiB (~16 KiB v2 batches, Kafka's default
``batch.size``, written fast by ``bench.benchlib``) is tiered with the s3 backend by
``RemoteLogManager`` and its local segments deleted, so every byte is served from the store. Then,
each contender reading the whole log once, rounds alternating (``--rounds``, best kept):

* **boto3** (baseline): ``get_object`` with ``Range`` of ``--range-mib`` MiB over each segment's
  ``.log`` object, in offset order, on one long-lived client;
* **/records**: ``GET .../records?format=raw&max_bytes=1MiB`` from offset 0, each request from the
  previous ``X-Rlm-Next-Offset``, until the visible end (urllib3 — boto3's own HTTP client, so the
  comparison is of the servers, not of Python HTTP clients);
* **stream**: one ``GET .../records/stream`` (urllib3);
* **RlmClient.iter_batches**: the product's client (httpx, batches parsed);
* **h11/asyncio** rows: /records and the stream with uvicorn's pure-Python stack, for the
  httptools/uvloop choice;
* **4 readers**: four threads, each reading a quarter of the segments (boto3: its objects; API:
  /records or one stream over the same offsets), aggregate MB/s;
* **hot keys**: 32 remote offsets looked up round robin at ``--hot-rate`` lookups/s (in-process
  ``PartitionReader`` sharing the server's cache) with a cache of ``--cache-mib`` while one stream
  reads the whole log through the same (in-process) server; hit rate = 1 − store reads made by the
  hot thread / its lookups. Paced, so a hot key is touched every ~0.6 s while the catch-up reads
  far more than the cache in that time: plain LRU would lose every hot key.

Every API contender starts on a fresh server process (empty range cache; its own GIL, as the
daemon has: ``serve`` builds the app, readers and ``ApiServer`` exactly as ``rlm run`` does).
Bytes are hashed (SHA-256) after the clock stops and must equal the baseline's. CPU seconds of the
client side (this process), the API server process and the store (weed) are reported per MB: the
API path moves every byte through one more process than the baseline does. Targets: /records
and stream ≥ 0.9 × boto3; 4 API readers ≥ 0.9 × 4 boto3 readers; hot-key hit rate ≥ 0.9.

    .venv/bin/python bench/catchup_bench.py                  # 8 × 32 MiB, records to BENCHMARKS.md
    .venv/bin/python bench/catchup_bench.py --segments 4 --segment-mib 16 --rounds 1 --no-record
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import random
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchlib import (
    command_line,
    machine,
    print_table,
    record,
    template_batch,
    write_rolled_partition,
)
from bench.readmeasure import (
    CPU_PIDS,
    Result,
    keep_best,
    parallel,
    timed,
    weed_store,
)

SECTION = "## Catch-up reads"
TOPIC, BUCKET = "catchup", "rlm-catchup"
MIB = 1 << 20


@dataclass
class Rig:
    raw: dict[str, Any]  # the settings as a mapping (handed to the server process)
    settings: Any
    backend: Any
    s3: Any
    objects: list[tuple[str, int, int]]  # (key, size, base offset) in offset order
    end_offset: int


def generate(logs: Path, segments: int, segment_mib: int) -> int:
    """``segments`` rolled segments of ~16 KiB batches plus the empty active one; returns its base."""
    # ~16 KiB batches: Kafka's default batch.size
    return write_rolled_partition(logs, TOPIC, segments, segment_mib, template_batch(16, 1000))


def tier(tmp: Path, weed: Any, args: argparse.Namespace) -> Rig:
    from rlm.config import settings_from_mapping
    from rlm.formats import naming
    from rlm.logdir.discovery import list_segments
    from rlm.storage.registry import open_backend
    from rlm.tiering.manager import RemoteLogManager

    logs = tmp / "logs"
    end = generate(logs, args.segments, args.segment_mib)
    options = weed.options(BUCKET, prefix="bench")
    raw = {
        "log": {"dirs": [str(logs)], "eligibility": "rolled"},
        "remote": {"backend": "s3", "options": options},
        "tiering": {"state_dir": str(tmp / "state"), "gc_grace_ms": 0},
    }
    settings = settings_from_mapping(raw)
    backend = open_backend("s3", options)
    t = time.perf_counter()
    results = RemoteLogManager(settings, backend).run_once()
    assert all(r.error is None for r in results), results
    print(
        f"tiered {args.segments} × {args.segment_mib} MiB in {time.perf_counter() - t:.1f} s", file=sys.stderr
    )
    part = logs / f"{TOPIC}-0"
    for seg in list_segments(part)[:-1]:  # every byte now comes from the store
        for suffix in (naming.LOG, naming.INDEX, naming.TIME_INDEX):
            (part / naming.segment_file_name(seg.base_offset, suffix)).unlink()
    s3 = weed.client(max_pool_connections=16)
    objects = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="bench/"):
        for obj in page.get("Contents", []):
            if obj["Key"].endswith("/segment.log"):
                base = int(obj["Key"].split("/data/")[1].split("-")[0])
                objects.append((obj["Key"], obj["Size"], base))
    objects.sort(key=lambda o: o[2])
    assert len(objects) == args.segments, objects
    return Rig(raw, settings, backend, s3, objects, end)


def daemon_api(raw: dict[str, Any], backend: Any) -> Any:
    """The daemon's HTTP app and readers over ``backend`` as ``rlm run`` wires them
    (rlm.cli.wiring.build_api over a RemoteLogManager of the settings ``raw``): a DaemonApi."""
    from rlm.cli.wiring import build_api
    from rlm.config import settings_from_mapping
    from rlm.tiering.manager import RemoteLogManager

    settings = settings_from_mapping(raw)
    return build_api(settings, RemoteLogManager(settings, backend))


@contextmanager
def api_server(
    rig: Rig, *, http: str = "auto", loop: str = "auto", cache_bytes: int | None = None
) -> Iterator[tuple[str, Any]]:
    """A fresh server in this process (empty range cache of ``cache_bytes``, default the config's)
    over the tiered partition: (url, TieredReaders)."""
    from rlm.http.server import ApiServer

    raw = rig.raw
    if cache_bytes is not None:
        raw = {**raw, "tiering": {**raw["tiering"], "remote_cache_bytes": cache_bytes}}
    api = daemon_api(raw, rig.backend)
    server = ApiServer(api.app, "127.0.0.1", 0, http=http, loop=loop).start()
    try:
        yield server.url, api.readers
    finally:
        server.stop()


def serve(raw: dict[str, Any], http: str, loop: str, conn: Any) -> None:
    """The API in its own process, as ``rlm run`` serves it (same wiring and server): sends its URL
    on ``conn``, serves until ``conn`` says stop."""
    logging.getLogger("rlm.logdir.indexcheck").setLevel(logging.ERROR)
    from rlm.http.server import ApiServer
    from rlm.storage.registry import open_backend

    api = daemon_api(raw, open_backend(raw["remote"]["backend"], raw["remote"]["options"]))
    server = ApiServer(api.app, "127.0.0.1", 0, http=http, loop=loop).start()
    conn.send(server.url)
    conn.recv()
    server.stop()


@contextmanager
def api_process(rig: Rig, *, http: str = "auto", loop: str = "auto") -> Iterator[str]:
    """A fresh API server process (empty range cache, its own GIL) over the tiered partition."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=serve, args=(rig.raw, http, loop, theirs), daemon=True)
    proc.start()
    try:
        if not ours.poll(60):
            raise RuntimeError("the API server process did not start")
        CPU_PIDS["server"] = proc.pid or 0
        yield ours.recv()
    finally:
        CPU_PIDS.pop("server", None)
        ours.send("stop")
        proc.join(30)
        if proc.is_alive():
            proc.kill()


# --- readers (each returns the chunks it received, in order) -------------------------------------------


def boto3_read(s3: Any, objects: list[tuple[str, int, int]], range_bytes: int) -> list[bytes]:
    chunks = []
    for key, size, _ in objects:
        for start in range(0, size, range_bytes):
            end = min(size, start + range_bytes) - 1
            chunks.append(s3.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={start}-{end}")["Body"].read())
    return chunks


def records_read(pool: Any, url: str, offset: int, stop: int) -> list[bytes]:
    path = f"{url}/v1/topics/{TOPIC}/partitions/0/records"
    chunks = []
    while offset < stop:
        resp = pool.request("GET", path, fields={"offset": offset, "max_bytes": MIB, "format": "raw"})
        assert resp.status == 200, resp.data[:300]
        if not resp.data:
            break
        chunks.append(resp.data)
        offset = int(resp.headers["X-Rlm-Next-Offset"])
    return chunks


def stream_read(pool: Any, url: str, offset: int, max_bytes: int) -> list[bytes]:
    path = f"{url}/v1/topics/{TOPIC}/partitions/0/records/stream"
    resp = pool.request("GET", path, fields={"offset": offset, "max_bytes": max_bytes}, preload_content=False)
    assert resp.status == 200, resp.read()[:300]
    chunks = list(resp.stream(MIB))
    resp.release_conn()
    return chunks


def client_read(url: str, offset: int) -> list[bytes]:
    from rlm.http.client import RlmClient

    chunks: list[bytes] = []
    with RlmClient(url) as c:
        for streamed in c.iter_batches(TOPIC, 0, offset):
            if not chunks or chunks[-1] is not streamed.chunk:
                chunks.append(streamed.chunk)
    return chunks


# --- one round -------------------------------------------------------------------------------------------


def single_round(rig: Rig, args: argparse.Namespace, n: int) -> list[Result]:
    import urllib3

    total = sum(size for _, size, _ in rig.objects)
    out = [timed("boto3 ranged GETs", lambda: boto3_read(rig.s3, rig.objects, args.range_mib * MIB))]
    stacks = [("", "auto", "auto"), (" (h11/asyncio)", "h11", "asyncio")]
    for label, http, loop in stacks if n % 2 == 0 else stacks[::-1]:  # alternate who goes first
        pool = urllib3.PoolManager(maxsize=4)
        with api_process(rig, http=http, loop=loop) as url:
            out.append(
                timed(f"/records 1 MiB{label}", lambda u=url, p=pool: records_read(p, u, 0, rig.end_offset))
            )
        with api_process(rig, http=http, loop=loop) as url:
            out.append(timed(f"stream{label}", lambda u=url, p=pool: stream_read(p, u, 0, total)))
    with api_process(rig) as url:
        out.append(timed("RlmClient.iter_batches (httpx)", lambda: client_read(url, 0)))
    return out


def quarters(rig: Rig, readers: int) -> list[list[tuple[str, int, int]]]:
    per = max(1, len(rig.objects) // readers)
    return [rig.objects[i * per : (i + 1) * per if i < readers - 1 else None] for i in range(readers)]


def concurrent_round(rig: Rig, args: argparse.Namespace) -> list[Result]:
    import boto3  # noqa: F401 - the clients come from the weed helper
    import urllib3

    groups = quarters(rig, args.readers)
    clients = [rig.s3 for _ in groups]  # botocore clients are thread-safe; the pool has 16 slots
    n = len(groups)
    out = [
        parallel(
            f"{n} × boto3",
            [
                lambda g=g, c=c: boto3_read(c, g, args.range_mib * MIB)
                for g, c in zip(groups, clients, strict=True)
            ],
        )
    ]

    def stop_of(i: int) -> int:
        return groups[i + 1][0][2] if i + 1 < n else rig.end_offset

    pool = urllib3.PoolManager(maxsize=8)
    with api_process(rig) as url:
        out.append(
            parallel(
                f"{n} × /records 1 MiB",
                [lambda i=i: records_read(pool, url, groups[i][0][2], stop_of(i)) for i in range(n)],
            )
        )
    with api_process(rig) as url:
        out.append(
            parallel(
                f"{n} × stream",
                [lambda g=g: stream_read(pool, url, g[0][2], sum(s for _, s, _ in g)) for g in groups],
            )
        )
    return out


def hot_keys(rig: Rig, args: argparse.Namespace) -> tuple[float, float, int]:
    """(hit rate alone, hit rate during a catch-up stream, hot lookups during it)."""
    import urllib3

    from rlm.storage.wrapper import WrappingBackend

    class ThreadReads(WrappingBackend):
        name = "thread-reads"

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner
            self.hot: int = 0
            self.hot_thread: int | None = None

        def _read(self, key: str, start: int, end: int | None) -> bytes:
            if threading.get_ident() == self.hot_thread:
                self.hot += 1
            return super()._read(key, start, end)

    counting = ThreadReads(rig.backend)
    rnd = random.Random(3)
    hot = sorted(rnd.randrange(0, rig.end_offset) for _ in range(args.hot_keys))
    rig_counted = Rig(rig.raw, rig.settings, counting, rig.s3, rig.objects, rig.end_offset)
    with api_server(rig_counted, cache_bytes=args.cache_mib * MIB) as (url, readers):
        reader = readers.reader(TOPIC, 0)
        counting.hot_thread = threading.get_ident()
        for o in hot:  # warm
            assert reader.lookup_offset(o).offset == o
        base = counting.hot
        for o in hot:
            reader.lookup_offset(o)
        alone = 1 - (counting.hot - base) / len(hot)
        done = threading.Event()
        total = sum(size for _, size, _ in rig.objects)
        pool = urllib3.PoolManager()
        catchup = threading.Thread(target=lambda: (stream_read(pool, url, 0, total), done.set()))
        base, lookups = counting.hot, 0
        catchup.start()
        t0 = time.perf_counter()
        while not done.is_set():  # paced: a dashboard's rate, not a tight loop that pins its keys
            reader.lookup_offset(hot[lookups % len(hot)])
            lookups += 1
            time.sleep(max(0.0, t0 + lookups / args.hot_rate - time.perf_counter()))
        catchup.join()
        during = 1 - (counting.hot - base) / max(1, lookups)
    return alone, during, lookups


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--segments", type=int, default=8)
    ap.add_argument("--segment-mib", type=int, default=32)
    ap.add_argument("--range-mib", type=int, default=1, help="boto3 ranged GET size")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--readers", type=int, default=4)
    ap.add_argument("--hot-keys", type=int, default=32)
    ap.add_argument("--cache-mib", type=int, default=64, help="range cache of the hot-key run")
    ap.add_argument("--hot-rate", type=float, default=50, help="hot lookups per second")
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    # benchlib's fast writer leaves index entries rlm rebuilds at upload (and says so, per segment)
    logging.getLogger("rlm.logdir.indexcheck").setLevel(logging.ERROR)

    with weed_store("rlm-catchup-bench-", BUCKET) as (tmp, weed):
        rig = tier(tmp, weed, args)
        best: dict[str, Result] = {}
        for n in range(args.rounds):
            for r in single_round(rig, args, n) + concurrent_round(rig, args):
                keep_best(best, r)
        alone, during, lookups = hot_keys(rig, args)
        report(rig, args, list(best.values()), (alone, during, lookups))
    return 0


def _cpu_cell(r: Result) -> str:
    cpu = r.cpu or {}
    per = {role: cpu.get(role, 0.0) * 1000 / (r.nbytes / 1e6) for role in ("client", "server", "store")}
    return f"{per['client']:.1f} + {per['server']:.1f} + {per['store']:.1f} = **{sum(per.values()):.1f}**"


def report(rig: Rig, args: argparse.Namespace, results: list[Result], hot: tuple[float, float, int]) -> None:
    by = {r.name: r for r in results}
    single, multi = by["boto3 ranged GETs"], by[f"{args.readers} × boto3"]
    digests = {r.digest for r in results}
    assert len(digests) == 1, {r.name: r.digest for r in results}  # bytes identical everywhere
    rows = [
        "| measurement | MB | seconds | MB/s | vs boto3 | CPU ms/MB: client + server + store |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        base = multi if r.name.startswith(f"{args.readers} ×") else single
        rows.append(
            f"| {r.name} | {r.nbytes / 1e6:,.0f} | {r.seconds:.2f} | {r.mbps:,.1f} | "
            f"**{r.mbps / base.mbps:.2f}** | {_cpu_cell(r)} |"
        )
    alone, during, lookups = hot
    rows.append(
        f"| hot-key lookups ({args.hot_keys} keys at {args.hot_rate:g}/s, {args.cache_mib} MiB "
        f"cache): hit rate alone / during a catch-up stream ({lookups} lookups) | | | | "
        f"**{alone:.2f} / {during:.2f}** | |"
    )
    table = print_table(rows)
    if args.no_record:
        return
    cmd = command_line()
    entry = (
        f"### {dt.date.today().isoformat()} — {args.segments} × {args.segment_mib} MiB remote-only "
        f"(~16 KiB batches), S3 = SeaweedFS `weed server` on loopback\n\n"
        f"- machine: {machine()}; shared with other engineers' jobs\n- command: `{cmd}`\n"
        f"- best of {args.rounds} alternating rounds; every API row on a fresh server process "
        f"(empty cache); SHA-256 of every row's bytes identical: `{(single.digest or '')[:16]}…`\n\n"
        f"{table}\n"
    )
    record(
        SECTION,
        entry,
        intro=(
            "`bench/catchup_bench.py`: a consumer catching up from the remote tier through the HTTP API "
            "(`/records` 1 MiB requests, the streaming read, 4 concurrent readers) vs boto3 ranged GETs "
            "of the same objects on the same SeaweedFS, same run; and a hot-key lookup workload's cache "
            "hit rate while a catch-up reader runs. Targets (issue #14): ≥ 0.9 × boto3; hit rate ≥ 0.9."
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
