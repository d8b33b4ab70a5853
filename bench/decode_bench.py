"""Decode benchmark: record batches → Arrow columns in Spark's Kafka schema, one core, warm data.

The data: snappy v2 batches of ~16 KiB (before compression) holding ~300 B JSON-ish values, a key
and two headers per record — the issue's export workload (docs/decoder.md). A few distinct
batches are repeated with rewritten base offsets (the CRC does not cover the base offset) up to
``--mib`` of log bytes, held in memory. Contenders, in the same run, on the same bytes:

* **rlm native** — ``rlm.jobs.reading.decode.task_to_arrow`` with the compiled decoder;
* **rlm python** — the same with ``RLM_DECODER=python`` (the reference, today's export decoder);
* **aiokafka C + pyarrow** — aiokafka's C record parser (``aiokafka.record._crecords``: one
  Python object per record) feeding the same columns through ``pa.array`` — the issue's baseline;
* **aiokafka C, decode only** — its records iterated and touched, no Arrow at all (a lower bound
  for any per-record-object design).

Every Arrow contender's table is checked equal to the native one. MB/s counts log bytes (what
is read from disk / the store). Best of ``--runs``. Results go to the "Decode" section of
BENCHMARKS.md.

    .venv/bin/python bench/decode_bench.py              # 64 MiB
    .venv/bin/python bench/decode_bench.py --mib 16     # quick
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.benchlib import machine, record  # noqa: E402
from rlm.formats.compression import Compression  # noqa: E402
from rlm.formats.records import Header, RecordSpec, build_batch, native  # noqa: E402
from rlm.jobs.reading.decode import arrow_schema, task_to_arrow  # noqa: E402
from rlm.jobs.reading.plan import ReadTask  # noqa: E402

SECTION = "## Decode throughput"
T0 = 1_766_799_076_131


def templates(batch_bytes: int, value_bytes: int, count: int = 8) -> list[bytes]:
    """``count`` distinct snappy batches of ~``batch_bytes`` uncompressed."""
    rng = random.Random(15)
    out = []
    for _ in range(count):
        specs: list[RecordSpec] = []
        size = 0
        while size < batch_bytes - value_bytes:
            status = rng.choice(["NEW", "PAID", "SHIPPED"])
            head = (
                f'{{"order_id":{rng.randrange(10**9)},"status":"{status}",'
                f'"amount":{rng.random() * 1000:.2f},"note":"'
            )
            value = (head + rng.randbytes(value_bytes).hex())[: value_bytes - 2].encode() + b'"}'
            key = f"order-{rng.randrange(10**6)}".encode()
            headers = (Header("trace-id", rng.randbytes(8).hex().encode()), Header("source", b"web"))
            specs.append(RecordSpec(T0 + len(specs), key, value, headers))
            size += len(value) + len(key) + 40
        out.append(build_batch(specs, base_offset=0, compression=Compression.SNAPPY))
    return out


def segment(mib: int, batches: list[bytes]) -> tuple[bytes, int]:
    """Log bytes of about ``mib`` MiB and their record count (offsets contiguous from 0)."""
    out = bytearray()
    base = 0
    i = 0
    while len(out) < mib << 20:
        b = bytearray(batches[i % len(batches)])
        struct.pack_into(">q", b, 0, base)
        base += struct.unpack_from(">i", b, 23)[0] + 1
        out += b
        i += 1
    return bytes(out), base


def rlm_decoder(name: native.Decoder) -> Callable[[ReadTask, bytes], pa.Table]:
    def run(task: ReadTask, data: bytes) -> pa.Table:
        native.set_decoder(name)
        return pa.Table.from_batches(list(task_to_arrow(task, data)), arrow_schema())

    return run


def aiokafka_arrow(task: ReadTask, data: bytes) -> pa.Table:
    """The issue's baseline: aiokafka's C parser, Python lists, pyarrow arrays (8192-row chunks)."""
    from aiokafka.record.memory_records import MemoryRecords

    schema = arrow_schema()
    out = []
    cols: tuple[list[Any], ...] = ([], [], [], [], [], [])

    def flush() -> None:
        keys, values, offsets, stamps, types, headers = cols
        n = len(offsets)
        out.append(
            pa.RecordBatch.from_arrays(
                [
                    pa.array(keys, pa.binary()),
                    pa.array(values, pa.binary()),
                    pa.array([task.topic] * n, pa.string()),
                    pa.array([task.partition] * n, pa.int32()),
                    pa.array(offsets, pa.int64()),
                    pa.array([t * 1000 for t in stamps], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                    pa.array(types, pa.int32()),
                    pa.array(headers, schema.field("headers").type),
                ],
                schema=schema,
            )
        )
        for c in cols:
            c.clear()

    records = MemoryRecords(data)
    while (batch := records.next_batch()) is not None:
        if not batch.validate_crc():
            raise ValueError("CRC")
        if batch.is_control_batch:
            continue
        for r in batch:
            cols[0].append(r.key)
            cols[1].append(r.value)
            cols[2].append(r.offset)
            cols[3].append(r.timestamp)
            cols[4].append(r.timestamp_type)
            cols[5].append([(k, v) for k, v in r.headers] or None)
            if len(cols[2]) >= 8192:
                flush()
    if cols[2]:
        flush()
    return pa.Table.from_batches(out, schema)


def aiokafka_decode_only(task: ReadTask, data: bytes) -> int:
    from aiokafka.record.memory_records import MemoryRecords

    n = 0
    records = MemoryRecords(data)
    while (batch := records.next_batch()) is not None:
        batch.validate_crc()
        for r in batch:
            n += r.value is not None and len(r.headers) >= 0
    return n


def fetch_json(decoder: native.Decoder) -> Callable[[ReadTask, bytes], Any]:
    """What ``/records?format=json`` answers for these bytes: rlm's own rendering of a fetch
    (``rlm.http.routes_records.fetch_json``, decode_records per batch), serialized."""
    import json

    from rlm.formats.records import iter_batches
    from rlm.http.routes_records import fetch_json as render
    from rlm.tiering.read import FetchResult

    def run(task: ReadTask, data: bytes) -> str:
        native.set_decoder(decoder)
        fetched = FetchResult("bench", 0, "remote", data, list(iter_batches(data)), None)
        return json.dumps(render(fetched))

    return run


def interleaved(
    contenders: list[tuple[str, Callable[[ReadTask, bytes], Any]]], task: ReadTask, data: bytes, runs: int
) -> list[tuple[str, float, Any]]:
    """Best time of each contender over ``runs`` rounds, the contenders alternating inside a round
    (a shared machine's load then weighs on all of them alike)."""
    times: dict[str, list[float]] = {name: [] for name, _ in contenders}
    results: dict[str, Any] = {}
    for _ in range(runs):
        for name, fn in contenders:
            t0 = time.perf_counter()
            results[name] = fn(task, data)
            times[name].append(time.perf_counter() - t0)
    return [(name, min(times[name]), results[name]) for name, _ in contenders]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=64, help="log bytes to decode (MiB)")
    ap.add_argument("--runs", type=int, default=3, help="best of this many runs per contender")
    ap.add_argument("--batch-kib", type=int, default=16)
    ap.add_argument("--value-bytes", type=int, default=300)
    ap.add_argument("--no-record", action="store_true", help="print only, do not touch BENCHMARKS.md")
    return ap.parse_args()


