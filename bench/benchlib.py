"""Small helpers shared by copy_bench, scale_bench and soak: machine description, BENCHMARKS.md
sections, a moto S3 server in its own process, and a fast raw writer of Kafka partitions."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

from rlm.testing.daemon import free_port

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
BENCHMARKS = ROOT / "BENCHMARKS.md"
FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}


def machine() -> str:
    mem_kib = 0
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{os.cpu_count()} CPUs (nproc), {mem_kib / 2**20:.1f} GiB RAM, {cpu}; "
        f"Python {platform.python_version()} on {platform.system()} {platform.release()}"
    )


def command_line(argv: Sequence[str] | None = None, *, env: str = "") -> str:
    """How the running bench was invoked, as BENCHMARKS.md shows it: ``[env ].venv/bin/python
    bench/<script> <args>`` (``argv``: the arguments, default ``sys.argv[1:]``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    script = Path(sys.argv[0]).name
    return " ".join([*([env] if env else []), ".venv/bin/python", f"bench/{script}", *args])


def record(section: str, entry: str, *, intro: str = "") -> None:
    """Append ``entry`` at the end of ``section`` in BENCHMARKS.md (created, with ``intro``, if
    missing). Re-reads the file right before writing: other benches append their own sections."""
    text = BENCHMARKS.read_text() if BENCHMARKS.exists() else "# Benchmarks\n"
    lines = text.splitlines(keepends=True)
    try:
        head = next(i for i, line in enumerate(lines) if line.rstrip("\n") == section)
    except StopIteration:
        if not text.endswith("\n"):
            text += "\n"
        BENCHMARKS.write_text(
            text + f"\n{section}\n\n" + (intro.rstrip("\n") + "\n\n" if intro else "") + entry
        )
        return
    nxt = next((i for i in range(head + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    before = "".join(lines[:nxt]).rstrip("\n") + "\n\n"
    after = "".join(lines[nxt:])
    BENCHMARKS.write_text(before + entry + ("\n" + after if after else ""))


def print_table(rows: Sequence[str]) -> str:
    """Print the Markdown table made of ``rows`` (one line each) and return it."""
    table = "\n".join(rows)
    print(table)
    return table


def run_threads(threads: Sequence[threading.Thread]) -> float:
    """Start every thread, wait for all of them: wall seconds from the first start to the last join."""
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - t


def empty_prefix(s3: Any, bucket: str, prefix: str) -> None:
    """Delete every object of ``bucket`` under ``prefix`` through a boto3 client, a page at a time."""
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        objs = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if objs:
            s3.delete_objects(Bucket=bucket, Delete={"Objects": objs, "Quiet": True})


class MotoProcess:
    """``python -m moto.server`` in its own process (so the S3 server does not share our GIL)."""

    def __init__(self, log_path: Path | None = None) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=out,
            stderr=out,
            env={**os.environ, **FAKE_AWS},
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("moto server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> MotoProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


S3_SERVERS = ("seaweedfs", "moto")


@contextlib.contextmanager
def s3_server(kind: str, work: Path, bucket: str) -> Iterator[tuple[str, int]]:
    """The benches' S3 server holding ``bucket``, yielding (endpoint, server pid): SeaweedFS (the
    default: a real server, ``weed server`` on a fresh ``work/weed``, rlm/testing/seaweed.py) or
    moto in its own process (``kind = "moto"``)."""
    if kind == "moto":
        import boto3

        with MotoProcess(work / "moto.log") as moto:
            client = boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1")
            client.create_bucket(Bucket=bucket)
            client.close()
            yield moto.endpoint, moto.proc.pid
        return
    from rlm.testing.seaweed import SeaweedServer

    data = work / "weed"
    shutil.rmtree(data, ignore_errors=True)
    with SeaweedServer(data) as weed:
        assert weed.proc is not None
        weed.make_bucket(bucket)
        yield weed.endpoint, weed.proc.pid


# --- fast raw partitions ---------------------------------------------------------------------------


def template_batch(records: int, value_bytes: int, *, compression: object = None) -> bytes:
    """One v2 batch of ``records`` records (offsets 0..records-1) to be repeated with rewritten bases."""
    from rlm.formats.compression import Compression
    from rlm.formats.records import RecordSpec, build_batch

    specs = [
        RecordSpec(1_766_799_076_131 + i, f"k{i}".encode(), (b"v%06d" % i).ljust(value_bytes, b"."))
        for i in range(records)
    ]
    return build_batch(
        specs, base_offset=0, compression=compression or Compression.NONE, partition_leader_epoch=1
    )


def write_segment(
    part_dir: Path, base: int, template: bytes | Sequence[bytes], count: int, *, index_interval: int = 4096
) -> int:
    """Write ``<base>.log`` of ``count`` batches — copies of ``template``, or of a list of
    templates in turn (distinct bytes, so a compressor sees no repeats; each with the same record
    count) — bases rewritten (the CRC does not cover them), plus the sparse ``.index`` and the
    ``.timeindex`` Kafka's ``LogSegment.append`` writes for those appends (one batch each) and its
    roll adds; return the next base offset.

    The indexes follow Kafka's rules so rlm finds them valid, as it would a broker's: an offset
    entry (the batch's last offset, its position) once more than ``index_interval`` bytes were
    appended since the last one; a time entry (the running max timestamp, the last offset of the
    batch that first reached it) with it — and on roll — when that timestamp went up."""
    from rlm.formats import naming

    templates = [template] if isinstance(template, bytes | bytearray) else list(template)
    per = struct.unpack_from(">i", templates[0], 23)[0] + 1  # lastOffsetDelta + 1
    assert all(struct.unpack_from(">i", t, 23)[0] + 1 == per for t in templates), "same record count"
    stamps = [struct.unpack_from(">q", t, 35)[0] for t in templates]  # maxTimestamp
    if len(templates) == 1:
        buf = bytearray(templates[0] * count)
    else:
        buf = bytearray(b"".join(templates[i % len(templates)] for i in range(count)))
    idx = bytearray()
    tidx = bytearray()
    since = 0
    pos = 0
    max_ts, max_at, last_ts = -1, -1, -1  # running max timestamp, its batch's last offset, last entry's

    def time_entry() -> None:
        nonlocal last_ts
        if max_ts > last_ts:
            tidx.extend(struct.pack(">qi", max_ts, max_at - base))
            last_ts = max_ts

    for i in range(count):
        offset = base + i * per
        struct.pack_into(">q", buf, pos, offset)
        if stamps[i % len(stamps)] > max_ts:
            max_ts, max_at = stamps[i % len(stamps)], offset + per - 1
        if since > index_interval:
            idx += struct.pack(">ii", offset + per - 1 - base, pos)
            time_entry()
            since = 0
        size = len(templates[i % len(templates)])
        since += size
        pos += size
    time_entry()  # the roll
    (part_dir / naming.segment_file_name(base, naming.LOG)).write_bytes(buf)
    (part_dir / naming.segment_file_name(base, naming.INDEX)).write_bytes(idx)
    (part_dir / naming.segment_file_name(base, naming.TIME_INDEX)).write_bytes(tidx)
    return base + count * per


def write_rolled_partition(
    logs: Path, topic: str, segments: int, segment_mib: int, template: bytes | Sequence[bytes]
) -> int:
    """``<logs>/<topic>-0``: ``segments`` rolled segments of ~``segment_mib`` MiB of ``template``
    copies (or of a list of templates in turn), the empty active segment after them and the high
    watermark at its base (every rolled segment committed); returns that base."""
    from rlm.formats import naming

    part = logs / f"{topic}-0"
    part.mkdir(parents=True)
    templates = [template] if isinstance(template, bytes | bytearray) else list(template)
    count = (segment_mib << 20) * len(templates) // sum(len(t) for t in templates)
    base = 0
    for _ in range(segments):
        base = write_segment(part, base, templates, count)
    for suffix in (naming.LOG, naming.INDEX, naming.TIME_INDEX):
        (part / naming.segment_file_name(base, suffix)).write_bytes(b"")  # the active segment
    write_checkpoint(logs, "replication-offset-checkpoint", {(topic, 0): base})
    return base


def rolled_segments(logs: Path, topic: str, segments: int, segment_mib: int) -> list[Path]:
    """The ``.log`` files of :func:`write_rolled_partition`'s partition of ~16 KiB batches
    (Kafka's default ``batch.size``), written once per shape (a marker file keeps it for the next
    run)."""
    import shutil

    part = logs / f"{topic}-0"
    marker = part / f".generated-v2-{segments}x{segment_mib}"  # v2: Kafka-valid indexes
    if not marker.exists():
        shutil.rmtree(logs, ignore_errors=True)
        write_rolled_partition(logs, topic, segments, segment_mib, template_batch(100, 150))
        marker.touch()
    return sorted(part.glob("*.log"))[:-1]


def write_checkpoint(log_dir: Path, name: str, entries: dict[tuple[str, int], int]) -> None:
    lines = ["0", str(len(entries))] + [f"{t} {p} {o}" for (t, p), o in sorted(entries.items())]
    tmp = log_dir / (name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(log_dir / name)


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and of every live process below it, plus its reaped children's."""
    total = 0
    for p in [pid, *_descendants(pid)]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if p == pid else 0)
    return total / os.sysconf("SC_CLK_TCK")


def _descendants(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with suppress(OSError, IndexError, ValueError):  # gone meanwhile
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        kids = [c for c, p in parents.items() if p == parent]
        out += kids
        todo += kids
    return out
