"""The local export engine (``rlm export --engine local``): the Spark job's plan, decoder and
layout in one process with pyarrow, no JVM (docs/export.md).

The tasks of :func:`rlm.jobs.reading.plan.plan_read` run in a pool of ``parallelism`` workers; each
reads its byte range, decodes it with :func:`rlm.jobs.reading.decode.task_to_arrow` and hands the Arrow
batches to the :class:`~rlm.jobs.tables.sink.Sink` (which writes files on the worker); the driver
commits once every task succeeded and aborts the sink otherwise. Workers are threads when most
of a task runs without the GIL (:func:`gil_light`: the compiled decoder) and processes otherwise,
so both cores work either way; a process worker writes its own files, so no record crosses a process
boundary.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from typing import Literal

from rlm.config import Settings
from rlm.errors import InvalidArgumentError
from rlm.formats.records import native
from rlm.jobs.reading import DEFAULT_TARGET_BYTES, BackendSpec, ReadPlan, ReadTask, decode, plan_read
from rlm.jobs.tables.sink import DataFile, ExportResult, ParquetSink, Sink, run_task
from rlm.tiering.read import check_isolation

__all__ = [
    "PoolKind",
    "default_parallelism",
    "export_local",
    "gil_light",
    "pool_kind",
    "run_sink",
    "run_task",
]

log = logging.getLogger(__name__)

PoolKind = Literal["auto", "thread", "process", "inline"]


def default_parallelism() -> int:
    """Workers when ``--parallelism`` is not given: the CPUs this process may run on (its
    affinity mask where the OS has one, else ``os.cpu_count()``)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def pool_kind(requested: PoolKind, parallelism: int, tasks: int) -> PoolKind:
    """The pool that runs ``tasks`` tasks: ``inline`` (this thread) for one worker or task,
    else threads when most of a task runs without the GIL (:func:`gil_light`), processes when
    it does not."""
    if requested == "inline" or parallelism <= 1 or tasks <= 1:
        return "inline"
    if requested != "auto":
        return requested
    return "thread" if gil_light() else "process"


def gil_light() -> bool:
    """Whether a task spends most of its time without the GIL: with a decoder that releases it
    (``rlm.jobs.reading.decode.RELEASES_GIL``), or with the compiled decoder — its per-record work is C,
    and the rest of a task (the Parquet write, the reads, the fsyncs) releases the GIL. Threads
    then beat processes, which pay a fork and a hand-off per task (bench/export_bench.py:
    ``local`` vs ``local_processes``, BENCHMARKS.md). The pure-Python decoder holds the
    GIL for most of a task: processes."""
    return bool(getattr(decode, "RELEASES_GIL", False)) or native.active_decoder() == "native"


def _executor(kind: PoolKind, workers: int) -> Executor:
    if kind == "thread":
        return ThreadPoolExecutor(workers, "rlm-export")
    return ProcessPoolExecutor(workers, mp_context=_process_context())


def _process_context() -> multiprocessing.context.BaseContext:
    """``fork`` when this process runs one thread (no other thread can hold a lock the child
    inherits; the workers start in ms and re-import nothing — the pool forks them all at the first
    submit, before its own manager thread starts), else ``forkserver`` (a clean server process
    forks the workers). Either way a child builds its own store clients: the backend cache is
    cleared after a fork (rlm.jobs.reading.plan)."""
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    if "forkserver" not in methods:
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["rlm.jobs.tables.export_local", "pyarrow.parquet"])  # imported once
    return ctx


def run_sink(
    plan: ReadPlan, spec: BackendSpec, sink: Sink, *, parallelism: int | None = None, pool: PoolKind = "auto"
) -> list[DataFile]:
    """Run every task of ``plan`` through ``sink`` on ``parallelism`` workers (default: the CPU
    count), then commit the sink; on any failure (or interrupt) cancel what is left, abort the
    sink and re-raise. Returns the committed files in task order."""
    workers = default_parallelism() if parallelism is None else parallelism
    if workers < 1:
        raise InvalidArgumentError(f"parallelism {workers} must be at least 1")
    tasks = plan.tasks
    kind = pool_kind(pool, workers, len(tasks))
    log.info("local export: %d tasks on %d %s worker(s)", len(tasks), workers, kind)
    try:
        if kind == "inline":
            results = [run_task(sink, spec, i, t) for i, t in enumerate(tasks)]
        else:
            results = _run_pool(kind, min(workers, len(tasks)), sink, spec, tasks)
        files = [f for per_task in results for f in per_task]
        sink.commit(files)
    except BaseException:
        sink.abort()
        raise
    return files


def _run_pool(
    kind: PoolKind, workers: int, sink: Sink, spec: BackendSpec, tasks: Sequence[ReadTask]
) -> list[list[DataFile]]:
    executor = _executor(kind, workers)
    try:
        futures: dict[Future[list[DataFile]], int] = {
            executor.submit(run_task, sink, spec, i, t): i for i, t in enumerate(tasks)
        }
        results: list[list[DataFile]] = [[] for _ in tasks]
        for fut in as_completed(futures):
            results[futures[fut]] = fut.result()  # the first failure ends the export
    finally:
        # On failure: drop queued tasks and wait for running ones, so none writes after abort.
        executor.shutdown(wait=True, cancel_futures=True)
    return results


def export_local(
    settings: Settings,
    topics: Sequence[str] | None,
    out: str | os.PathLike[str],
    *,
    partitions: Sequence[int] | None = None,
    start: int | None = None,
    end: int | None = None,
    target_bytes: int = DEFAULT_TARGET_BYTES,
    overwrite: bool = False,
    compression: str = "snappy",
    isolation: str = "read_uncommitted",
    parallelism: int | None = None,
    pool: PoolKind = "auto",
) -> ExportResult:
    """:func:`rlm.jobs.export` without Spark: the same plan, rows and Parquet layout under
    ``out`` (a local path), written to a staging dir next to ``out`` and renamed at the end.
    ``out`` must not exist unless ``overwrite`` (then it is replaced only once the export
    succeeded). Records are counted from what the workers wrote."""
    plan = plan_read(
        settings,
        topics,
        partitions,
        start=start,
        end=end,
        target_bytes=target_bytes,
        isolation=check_isolation(isolation),
    )
    sink = ParquetSink.begin(out, overwrite=overwrite, compression=compression)
    files = run_sink(plan, BackendSpec.from_settings(settings), sink, parallelism=parallelism, pool=pool)
    return ExportResult.of_plan(str(out), plan, sum(f.records for f in files), engine="local")
