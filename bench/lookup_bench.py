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
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.benchlib import S3_SERVERS, command_line, machine, record, run_threads, s3_server  # noqa: E402
from rlm.testing.counting import CountingBackend  # noqa: E402

SECTION = "## Lookup latency"
Row = tuple[str, list[float], str]  # (measurement, latencies in ms, note)
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


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, default, help_ in (
        ("--batches", 4_000, None),
        ("--lookups", 300, "per measurement"),
        ("--http-requests", 2_000, None),
        ("--http-threads", 4, None),
    ):
        ap.add_argument(flag, type=int, default=default, help=help_)
    ap.add_argument("--segment-mib", type=float, default=4)
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument(
        "--server", choices=S3_SERVERS, default="seaweedfs", help="the S3 server (default: seaweedfs)"
    )
    return ap.parse_args()


@dataclass
class Rig:
    """The tiered partition under test: its settings, counted store, manager, every record's
    (offset, timestamp) and the segments (``keep`` of them still local)."""

    settings: Any
    backend: CountingBackend
    manager: Any
    records: list[tuple[int, int]]
    local_start: int
    segments: int
    size: int
    keep: int

    def readers(self) -> Any:
        """A fresh TieredReaders (empty 256 MiB range cache, no read-ahead) over the counted store."""
        from rlm.tiering.read import RemoteRangeCache, TieredReaders

        r = TieredReaders(self.settings, self.backend, cache=RemoteRangeCache(256 << 20))
        r.resources.read_ahead = False
        return r


def _generated_records(logs: Path, args: argparse.Namespace) -> tuple[list[Any], list[tuple[int, int]]]:
    from rlm.formats.records import decode_records, iter_batches
    from rlm.logdir.discovery import list_segments

    t = time.perf_counter()
    generate(logs, args.batches, int(args.segment_mib * (1 << 20)))
    segments = list_segments(logs / "bench-0")
    records: list[tuple[int, int]] = []
    for seg in segments:
        buf = seg.log.read_bytes()
        for b in iter_batches(buf):
            records.extend((r.offset, r.timestamp) for r in decode_records(buf, b))
    print(
        f"generated {len(segments)} segments, {sum(s.size for s in segments) / 2**20:.1f} MiB, "
        f"{len(records)} records in {time.perf_counter() - t:.1f}s",
        file=sys.stderr,
    )
    return segments, records


