"""Lookup benchmark: latency of offset/timestamp lookups per tier and HTTP throughput, with the
remote tier on S3: SeaweedFS (``weed server``, a real S3 server in its own process) by default,
``--server moto`` for moto's server; no AWS account involved.

A generated partition (LogWriter: mixed codecs, out-of-order timestamps, several segments) is tiered
to the ``s3`` backend (plugins/rlm-storage-s3) by RemoteLogManager; then the oldest local segments
are deleted so that most offsets are remote only. Measured, each over a fixed number of lookups at
deterministic pseudo-random offsets/timestamps:

* **local** — offsets at or above the local log start (the .index → .log path);
* **remote cold** — a fresh reader (empty range cache) per lookup: one ranged GET per lookup;
* **remote warm** — the same lookups repeated on one reader (served by the range cache);
* **HTTP** — ApiServer (uvicorn) + a few client threads doing offset lookups, requests/s;
* **store requests per cold lookup** — counted by a wrapper around the s3 backend.

Results are printed as one table and appended as a dated entry to the "Lookup latency" section of
BENCHMARKS.md (``--no-record`` to skip).

    AWS_DEFAULT_REGION=us-east-1 .venv/bin/python bench/lookup_bench.py
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.benchlib import S3_SERVERS, command_line, machine, record, s3_server  # noqa: E402
from rlm.testing.counting import CountingBackend  # noqa: E402

SECTION = "## Lookup latency"
T0 = 1_700_000_000_000


def generate(log_dir: Path, batches: int, segment_bytes: int, seed: int = 11) -> None:
    from rlm.formats.compression import Compression
    from rlm.formats.records import RecordSpec
    from rlm.logdir.writer import LogWriter

    rnd = random.Random(seed)
    codecs = [Compression.NONE, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD, Compression.GZIP]
    ts = T0
    with LogWriter(log_dir, "bench", 0, segment_bytes=segment_bytes, clock=lambda: T0) as w:
        for i in range(batches):
            recs = []
            for _ in range(rnd.randint(1, 40)):
                ts += rnd.randint(-200, 1_000)
                recs.append(RecordSpec(ts, f"k{i}".encode(), rnd.randbytes(rnd.randint(50, 600))))
            w.append(recs, compression=codecs[i % len(codecs)])


def pct(samples: list[float], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=4_000)
    ap.add_argument("--segment-mib", type=float, default=4)
    ap.add_argument("--lookups", type=int, default=300, help="per measurement")
    ap.add_argument("--http-requests", type=int, default=2_000)
    ap.add_argument("--http-threads", type=int, default=4)
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument(
        "--server", choices=S3_SERVERS, default="seaweedfs", help="the S3 server (default: seaweedfs)"
    )
    args = ap.parse_args()

    for k, v in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    import contextlib
    import logging

    from rlm.config import settings_from_mapping
    from rlm.formats import naming
    from rlm.formats.records import decode_records, iter_batches
    from rlm.http.app import create_app
    from rlm.http.client import RlmClient
    from rlm.http.server import ApiServer
    from rlm.logdir.scan import list_segments
    from rlm.storage.registry import open_backend
    from rlm.tiering.cache import RemoteRangeCache
    from rlm.tiering.manager import RemoteLogManager
    from rlm.tiering.readers import TieredReaders

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    tmp = Path(tempfile.mkdtemp(prefix="rlm-lookup-bench-"))
    stack = contextlib.ExitStack()
    try:
        endpoint, _ = stack.enter_context(s3_server(args.server, tmp, "rlm-bench"))
        logs = tmp / "logs"
        t = time.perf_counter()
        generate(logs, args.batches, int(args.segment_mib * (1 << 20)))
        part = logs / "bench-0"
        segments = list_segments(part)
        size = sum(s.size for s in segments)
        records: list[tuple[int, int]] = []
        for seg in segments:
            buf = seg.log.read_bytes()
            for b in iter_batches(buf):
                records.extend((r.offset, r.timestamp) for r in decode_records(buf, b))
        print(
            f"generated {len(segments)} segments, {size / 2**20:.1f} MiB, {len(records)} records "
            f"in {time.perf_counter() - t:.1f}s",
            file=sys.stderr,
        )
        options = {
            "bucket": "rlm-bench",
            "prefix": "bench",
            "endpoint_url": endpoint,
            "path_style": True,
            "region": "us-east-1",
        }
        settings = settings_from_mapping(
            {
                "log": {"dirs": [str(logs)], "eligibility": "rolled"},
                "remote": {"backend": "s3", "options": options},
                "tiering": {"state_dir": str(tmp / "state"), "gc_grace_ms": 0},
            }
        )
        backend = CountingBackend(open_backend("s3", options))
        t = time.perf_counter()
        manager = RemoteLogManager(settings, backend)
        assert all(r.error is None for r in manager.run_once())
        print(f"tiered to s3 ({args.server}) in {time.perf_counter() - t:.1f}s", file=sys.stderr)
        keep = max(1, len(segments) // 4)
        for seg in segments[: len(segments) - keep]:
            for suffix in (naming.LOG, naming.INDEX, naming.TIME_INDEX):
                (part / naming.segment_file_name(seg.base_offset, suffix)).unlink(missing_ok=True)
        local_start = list_segments(part)[0].base_offset
        remote = [r for r in records if r[0] < local_start]
        local = [r for r in records if r[0] >= local_start]
        rnd = random.Random(5)
        remote_q = [rnd.choice(remote) for _ in range(args.lookups)]
        local_q = [rnd.choice(local) for _ in range(args.lookups)]

        def readers() -> TieredReaders:
            r = TieredReaders(settings, backend, cache=RemoteRangeCache(256 << 20))
            r.resources.read_ahead = False
            return r

        rows: list[tuple[str, list[float], str]] = []
        warm_reader = readers().reader("bench", 0)
        for kind in ("offset", "timestamp"):
            idx = 0 if kind == "offset" else 1

            def look(reader: Any, q: tuple[int, int], kind: str = kind) -> Any:
                return reader.lookup_offset(q[0]) if kind == "offset" else reader.lookup_timestamp(q[1])

            lat = [timed(lambda q=q: look(warm_reader, q)) for q in local_q]
            assert all(look(warm_reader, q).tier == "local" for q in local_q[:20] if kind == "offset")
            rows.append((f"local {kind}", lat, ""))
            cold, reqs = [], []
            for q in remote_q:
                reader = readers().reader("bench", 0)
                before = backend.total
                cold.append(timed(lambda q=q, reader=reader: look(reader, q)))
                reqs.append(backend.total - before)
                res = look(reader, q)
                assert res.found and res.tier == "remote" and (kind == "timestamp" or res.offset == q[idx])
            rows.append(
                (
                    f"remote {kind}, cold",
                    cold,
                    f"{statistics.mean(reqs):.2f} avg / {max(reqs)} max store requests",
                )
            )
            for q in remote_q:  # fill the cache
                look(warm_reader, q)
            before = backend.total
            warm = [timed(lambda q=q: look(warm_reader, q)) for q in remote_q]
            rows.append((f"remote {kind}, warm", warm, f"{backend.total - before} store requests"))

        # HTTP
        registry_readers = readers()
        from prometheus_client import CollectorRegistry

        app = create_app(
            registry_readers, settings.server, status=manager.status, registry=CollectorRegistry()
        )
        server = ApiServer(app, "127.0.0.1", 0).start()
        per_thread = args.http_requests // args.http_threads
        queries = [rnd.choice(records)[0] for _ in range(per_thread)]
        errors: list[str] = []

        def client() -> None:
            with RlmClient(server.url) as c:
                for o in queries:
                    if c.lookup_offset("bench", 0, o)["offset"] != o:
                        errors.append(str(o))

        with RlmClient(server.url) as c:  # warm the cache so the number is the API's, not S3's
            for o in queries:
                c.lookup_offset("bench", 0, o)
        threads = [threading.Thread(target=client) for _ in range(args.http_threads)]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        http_s = time.perf_counter() - t
        server.stop()
        assert not errors, errors[:5]
        rps = per_thread * args.http_threads / http_s

        header = "| measurement | n | p50 ms | p99 ms | notes |\n|---|---|---|---|---|"
        lines = [
            f"| {name} | {len(s)} | {pct(s, 50):.2f} | {pct(s, 99):.2f} | {note} |" for name, s, note in rows
        ]
        lines.append(
            f"| HTTP offset lookups, {args.http_threads} client threads (warm cache) | "
            f"{per_thread * args.http_threads} | | | **{rps:,.0f} requests/s** |"
        )
        table = "\n".join([header, *lines])
        print(table)
        if not args.no_record:
            cmd = command_line(env="AWS_DEFAULT_REGION=us-east-1")
            entry = (
                f"\n### {dt.date.today().isoformat()} — {len(segments)} segments, "
                f"{size / 2**20:.1f} MiB, "
                f"{len(records):,} records; {len(segments) - keep} segments remote only "
                f"(S3 on {args.server})\n\n"
                f"- machine: {machine()}\n"
                f"- command: `{cmd}`\n"
                f"- cold = a fresh reader (empty range cache) per lookup; {args.server} runs on "
                f"this machine, so remote latency is a local-HTTP S3, not a WAN one\n\n{table}\n"
            )
            record(
                SECTION,
                entry.lstrip("\n"),
                intro=(
                    "`bench/lookup_bench.py`: lookup latency per tier (local, remote cold, remote warm) "
                    "with the remote tier on S3 (SeaweedFS or moto), HTTP requests/s, and object-store "
                    "requests per cold lookup."
                ),
            )
    finally:
        stack.close()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
