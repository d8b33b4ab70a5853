"""Protection bench (issue #18): copy throughput, catch-up read throughput and stored size with
compression + encryption on vs off, in the same run, on a real S3 server (SeaweedFS's ``weed
server``, started here). docs/protection.md, docs/security.md.

One partition of ``--segments`` × ``--segment-mib`` MiB is written twice (same bytes) into two log
dirs: **plain** (no ``[remote.compression]``/``[remote.encryption]``) and **protected**
(``codec = "zstd"`` at ``--level``, a key ring with one active AES-256 key). Its batches are
``--templates`` distinct ~16 KiB v2 batches (Kafka's default ``batch.size``) in turn, their values
JSON order events with random ids, amounts and hex notes — compressible the way application
payloads are, not the way repeated padding is; ``--producer-zstd`` makes that share of the batches
zstd-compressed by the producer (rlm stores those entries as they are).

* **copy**: one ``RemoteLogManager.run_once`` pass per mode with fresh local state and an emptied
  key prefix, modes alternating for ``--rounds`` rounds, best kept; MB/s = plaintext ``.log``
  bytes / seconds; CPU seconds of this process (the copier) and of the store.
* **stored size**: bytes under each mode's prefix after its last pass (every object), and of the
  ``segment.log`` objects alone.
* **catch-up**: the local segments deleted, each mode's API on a fresh server process (as in
  bench/catchup_bench.py, whose readers this reuses) read from offset 0 to the end with ``/records``
  1 MiB requests and with one streamed read; bytes hashed after the clock stops and must be
  identical across modes.

    .venv/bin/python bench/protect_bench.py                        # 4 × 32 MiB, records BENCHMARKS.md
    .venv/bin/python bench/protect_bench.py --segments 2 --segment-mib 8 --rounds 1 --no-record
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import logging
import os
import random
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchlib import command_line, empty_prefix, machine, print_table, record, write_rolled_partition
from bench.catchup_bench import TOPIC, Rig, api_process, records_read, stream_read
from bench.readmeasure import Result, keep_best, timed, weed_store
from rlm.testing.secrets import write_secret

SECTION = "## Protection: compression + encryption"
BUCKET = "rlm-protect"
MODES = ("plain", "protected")
RECORDS_PER_BATCH = 64
_SKUS = [f"SKU-{i:05d}" for i in range(500)]
_EVENTS = ("created", "paid", "packed", "shipped", "delivered", "refunded")


def templates(count: int, producer_zstd: float, seed: int) -> list[bytes]:
    """``count`` distinct v2 batches of JSON order events (~16 KiB each uncompressed)."""
    from rlm.formats.compression import Compression
    from rlm.formats.records import RecordSpec, build_batch

    rnd = random.Random(seed)
    out = []
    for t in range(count):
        specs = []
        for i in range(RECORDS_PER_BATCH):
            event = {
                "order_id": rnd.randrange(10**9),
                "customer": f"c-{rnd.randrange(10**6):06d}",
                "sku": rnd.choice(_SKUS),
                "qty": rnd.randint(1, 9),
                "event": rnd.choice(_EVENTS),
                "amount": round(rnd.uniform(1, 500), 2),
                "currency": "EUR",
                "ts": 1_766_799_076_131 + t * RECORDS_PER_BATCH + i,
                "note": rnd.randbytes(12).hex(),
            }
            specs.append(
                RecordSpec(event["ts"], f"o-{event['order_id']}".encode(), json.dumps(event).encode())
            )
        codec = Compression.ZSTD if rnd.random() < producer_zstd else Compression.NONE
        out.append(build_batch(specs, base_offset=0, compression=codec, partition_leader_epoch=1))
    return out


@dataclass
class Mode:
    name: str
    logs: Path
    state: Path
    prefix: str
    raw: dict[str, Any]
    settings: Any
    backend: Any


def modes(tmp: Path, weed: Any, args: argparse.Namespace, end: int) -> dict[str, Mode]:
    from rlm.config import settings_from_mapping
    from rlm.storage.registry import open_backend

    key_file = tmp / "bench.key"
    write_secret(key_file, base64.b64encode(os.urandom(32)).decode() + "\n")
    out = {}
    for name in MODES:
        logs = tmp / f"logs-{name}"
        if not logs.exists():
            shutil.copytree(tmp / "logs", logs)
        options = weed.options(BUCKET, prefix=name)
        remote: dict[str, Any] = {"backend": "s3", "options": options}
        if name == "protected":
            remote["compression"] = {"codec": "zstd", "level": args.level}
            remote["encryption"] = {"key_files": {"bench": str(key_file)}, "active_key": "bench"}
        raw = {
            "log": {"dirs": [str(logs)], "eligibility": "rolled"},
            "remote": remote,
            "tiering": {"state_dir": str(tmp / f"state-{name}"), "gc_grace_ms": 0},
        }
        out[name] = Mode(
            name,
            logs,
            tmp / f"state-{name}",
            name + "/",
            raw,
            settings_from_mapping(raw),
            open_backend("s3", options),
        )
    return out


def stored(s3: Any, prefix: str) -> tuple[int, int]:
    """(bytes of every object, bytes of the segment.log objects) under ``prefix``."""
    total = logs = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for obj in page.get("Contents", []):
            total += obj["Size"]
            logs += obj["Size"] if obj["Key"].endswith("/segment.log") else 0
    return total, logs


def copy_pass(mode: Mode, s3: Any, segments: int, log_bytes: int) -> Result:
    from rlm.tiering.manager import RemoteLogManager

    for f in (mode.logs / f"{TOPIC}-0").glob("*.remote*"):
        f.unlink()
    shutil.rmtree(mode.state, ignore_errors=True)
    empty_prefix(s3, BUCKET, mode.prefix)
    manager = RemoteLogManager(mode.settings, mode.backend)

    def run() -> list[bytes]:
        results = manager.run_once(gc=False)
        assert all(r.error is None for r in results), [r.error for r in results]
        assert sum(len(r.copied) for r in results) == segments
        return []

    result = timed(f"copy {mode.name}", run)
    return Result(result.name, result.seconds, log_bytes, None, result.cpu)


def drop_local(mode: Mode) -> None:
    from rlm.formats import naming
    from rlm.logdir.discovery import list_segments

    part = mode.logs / f"{TOPIC}-0"
    for seg in list_segments(part)[:-1]:  # every byte now comes from the store
        for suffix in (naming.LOG, naming.INDEX, naming.TIME_INDEX):
            (part / naming.segment_file_name(seg.base_offset, suffix)).unlink(missing_ok=True)


def catch_up(mode: Mode, end: int, total: int) -> list[Result]:
    import urllib3

    rig = Rig(mode.raw, mode.settings, mode.backend, None, [], end)
    pool = urllib3.PoolManager(maxsize=4)
    with api_process(rig) as url:
        records = timed(f"/records 1 MiB, {mode.name}", lambda: records_read(pool, url, 0, end))
    with api_process(rig) as url:
        stream = timed(f"stream, {mode.name}", lambda: stream_read(pool, url, 0, total))
    return [records, stream]


def _cpu_ms_per_mb(r: Result) -> str:
    cpu = r.cpu or {}
    per = {role: cpu.get(role, 0.0) * 1000 / (r.nbytes / 1e6) for role in ("client", "server", "store")}
    return f"{per['client']:.1f} + {per['server']:.1f} + {per['store']:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--segments", type=int, default=4)
    ap.add_argument("--segment-mib", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--level", type=int, default=3, help="zstd level of the protected mode")
    ap.add_argument("--templates", type=int, default=64, help="distinct batches in the log")
    ap.add_argument(
        "--producer-zstd",
        type=float,
        default=0.0,
        help="share of batches compressed by the producer (zstd), 0..1",
    )
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("rlm.logdir.indexcheck").setLevel(logging.ERROR)  # benchlib's sparse indexes

    with weed_store("rlm-protect-bench-", BUCKET) as (tmp, weed):
        s3 = weed.client(max_pool_connections=16)
        end = write_rolled_partition(
            tmp / "logs",
            TOPIC,
            args.segments,
            args.segment_mib,
            templates(args.templates, args.producer_zstd, seed=18),
        )
        log_bytes = sum(f.stat().st_size for f in (tmp / "logs" / f"{TOPIC}-0").glob("*.log"))
        ms = modes(tmp, weed, args, end)
        best: dict[str, Result] = {}
        for name in MODES:  # warm-up, not timed: connections, the server's code paths, page cache
            copy_pass(ms[name], s3, args.segments, log_bytes)
        for n in range(args.rounds):
            for name in MODES if n % 2 == 0 else MODES[::-1]:
                keep_best(best, copy_pass(ms[name], s3, args.segments, log_bytes))
        sizes = {name: stored(s3, ms[name].prefix) for name in MODES}
        for m in ms.values():
            drop_local(m)
        for n in range(args.rounds):
            for name in MODES if n % 2 == 0 else MODES[::-1]:
                for r in catch_up(ms[name], end, log_bytes):
                    keep_best(best, r)
        report(args, best, sizes, log_bytes)
    return 0


def report(
    args: argparse.Namespace, best: dict[str, Result], sizes: dict[str, tuple[int, int]], log_bytes: int
) -> None:
    reads = [r for r in best.values() if r.digest is not None and not r.name.startswith("copy")]
    digests = {r.digest for r in reads}
    assert len(digests) == 1, {r.name: r.digest for r in reads}  # byte-identical in both modes
    rows = [
        "| measurement | plain MB/s | protected MB/s | **protected / plain** | "
        "CPU ms/MB plain (client + server + store) | CPU ms/MB protected |",
        "|---|---|---|---|---|---|",
    ]
    for what in ("copy {}", "/records 1 MiB, {}", "stream, {}"):
        plain, prot = best[what.format("plain")], best[what.format("protected")]
        rows.append(
            f"| {what.format('').rstrip(', ')} | {plain.mbps:,.1f} | {prot.mbps:,.1f} | "
            f"**{prot.mbps / plain.mbps:.2f}** | {_cpu_ms_per_mb(plain)} | {_cpu_ms_per_mb(prot)} |"
        )
    (all_p, log_p), (all_x, log_x) = sizes["plain"], sizes["protected"]
    rows.append(
        f"| stored bytes, every object (MB) | {all_p / 1e6:,.1f} | {all_x / 1e6:,.1f} | "
        f"**{all_x / all_p:.2f}** | | |"
    )
    rows.append(
        f"| stored bytes, `segment.log` objects (MB) | {log_p / 1e6:,.1f} | {log_x / 1e6:,.1f} | "
        f"**{log_x / log_p:.2f}** | | |"
    )
    table = print_table(rows)
    if args.no_record:
        return
    cmd = command_line()
    entry = (
        f"### {dt.date.today().isoformat()} — {args.segments} × {args.segment_mib} MiB "
        f"({log_bytes / 1e6:,.0f} MB of JSON order events, {args.templates} distinct ~16 KiB batches, "
        f"{args.producer_zstd:.0%} producer-compressed), zstd level {args.level} + AES-256-GCM "
        f"vs plain, S3 = SeaweedFS `weed server` on loopback\n\n"
        f"- machine: {machine()}; shared with other engineers' jobs\n- command: `{cmd}`\n"
        f"- best of {args.rounds} alternating rounds per mode; copy = one `run_once` pass with fresh "
        f"local state; reads on a fresh API server process each (empty cache), from offset 0 to "
        f"the end; SHA-256 of the bytes read identical in both modes: "
        f"`{(next(iter(r.digest for r in best.values() if r.digest)) or '')[:16]}…`\n\n{table}\n"
    )
    record(
        SECTION,
        entry,
        intro=(
            "`bench/protect_bench.py`: copy throughput, catch-up read throughput (HTTP `/records` and the "
            "streaming read) and stored size with `[remote.compression]` zstd + `[remote.encryption]` on "
            "vs off, same data, same SeaweedFS, same run (issue #18; docs/protection.md). Ratios are "
            "protected / plain."
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
