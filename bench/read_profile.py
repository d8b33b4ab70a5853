"""Profile of the remote fetch path (in process, no HTTP): one sequential catch-up reader fetching
``--max-bytes`` per call from the remote tier, on the local store and on SeaweedFS (a real S3
server, started here), with cProfile's top functions by cumulative and own time.

    python bench/read_profile.py [--mib 96] [--store local|s3|both] [--profile] [--no-read-ahead]

Prints MB/s per store and, with ``--profile``, the hottest functions (docs/read-path.md; the
findings are in BENCHMARKS.md "read path profile"). The HTTP side is measured by catchup_bench.py.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchlib import template_batch, write_segment


def build(root: Path, mib: int, segment_mib: int = 16) -> Path:
    """A partition of ``mib`` MiB in 16 MiB segments of ~16 KiB batches (plus a small active one)."""
    part = root / "logs" / "catchup-0"
    part.mkdir(parents=True)
    template = template_batch(16, 1000)
    per_segment = (segment_mib << 20) // len(template)
    base = 0
    for _ in range(max(1, mib // segment_mib)):
        base = write_segment(part, base, template, per_segment)
    write_segment(part, base, template, 4)
    return part


def tier(root: Path, part: Path, backend: str, options: dict[str, Any], args: argparse.Namespace) -> Any:
    from rlm.config import settings_from_mapping
    from rlm.formats import naming
    from rlm.logdir.discovery import list_segments
    from rlm.storage.registry import open_backend
    from rlm.tiering.manager import RemoteLogManager
    from rlm.tiering.read import TieredReaders

    tiering: dict[str, Any] = {"state_dir": str(root / "state"), "gc_grace_ms": 0}
    tiering["read_ahead_threads"] = args.threads
    tiering["read_ahead_bytes"] = 0 if args.no_read_ahead else args.ahead_mib << 20
    settings = settings_from_mapping(
        {
            "log": {"dirs": [str(part.parent)], "eligibility": "rolled"},
            "remote": {"backend": backend, "options": options},
            "cluster": {"leadership": "always"},
            "tiering": tiering,
        }
    )
    store = open_backend(backend, options)
    assert all(r.error is None for r in RemoteLogManager(settings, store).run_once())
    for seg in list_segments(part)[:-1]:
        for suffix in (naming.LOG, naming.INDEX, naming.TIME_INDEX):
            (part / naming.segment_file_name(seg.base_offset, suffix)).unlink(missing_ok=True)
    return TieredReaders(settings, store)


def catch_up(readers: Any, max_bytes: int, verify: bool) -> tuple[int, float]:
    reader = readers.reader("catchup", 0)
    end = reader.offsets().remote_log_start_offset or 0
    last = reader.offsets().highest_tiered_offset
    offset, total = end, 0
    t = time.perf_counter()
    while offset <= last:
        got = readers.reader("catchup", 0).fetch(offset, max_bytes, verify=verify, reader_key="profile")
        total += len(got.data)
        offset = got.next_offset
    return total, time.perf_counter() - t


def run(name: str, readers: Any, args: argparse.Namespace) -> None:
    prof = cProfile.Profile() if args.profile else None
    if prof:
        prof.enable()
    total, secs = catch_up(readers, args.max_bytes, args.verify)
    if prof:
        prof.disable()
    print(
        f"{name}: {total / 1e6:.1f} MB in {secs:.2f} s = {total / 1e6 / secs:.1f} MB/s "
        f"(max_bytes {args.max_bytes}, verify={args.verify})"
    )
    if prof:
        for key in ("cumulative", "tottime"):
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats(key).print_stats(18)
            print(out.getvalue())


def raw_boto3(client: Any, bucket: str, chunk: int = 1 << 20) -> tuple[int, float]:
    """Sequential ranged GETs of ``chunk`` bytes over every segment object (the same bytes)."""
    keys = [
        o["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        for o in page.get("Contents", [])
        if o["Key"].endswith(".log")
    ]
    sizes = {k: client.head_object(Bucket=bucket, Key=k)["ContentLength"] for k in keys}
    total = 0
    t = time.perf_counter()
    for key in sorted(keys):
        for pos in range(0, sizes[key], chunk):
            end = min(pos + chunk, sizes[key]) - 1
            total += len(client.get_object(Bucket=bucket, Key=key, Range=f"bytes={pos}-{end}")["Body"].read())
    return total, time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=96)
    ap.add_argument("--max-bytes", type=int, default=1 << 20)
    ap.add_argument("--store", choices=("local", "s3", "both"), default="both")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--verify", action="store_true", help="CRC-verify every fetched batch again")
    ap.add_argument("--no-read-ahead", action="store_true")
    ap.add_argument("--threads", type=int, default=8, help="[tiering] read_ahead_threads")
    ap.add_argument("--ahead-mib", type=int, default=16, help="[tiering] read_ahead_bytes in MiB")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlm-read-profile-") as tmp:
        root = Path(tmp)
        if args.store in ("local", "both"):
            part = build(root / "l", args.mib)
            readers = tier(root / "l", part, "local", {"root": str(root / "l" / "store")}, args)
            run("local store", readers, args)
        if args.store in ("s3", "both"):
            from rlm.testing.seaweed import SeaweedServer

            weed = SeaweedServer(root / "weed").start()
            try:
                weed.make_bucket("rlm-profile")
                part = build(root / "s", args.mib)
                readers = tier(root / "s", part, "s3", weed.options("rlm-profile"), args)
                run("SeaweedFS", readers, args)
                total, secs = raw_boto3(weed.client(), "rlm-profile")
                print(
                    f"SeaweedFS raw boto3 ranged GETs: {total / 1e6:.1f} MB in {secs:.2f} s = "
                    f"{total / 1e6 / secs:.1f} MB/s"
                )
            finally:
                weed.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
