"""Executor-side reading of a :class:`~rlm.jobs.plan.ReadTask`: bytes → records → Arrow batches.

No pyspark here (pyarrow only), so the same code serves the Spark job and the single-process
baseline of ``bench/export_bench.py``. Records come out as Spark's Kafka source produces them:
control batches skipped (and, for a read_committed task, aborted transactions), ``timestampType``
= Kafka's id (-1 none, 0 CreateTime, 1 LogAppendTime),
``headers`` null when a record has none (Spark's ``includeHeaders`` behaviour).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from rlm.errors import RlmError
from rlm.formats.records import RecordBatch, decode_records, iter_batches
from rlm.formats.transactions import committed_batches
from rlm.formats.txn_index import AbortedTxn
from rlm.jobs.plan import BackendSpec, ReadTask
from rlm.storage.retry import RetryPolicy

#: Spark's Kafka source schema (``includeHeaders=true``), as DDL.
KAFKA_SCHEMA_DDL = ("key binary, value binary, topic string, partition int, offset long, "
                    "timestamp timestamp, timestampType int, "
                    "headers array<struct<key:string,value:binary>>")

ROWS_PER_BATCH = 8192


def arrow_schema() -> Any:
    """The Arrow schema matching :data:`KAFKA_SCHEMA_DDL` (timestamps in µs, UTC)."""
    import pyarrow as pa

    return pa.schema([
        ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
        ("partition", pa.int32()), ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ])


def read_task_bytes(task: ReadTask, spec: BackendSpec | None, retry: RetryPolicy | None = None) -> bytes:
    """The task's byte range, with one ranged read (remote) or one ``pread`` (local)."""
    if task.source == "remote":
        if spec is None:
            raise RlmError("a remote read task needs a backend")
        backend = spec.create()
        return (retry or RetryPolicy()).call(lambda: backend.read(task.location, task.start, task.end))
    fd = os.open(task.location, os.O_RDONLY)
    try:
        return os.pread(fd, task.size, task.start)
    finally:
        os.close(fd)


Row = tuple[bytes | None, bytes | None, int, int, int, list[tuple[str, bytes | None]] | None]


def iter_task_records(task: ReadTask, data: bytes) -> Iterator[Row]:
    """``(key, value, offset, timestamp ms, timestampType, headers)`` of every record the task
    keeps, in offset order. Batch CRCs are verified (a corrupt batch fails the task with the
    object/file, byte position and offset)."""
    lo, hi, ts_lo, ts_hi = task.min_offset, task.max_offset, task.start_ts, task.end_ts
    try:
        for batch in _task_batches(task, data):
            if batch.is_control or batch.last_offset < lo or batch.base_offset > hi:
                continue
            if ts_lo is not None and batch.max_timestamp < ts_lo:
                continue
            ts_type = int(batch.timestamp_type)
            for r in decode_records(data, batch):
                o, ts = r.offset, r.timestamp
                if o < lo or o > hi:
                    continue
                if (ts_lo is not None and ts < ts_lo) or (ts_hi is not None and ts >= ts_hi):
                    continue
                headers = [(h.key, h.value) for h in r.headers] if r.headers else None
                yield r.key, r.value, o, ts, ts_type, headers
    except RlmError as err:
        where = (f"{task.source} {task.location} (segment {task.base_offset}, byte range starting at "
                 f"{task.start})")
        raise RlmError(f"{where}: {err}") from err


def _task_batches(task: ReadTask, data: bytes) -> list[RecordBatch]:
    """The task's batches (CRC-verified); read_committed: without aborted ones (docs/transactions.md)."""
    batches = list(iter_batches(data))
    if task.isolation != "read_committed":
        return batches
    if not batches:
        return batches
    # The task's list covers its planned offsets; like a fetch response, only the transactions
    # whose marker is at or after the first batch read count (an earlier ABORT closed its own).
    start = batches[0].base_offset
    aborted = [AbortedTxn(first, last, pid, -1) for pid, first, last in task.aborted if last >= start]
    return committed_batches(data, batches, aborted)[0]


def task_to_arrow(task: ReadTask, data: bytes, rows_per_batch: int = ROWS_PER_BATCH) -> Iterator[Any]:
    """Arrow record batches (schema :func:`arrow_schema`) of the task's records."""
    import pyarrow as pa

    schema = arrow_schema()
    cols: tuple[list[Any], ...] = ([], [], [], [], [], [])

    def flush() -> Any:
        keys_, values, offsets, stamps, types, headers = cols
        n = len(offsets)
        batch = pa.RecordBatch.from_arrays([
            pa.array(keys_, pa.binary()), pa.array(values, pa.binary()),
            pa.array([task.topic] * n, pa.string()),
            pa.array([task.partition] * n, pa.int32()), pa.array(offsets, pa.int64()),
            pa.array([t * 1000 for t in stamps], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            pa.array(types, pa.int32()),
            pa.array(headers, schema.field("headers").type),
        ], schema=schema)
        for c in cols:
            c.clear()
        return batch

    for row in iter_task_records(task, data):
        for c, v in zip(cols, row, strict=True):
            c.append(v)
        if len(cols[2]) >= rows_per_batch:
            yield flush()
    if cols[2]:
        yield flush()
