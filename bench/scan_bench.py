"""Scan benchmark: ``iter_batches`` (CRC-verified, over an mmap) vs raw sequential read.

Generates (or reuses) a segment of realistic v2 batches under ``bench/out/``: a handful of distinct
~16 KiB batches (uncompressed and snappy) built with ``build_batch`` and repeated with rewritten base
offsets. The base offset is not covered by the CRC (it covers attributes..end), so copies stay valid
without recomputing anything, and generating 1 GiB takes seconds.

Two settings, each measured in the same run for both contenders:

* **warm** page cache (the file is read once first): the ratio compares the parser against the cost
  of getting the bytes through Python at all (memcpy speed) — a CPU-bound worst case;
* **cold** cache (the file's pages are evicted with ``posix_fadvise(DONTNEED)`` before every run):
  what tiering a segment that is no longer in memory costs — the realistic case for old segments.
Results are printed and recorded as a dated entry in the "Scan" section of BENCHMARKS.md.

    .venv/bin/python bench/scan_bench.py                 # 1 GiB
    .venv/bin/python bench/scan_bench.py --size-mib 64   # quick run
"""

from __future__ import annotations

import argparse
import datetime as dt
import mmap
import os
import random
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import crc32c

from rlm.formats.compression import Compression
from rlm.formats.records import RecordSpec, build_batch, iter_batches
from rlm.formats.records.scan import SCAN_IMPL

try:
    from rlm.formats.records import _scan
except ImportError:  # the pure-Python walk runs; the floor uses the crc32c package
    _scan = None  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.benchlib import BENCHMARKS, OUT, command_line, machine, record  # noqa: E402

SECTION = "## Scan throughput"
CHUNK = 1 << 20
TARGET_RATIO = 0.5


def template_batches(batch_bytes: int) -> list[bytes]:
    """Distinct batches of ~``batch_bytes`` (before compression): 4 uncompressed, 4 snappy."""
    rng = random.Random(405)
    templates: list[bytes] = []
    for i in range(8):
        codec = Compression.NONE if i % 2 == 0 else Compression.SNAPPY
        specs: list[RecordSpec] = []
        size = 0
        n = 0
        while size < batch_bytes - 400:
            value = (
                f'{{"order_id":{rng.randrange(10**9)},"status":"{rng.choice(["NEW", "PAID", "SHIPPED"])}",'
                f'"amount":{rng.random() * 1000:.2f},"note":"{rng.randbytes(40).hex()}"}}'
            ).encode()
            key = f"order-{rng.randrange(10**6)}".encode()
            specs.append(RecordSpec(1_766_799_076_131 + n, key, value))
            size += len(value) + len(key) + 12
            n += 1
        templates.append(build_batch(specs, base_offset=0, compression=codec, partition_leader_epoch=10))
    return templates


def generate(path: Path, size_bytes: int, batch_bytes: int) -> int:
    """Write batches until the next one would pass ``size_bytes``; return the file size."""
    templates = template_batches(batch_bytes)
    counts = [struct.unpack_from(">i", t, 23)[0] + 1 for t in templates]  # lastOffsetDelta + 1
    tmp = path.with_suffix(".tmp")
    offset = 0
    written = 0
    i = 0
    buf = bytearray()
    with tmp.open("wb") as f:
        while True:
            t = templates[i % len(templates)]
            if written + len(buf) + len(t) > size_bytes:
                break
            start = len(buf)
            buf += t
            struct.pack_into(">q", buf, start, offset)  # baseOffset: outside the CRC
            offset += counts[i % len(templates)]
            i += 1
            if len(buf) >= CHUNK:
                f.write(buf)
                written += len(buf)
                buf.clear()
        f.write(buf)
        written += len(buf)
    tmp.replace(path)
    return written


def raw_read(path: Path) -> float:
    """Seconds to read the whole file in 1 MiB chunks (readinto: no per-chunk allocation)."""
    chunk = bytearray(CHUNK)
    start = time.perf_counter()
    with path.open("rb", buffering=0) as f:
        while f.readinto(chunk):
            pass
    return time.perf_counter() - start


