"""Executor-side reading of a :class:`~rlm.jobs.reading.plan.ReadTask`: bytes → records → Arrow batches.

No pyspark here (pyarrow only), so the same code serves the Spark job and the single-process
baseline of ``bench/export_bench.py``. Records come out as Spark's Kafka source produces them:
control batches skipped (and, for a read_committed task, aborted transactions), ``timestampType``
= Kafka's id (-1 none, 0 CreateTime, 1 LogAppendTime),
``headers`` null when a record has none (Spark's ``includeHeaders`` behaviour).
"""

from __future__ import annotations

import copy
import os
import socket
from collections.abc import Iterator
from typing import Any

from rlm.errors import CorruptRecordError, LogDirError, RlmError
from rlm.formats.indexes.remote_index import iter_entries
from rlm.formats.indexes.txn_index import AbortedTxn
from rlm.formats.records import RecordBatch, decode_records, iter_batches, native
from rlm.formats.transactions import committed_batches
from rlm.jobs.reading.plan import BackendSpec, ReadTask
from rlm.tiering.store import SegmentManifest

__all__ = [
    "KAFKA_SCHEMA_DDL",
    "ROWS_PER_BATCH",
    "Row",
    "arrow_schema",
    "iter_task_records",
    "read_task_bytes",
    "task_to_arrow",
]

#: Spark's Kafka source schema (``includeHeaders=true``), as DDL.
KAFKA_SCHEMA_DDL = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int, "
    "headers array<struct<key:string,value:binary>>"
)

ROWS_PER_BATCH = 8192


def arrow_schema() -> Any:
    """The Arrow schema matching :data:`KAFKA_SCHEMA_DDL` (timestamps in µs, UTC)."""
    import pyarrow as pa

    return pa.schema(
        [
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
            ("timestampType", pa.int32()),
            ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        ]
    )


def read_task_bytes(task: ReadTask, spec: BackendSpec | None) -> bytes:
    """The task's byte range, with one ranged read (remote) or one ``pread`` (local)."""
    if task.source == "remote":
        if spec is None:
            raise RlmError("a remote read task needs a backend")
        backend = spec.create()
        data = backend.read(task.location, task.start, task.end)
        if task.sealed is not None:  # stored compressed/encrypted: open each entry (docs/protection.md)
            manifest = SegmentManifest.from_json(task.sealed[0])
            entries = [d.entry for d in iter_entries(task.sealed[1])]
            data = spec.protection().open_entries(manifest, entries, data, task.start)
        return data
    try:
        fd = os.open(task.location, os.O_RDONLY)
    except FileNotFoundError:
        raise LogDirError(
            f"local segment file missing on host {socket.gethostname()}: local-tier tasks "
            "read the sidecar host's log dirs, so their executors must run there (or the "
            "broker deleted the segment after the plan); docs/spark-cluster.md",
            file=task.location,
        ) from None
    try:
        return os.pread(fd, task.size, task.start)
    finally:
        os.close(fd)


#: Timestamps (ms) whose µs value fits Arrow's int64 timestamp column.
_MAX_TS_MS = ((1 << 63) - 1) // 1000
_MIN_TS_MS = -((1 << 63) // 1000)


def _timestamp_range(batch: RecordBatch) -> CorruptRecordError:
    return CorruptRecordError(
        "a record timestamp does not fit int64 microseconds",
        position=batch.position,
        offset=batch.base_offset,
    )


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
                if not _MIN_TS_MS <= ts <= _MAX_TS_MS:
                    raise _timestamp_range(batch)
                headers = [(h.key, h.value) for h in r.headers] if r.headers else None
                yield r.key, r.value, o, ts, ts_type, headers
    except RlmError as err:
        raise _in_task(task, err) from err


def _in_task(task: ReadTask, err: RlmError) -> RlmError:
    """``err`` prefixed with the object/file, segment and byte range the task read."""
    where = f"{task.source} {task.location} (segment {task.base_offset}, byte range starting at {task.start})"
    clone = copy.copy(err)  # the same class: it, not the text, says what went wrong
    clone.reason, clone.file, clone.position, clone.offset = f"{where}: {err}", None, None, None
    clone.args = (clone.reason,)
    return clone


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
    """Arrow record batches (schema :func:`arrow_schema`) of the task's records, ``rows_per_batch``
    rows each but the last; decoded by the compiled decoder unless the Python one was chosen
    (docs/decoder.md). Both give the same rows, batches and errors."""
    if native.active_decoder() == "native":
        return _native_task_to_arrow(task, data, rows_per_batch)
    return _python_task_to_arrow(task, data, rows_per_batch)


def _native_task_to_arrow(task: ReadTask, data: bytes, rows_per_batch: int) -> Iterator[Any]:
    from rlm.jobs.reading.columns import to_record_batch

    schema = arrow_schema()
    window = native.Window(task.min_offset, task.max_offset, task.start_ts, task.end_ts)
    builder = native.Builder()
    ts_lo = task.start_ts

    def emit(n: int) -> Any:
        return to_record_batch(native.take(builder, n), task.topic, task.partition, schema)

    try:
        for batch in _task_batches(task, data):
            if batch.is_control or batch.last_offset < window.lo or batch.base_offset > window.hi:
                continue
            if ts_lo is not None and batch.max_timestamp < ts_lo:
                continue
            native.add_batch(builder, data, batch, window)
            while builder.rows >= rows_per_batch:
                yield emit(rows_per_batch)
            if builder.pending_bytes >= native.FLUSH_BYTES:  # Arrow's int32 offsets: docs/decoder.md
                yield emit(builder.rows)
    except RlmError as err:
        raise _in_task(task, err) from err
    if builder.rows:
        yield emit(builder.rows)


def _python_task_to_arrow(task: ReadTask, data: bytes, rows_per_batch: int) -> Iterator[Any]:
    import pyarrow as pa

    schema = arrow_schema()
    cols: tuple[list[Any], ...] = ([], [], [], [], [], [])

    def flush() -> Any:
        keys_, values, offsets, stamps, types, headers = cols
        n = len(offsets)
        stamps_us = pa.array([t * 1000 for t in stamps], pa.int64())
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array(keys_, pa.binary()),
                pa.array(values, pa.binary()),
                pa.array([task.topic] * n, pa.string()),
                pa.array([task.partition] * n, pa.int32()),
                pa.array(offsets, pa.int64()),
                stamps_us.cast(pa.timestamp("us", tz="UTC")),
                pa.array(types, pa.int32()),
                pa.array(headers, schema.field("headers").type),
            ],
            schema=schema,
        )
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