def _memory_task(data: bytes) -> ReadTask:
    """A task reading all of ``data`` (held in memory) as partition bench-0, every offset."""
    return ReadTask("bench", 0, "local", "(memory)", 0, len(data), 0, (1 << 63) - 1)


def measure_arrow(data: bytes, n: int, runs: int) -> list[tuple[str, float]]:
    """Best seconds of each decoder turning ``data`` (``n`` records) into Arrow, every table
    checked equal to rlm native's."""
    mb = len(data) / 1e6
    contenders = [
        ("rlm native → Arrow", rlm_decoder("native")),
        ("rlm python → Arrow", rlm_decoder("python")),
        ("aiokafka C + pyarrow → Arrow", aiokafka_arrow),
        ("aiokafka C, decode only (no Arrow)", aiokafka_decode_only),
    ]
    rows: list[tuple[str, float]] = []
    reference = None
    for name, secs, result in interleaved(contenders, _memory_task(data), data, runs):
        if isinstance(result, pa.Table):
            assert result.num_rows == n, (name, result.num_rows, n)
            if reference is None:
                reference = result
            assert result.equals(reference), f"{name}: rows differ from rlm native"
        rows.append((name, secs))
        print(
            f"{name:38s} {secs:7.3f} s  {n / secs / 1e6:6.2f} M records/s  {mb / secs:7.1f} MB/s", flush=True
        )
    native.set_decoder(None)
    return rows