def evict(path: Path) -> None:
    """Drop the file's pages from the page cache (clean pages only, so fsync first)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cold(measure, path: Path):  # type: ignore[no-untyped-def]
    evict(path)
    return measure(path)


def scan(path: Path, skip_crc: bool = False) -> tuple[float, int]:
    """Seconds for ``iter_batches(verify_crc=True)`` over an mmap of the file, and the batch count.

    ``skip_crc``: the same walk without computing CRCs (headers + RecordBatch objects only), to
    show what the CRC costs."""
    start = time.perf_counter()
    n = 0
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        for _ in iter_batches(m, verify_crc=True, skip_crc=skip_crc):
            n += 1
    return time.perf_counter() - start, n


def mmap_floor(path: Path) -> float:
    """Seconds for one CRC-32C call over a fresh mmap of the whole file: the cost of faulting the
    mapping in and reading it once, with no per-batch work (what no mmap scan can beat)."""
    crc = _scan.crc32c if _scan is not None else crc32c.crc32c
    start = time.perf_counter()
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        crc(m)
    return time.perf_counter() - start


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=1024, help="segment size to scan (default 1024)")
    ap.add_argument("--batch-kib", type=int, default=16, help="uncompressed bytes per batch (default 16)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement; the best is kept")
    ap.add_argument("--no-record", action="store_true", help="do not write BENCHMARKS.md")
    return ap.parse_args(argv)


def prepare(args: argparse.Namespace) -> Path:
    """The segment to scan under OUT, reused when one of the asked size (within 64 KiB) exists."""
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"scan-{args.size_mib}MiB-{args.batch_kib}KiB.log"
    target = args.size_mib << 20
    if path.exists() and target - 64 * 1024 <= path.stat().st_size <= target:
        print(f"reusing {path}")
    else:
        t = time.perf_counter()
        generate(path, target, args.batch_kib * 1024)
        print(f"generated {path} in {time.perf_counter() - t:.1f} s")
    return path


@dataclass
class Timings:
    """Best seconds of each measurement (warm page cache unless ``cold_``), and the batch count."""

    raw: float
    scan: float
    walk: float
    floor: float
    cold_raw: float
    cold_scan: float
    batches: int


def measure(path: Path, repeat: int) -> Timings:
    raw_read(path)  # warm the page cache for both measurements
    raw_s = min(raw_read(path) for _ in range(repeat))
    scans = [scan(path) for _ in range(repeat)]
    walk_s = min(scan(path, skip_crc=True)[0] for _ in range(repeat))
    floor_s = min(mmap_floor(path) for _ in range(repeat))
    # Cold: alternate the contenders so drifting disk/host-cache speed hits both alike.
    cold_raw, cold_scan = [], []
    for _ in range(repeat):
        cold_raw.append(cold(raw_read, path))
        cold_scan.append(cold(scan, path)[0])
    scan_s = min(s for s, _ in scans)
    return Timings(raw_s, scan_s, walk_s, floor_s, min(cold_raw), min(cold_scan), scans[0][1])


def table(size: int, t: Timings) -> tuple[str, float, float]:
    """The Markdown result for a file of ``size`` bytes, and the warm and cold scan/raw ratios."""
    raw_mbs, scan_mbs = size / t.raw / 1e6, size / t.scan / 1e6
    cold_raw_mbs, cold_scan_mbs = size / t.cold_raw / 1e6, size / t.cold_scan / 1e6
    ratio, cold_ratio = scan_mbs / raw_mbs, cold_scan_mbs / cold_raw_mbs
    text = (
        "| measurement | seconds | MB/s |\n|---|---|---|\n"
        f"| warm cache: raw read, 1 MiB `readinto` chunks | {t.raw:.3f} | {raw_mbs:,.0f} |\n"
        f"| warm cache: `iter_batches` over mmap, CRC-32C verified | {t.scan:.3f} | {scan_mbs:,.0f} |\n"
        f"| **warm ratio** (scan / raw, target ≥ {TARGET_RATIO}) | | **{ratio:.2f}** |\n"
        f"| warm cache: the same walk with `skip_crc` (headers + objects; "
        f"{t.walk / t.batches * 1e6:.2f} µs/batch) | {t.walk:.3f} | {size / t.walk / 1e6:,.0f} |\n"
        f"| warm cache: one CRC-32C call over a fresh mmap of the file (the mmap floor: page faults + "
        f"one read, no per-batch work) | {t.floor:.3f} | {size / t.floor / 1e6:,.0f} |\n"
        f"| cold cache: raw read | {t.cold_raw:.3f} | {cold_raw_mbs:,.0f} |\n"
        f"| cold cache: `iter_batches`, CRC-32C verified | {t.cold_scan:.3f} | {cold_scan_mbs:,.0f} |\n"
        f"| **cold ratio** (scan / raw, target ≥ {TARGET_RATIO}) | | **{cold_ratio:.2f}** |\n"
    )
    return text, ratio, cold_ratio


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    path = prepare(args)
    size = path.stat().st_size
    timings = measure(path, args.repeat)
    result, ratio, cold_ratio = table(size, timings)
    avg_kib = size / timings.batches / 1024
    print(
        f"\n{size / 2**20:.0f} MiB, {timings.batches} batches ({avg_kib:.1f} KiB avg), "
        f"best of {args.repeat}, scan: {SCAN_IMPL}"
    )
    print(result)
    if not args.no_record:
        cmd = command_line(argv)
        entry = (
            f"### {dt.date.today().isoformat()} — {size / 2**20:.0f} MiB, {timings.batches} batches "
            f"({avg_kib:.1f} KiB avg, half snappy)\n\n"
            f"- machine: {machine()}\n"
            f"- scan implementation: {SCAN_IMPL} (docs/scan.md)\n"
            f"- command: `{cmd}` (best of {args.repeat} per setting)\n\n" + result
        )
        record(SECTION, entry)
        print(f"recorded in {BENCHMARKS}")
    return 0 if max(ratio, cold_ratio) >= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