def setup(tmp: Path, endpoint: str, args: argparse.Namespace) -> Rig:
    """Generate the partition, tier it to S3 at ``endpoint``, then delete the oldest three quarters
    of its local segments so those offsets are remote only."""
    from rlm.config import settings_from_mapping
    from rlm.formats import naming
    from rlm.logdir.discovery import list_segments
    from rlm.storage.registry import open_backend
    from rlm.tiering.manager import RemoteLogManager

    logs = tmp / "logs"
    segments, records = _generated_records(logs, args)
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
            "tiering": {"state_dir": str(tmp / "state"), "gc_grace_ms": 0, "remote_cache_bytes": 256 << 20},
        }
    )
    backend = CountingBackend(open_backend("s3", options))
    t = time.perf_counter()
    manager = RemoteLogManager(settings, backend)
    assert all(r.error is None for r in manager.run_once())
    print(f"tiered to s3 ({args.server}) in {time.perf_counter() - t:.1f}s", file=sys.stderr)
    part = logs / "bench-0"
    keep = max(1, len(segments) // 4)
    for seg in segments[: len(segments) - keep]:
        for suffix in (naming.LOG, naming.INDEX, naming.TIME_INDEX):
            (part / naming.segment_file_name(seg.base_offset, suffix)).unlink(missing_ok=True)
    local_start = list_segments(part)[0].base_offset
    size = sum(s.size for s in segments)
    return Rig(settings, backend, manager, records, local_start, len(segments), size, keep)


def _look(reader: Any, q: tuple[int, int], kind: str) -> Any:
    return reader.lookup_offset(q[0]) if kind == "offset" else reader.lookup_timestamp(q[1])


def measure_kind(rig: Rig, warm_reader: Any, kind: str, queries: tuple[list[Any], list[Any]]) -> list[Row]:
    """Latency rows of one lookup ``kind`` (offset or timestamp): local, remote on a fresh reader
    per lookup (cold, with its store requests), remote again on the warmed reader."""
    local_q, remote_q = queries
    lat = [timed(lambda q=q: _look(warm_reader, q, kind)) for q in local_q]
    assert all(_look(warm_reader, q, kind).tier == "local" for q in local_q[:20] if kind == "offset")
    rows: list[Row] = [(f"local {kind}", lat, "")]
    cold, reqs = [], []
    for q in remote_q:
        reader = rig.readers().reader("bench", 0)
        before = rig.backend.total
        cold.append(timed(lambda q=q, reader=reader: _look(reader, q, kind)))
        reqs.append(rig.backend.total - before)
        res = _look(reader, q, kind)
        assert res.found and res.tier == "remote" and (kind == "timestamp" or res.offset == q[0])
    note = f"{statistics.mean(reqs):.2f} avg / {max(reqs)} max store requests"
    rows.append((f"remote {kind}, cold", cold, note))
    for q in remote_q:  # fill the cache
        _look(warm_reader, q, kind)
    before = rig.backend.total
    warm = [timed(lambda q=q: _look(warm_reader, q, kind)) for q in remote_q]
    rows.append((f"remote {kind}, warm", warm, f"{rig.backend.total - before} store requests"))
    return rows


def measure_lookups(rig: Rig, args: argparse.Namespace, rnd: random.Random) -> list[Row]:
    remote = [r for r in rig.records if r[0] < rig.local_start]
    local = [r for r in rig.records if r[0] >= rig.local_start]
    remote_q = [rnd.choice(remote) for _ in range(args.lookups)]
    local_q = [rnd.choice(local) for _ in range(args.lookups)]
    warm_reader = rig.readers().reader("bench", 0)
    return [
        row
        for kind in ("offset", "timestamp")
        for row in measure_kind(rig, warm_reader, kind, (local_q, remote_q))
    ]


def measure_http(rig: Rig, args: argparse.Namespace, rnd: random.Random) -> float:
    """Offset lookups per second through the daemon's app (build_api, as `rlm run` wires it) on
    ApiServer, from ``--http-threads`` client threads after one warming pass."""
    from rlm.cli.wiring import build_api
    from rlm.http.client import RlmClient
    from rlm.http.server import ApiServer

    api = build_api(rig.settings, rig.manager)
    api.readers.resources.read_ahead = False
    server = ApiServer(api.app, "127.0.0.1", 0).start()
    per_thread = args.http_requests // args.http_threads
    queries = [rnd.choice(rig.records)[0] for _ in range(per_thread)]
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
    http_s = run_threads(threads)
    server.stop()
    assert not errors, errors[:5]
    return per_thread * args.http_threads / http_s


def report(rig: Rig, args: argparse.Namespace, rows: list[Row], rps: float) -> None:
    """Print the table; append it to BENCHMARKS.md unless ``--no-record``."""
    n_http = args.http_requests // args.http_threads * args.http_threads
    header = "| measurement | n | p50 ms | p99 ms | notes |\n|---|---|---|---|---|"
    lines = [
        f"| {name} | {len(s)} | {pct(s, 50):.2f} | {pct(s, 99):.2f} | {note} |" for name, s, note in rows
    ]
    lines.append(
        f"| HTTP offset lookups, {args.http_threads} client threads (warm cache) | "
        f"{n_http} | | | **{rps:,.0f} requests/s** |"
    )
    table = "\n".join([header, *lines])
    print(table)
    if args.no_record:
        return
    cmd = command_line(env="AWS_DEFAULT_REGION=us-east-1")
    entry = (
        f"### {dt.date.today().isoformat()} — {rig.segments} segments, {rig.size / 2**20:.1f} MiB, "
        f"{len(rig.records):,} records; {rig.segments - rig.keep} segments remote only "
        f"(S3 on {args.server})\n\n"
        f"- machine: {machine()}\n"
        f"- command: `{cmd}`\n"
        f"- cold = a fresh reader (empty range cache) per lookup; {args.server} runs on "
        f"this machine, so remote latency is a local-HTTP S3, not a WAN one\n\n{table}\n"
    )
    intro = (
        "`bench/lookup_bench.py`: lookup latency per tier (local, remote cold, remote warm) "
        "with the remote tier on S3 (SeaweedFS or moto), HTTP requests/s, and object-store "
        "requests per cold lookup."
    )
    record(SECTION, entry, intro=intro)


def main() -> int:
    args = parse_args()
    for k, v in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    tmp = Path(tempfile.mkdtemp(prefix="rlm-lookup-bench-"))
    try:
        with s3_server(args.server, tmp, "rlm-bench") as (endpoint, _):
            rig = setup(tmp, endpoint, args)
            rnd = random.Random(5)
            rows = measure_lookups(rig, args, rnd)
            rps = measure_http(rig, args, rnd)
        report(rig, args, rows, rps)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