def measure_json(args: argparse.Namespace) -> list[str]:
    """Table lines for /records?format=json (and rlm fetch, lookups): Record objects, then rlm's
    JSON rendering, under each decoder (the bytes must be identical)."""
    small, small_n = segment(max(1, args.mib // 8), templates(args.batch_kib << 10, args.value_bytes))
    json_rows = interleaved(
        [("python", fetch_json("python")), ("native", fetch_json("native"))],
        _memory_task(small),
        small,
        args.runs,
    )
    native.set_decoder(None)
    assert json_rows[0][2] == json_rows[1][2], "fetch JSON differs between the decoders"
    py_secs = json_rows[0][1]
    return [
        "",
        f"`/records?format=json` rendering of {len(small) >> 20} MiB ({small_n} records), "
        "identical bytes under both decoders:",
        "",
        "| decode_records | seconds | M records/s | vs python |",
        "|---|---|---|---|",
    ] + [
        f"| {name} | {secs:.3f} | {small_n / secs / 1e6:.2f} | **{py_secs / secs:.2f}x** |"
        for name, secs, _ in json_rows
    ]


def main() -> None:
    args = parse_args()
    if native.extension_error() is not None:
        sys.exit(f"the compiled decoder is not built ({native.extension_error()}): run make install")
    data, n = segment(args.mib, templates(args.batch_kib << 10, args.value_bytes))
    rows = measure_arrow(data, n, args.runs)
    mb = len(data) / 1e6
    base = dict(rows)["aiokafka C + pyarrow → Arrow"]
    table = ["| decoder | seconds | M records/s | MB/s | vs aiokafka C + pyarrow |", "|---|---|---|---|---|"]
    table += [
        f"| {name} | {secs:.3f} | {n / secs / 1e6:.2f} | {mb / secs:.1f} | **{base / secs:.2f}x** |"
        for name, secs in rows
    ]
    table += measure_json(args)
    entry = (
        f"### {dt.date.today()} — {args.mib} MiB of snappy {args.batch_kib} KiB batches, "
        f"~{args.value_bytes} B values + key + 2 headers ({n} records), one core\n\n"
        f"- machine: {machine()}; shared with other engineers' jobs\n"
        f"- command: `.venv/bin/python bench/decode_bench.py --mib {args.mib} --runs {args.runs}`\n"
        f"- best of {args.runs} interleaved rounds; data in memory; every Arrow table checked equal "
        "to rlm native's\n\n" + "\n".join(table) + "\n"
    )
    print(entry)
    if not args.no_record:
        record(
            SECTION,
            entry,
            intro="Record batches → Arrow columns (Spark's Kafka schema) in one process: "
            "the compiled decoder vs the Python reference vs aiokafka's C parser (docs/decoder.md).",
        )


if __name__ == "__main__":
    main()
