"""``rlm export --engine local`` (rlm.jobs.tables.export_local) against an independent decoder
(kafka-python) of the original segments: rows, Spark's layout, worker pools, crash safety."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import threading
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlm.errors import ExportOutputExistsError, InvalidArgumentError, RlmError
from rlm.jobs import export_local, plan_read
from rlm.jobs.tables.export_local import _process_context, pool_kind
from rlm.logdir.discovery import discover_partitions
from rlm.testing.configs import write_config
from tests.jobs.helpers import corrupt_one_object, layout, read_export, sorted_rows
from tests.spark.conftest import Env, arrow_records, generated_env, kafka_python_records

pytest.importorskip("pyarrow")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    """LogWriter partitions of every codec, tiered (read-only)."""
    return generated_env(tmp_path_factory.mktemp("export-local"))


def _expected(env: Env, topics: set[str]) -> dict[tuple[str, int], list[Any]]:
    out = {}
    for part in discover_partitions(env.log_dirs):
        if part.topic in topics and (recs := kafka_python_records(part.path)):
            out[(part.topic, part.partition)] = recs
    return out


@pytest.mark.parametrize("pool", ["process", "thread", "inline"])
def test_every_codec_both_tiers_equal_kafka_python(env: Env, tmp_path: Path, pool: Any) -> None:
    out = tmp_path / "out"
    result = export_local(
        env.settings, ["gen", "other"], out, target_bytes=16 * 1024, parallelism=2, pool=pool
    )
    plan = plan_read(env.settings, ["gen", "other"], target_bytes=16 * 1024)
    assert {t.source for t in plan.tasks} == {"remote", "local"} and len(plan.tasks) > 6
    got = arrow_records(read_export(out))
    want = _expected(env, {"gen", "other"})
    assert got == want
    assert result.records == sum(len(v) for v in want.values())
    assert (result.tasks, result.engine) == (len(plan.tasks), "local")


def test_layout_is_sparks(env: Env, tmp_path: Path) -> None:
    out = tmp_path / "out"
    export_local(env.settings, ["gen"], out, partitions=[0, 4], target_bytes=16 * 1024)
    files = layout(out)  # asserts the part-<task>-<uuid>.c000.snappy.parquet names
    assert files.pop("_SUCCESS") == 0
    assert set(files) == {"topic=gen/partition=0", "topic=gen/partition=4"}
    assert all(n > 1 for n in files.values())  # one file per task
    path = next(out.glob("topic=gen/partition=4/*.parquet"))
    meta = pq.read_metadata(path)
    assert meta.schema.to_arrow_schema().names == [
        "key",
        "value",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    ts = meta.schema.column(3)
    assert (
        ts.physical_type == "INT64"
        and "timeUnit=microseconds" in str(ts.logical_type)
        and "isAdjustedToUTC=true" in str(ts.logical_type)
    )
    assert meta.row_group(0).column(1).compression == "SNAPPY"
    table = pq.read_table(path)
    assert set(table.column("timestampType").to_pylist()) == {1}  # partition 4: LogAppendTime
    assert table.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")


def test_partitions_time_range_and_empty(env: Env, tmp_path: Path) -> None:
    expected = _expected(env, {"gen"})
    stamps = sorted(r[1] for r in expected[("gen", 1)])
    start, end = stamps[len(stamps) // 3], stamps[2 * len(stamps) // 3]
    result = export_local(
        env.settings,
        ["gen"],
        tmp_path / "out",
        partitions=[1, 3],
        start=start,
        end=end,
        target_bytes=16 * 1024,
    )
    want = {tp: [r for r in expected[tp] if start <= r[1] < end] for tp in [("gen", 1), ("gen", 3)]}
    assert arrow_records(read_export(tmp_path / "out")) == want
    assert all(want.values()) and result.records == sum(len(v) for v in want.values())
    empty = export_local(env.settings, ["gen"], tmp_path / "empty", start=10**15)
    assert empty.records == 0 and layout(tmp_path / "empty") == {"_SUCCESS": 0}


def test_refuses_existing_out_and_overwrite_replaces_it(env: Env, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("old")
    with pytest.raises(ExportOutputExistsError, match="already exists"):
        export_local(env.settings, ["other"], out)
    assert [p.name for p in out.iterdir()] == ["keep"]
    result = export_local(env.settings, ["other"], out, overwrite=True)
    assert not (out / "keep").exists() and result.records == len(sorted_rows(out)) > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging or replaced dir left
    with pytest.raises(InvalidArgumentError, match="local paths"):
        export_local(env.settings, ["other"], "s3a://bucket/out")


@pytest.mark.parametrize("pool", ["process", "inline"])
def test_failed_export_leaves_nothing_at_out(tmp_path: Path, pool: Any) -> None:
    env = generated_env(tmp_path / "env")
    victim = corrupt_one_object(env.root / "store")
    out = tmp_path / "out"
    with pytest.raises(RlmError, match="CRC") as err:
        export_local(env.settings, ["gen", "other"], out, target_bytes=16 * 1024, parallelism=2, pool=pool)
    assert str(victim.relative_to(env.root / "store")) in str(err.value)  # names the object that failed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env"]  # no out, no staging dir
    out.mkdir()
    (out / "old").write_text("previous export")
    with pytest.raises(RlmError, match="CRC"):
        export_local(env.settings, ["gen"], out, overwrite=True, target_bytes=16 * 1024, pool=pool)
    assert [p.name for p in out.iterdir()] == ["old"]  # the previous export is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env", "out"]


def test_process_workers_with_other_threads_alive(env: Env, tmp_path: Path) -> None:
    """A multi-threaded caller gets forkserver workers (never a fork of a process whose other
    threads may hold locks): same rows as the inline run."""
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        assert _process_context().get_start_method() == "forkserver"
        export_local(
            env.settings, ["gen"], tmp_path / "fs", target_bytes=16 * 1024, parallelism=2, pool="process"
        )
    finally:
        stop.set()
        other.join()
    # Back to fork once this is the only thread (in a full run, other tests' server threads may
    # still be alive: then forkserver is right too).
    expected = "fork" if threading.active_count() == 1 else "forkserver"
    assert _process_context().get_start_method() == expected
    export_local(env.settings, ["gen"], tmp_path / "inline", pool="inline")
    assert sorted_rows(tmp_path / "fs") == sorted_rows(tmp_path / "inline")


def _cached_backends(_: object) -> int:
    from rlm.jobs.reading import plan

    return len(plan._BACKENDS)


def test_forked_worker_builds_its_own_store_client(env: Env) -> None:
    from rlm.jobs.reading.plan import BackendSpec

    BackendSpec.from_settings(env.settings).create()
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        assert list(pool.map(_cached_backends, [0])) == [0]  # the parent's client is not inherited
    assert _cached_backends(0) >= 1


def test_pool_kind() -> None:
    assert pool_kind("auto", 1, 10) == "inline"
    assert pool_kind("auto", 4, 1) == "inline"
    assert pool_kind("thread", 2, 10) == "thread"
    from rlm.formats.records import native

    try:
        native.set_decoder("python")  # holds the GIL for most of a task: processes
        assert pool_kind("auto", 2, 10) == "process"
        if native.extension_error() is None:
            native.set_decoder("native")
            assert pool_kind("auto", 2, 10) == "thread"
    finally:
        native.set_decoder(None)


def _rlm(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-m", "rlm", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_cli_defaults_to_the_local_engine(env: Env, tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.toml", env.log_dirs, root=env.root / "store")
    out = tmp_path / "out"
    base = ["export", "--config", str(cfg), "--topic", "gen", "--partition", "2", "--out", str(out)]
    done = _rlm(*base, "--task-mib", "1", "--parallelism", "2")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (
        summary["engine"] == "local"
        and summary["records"] == len(kafka_python_records(env.log_dirs[0] / "gen-2")) > 0
    )
    again = _rlm(*base)
    assert again.returncode == 1 and "already exists" in again.stderr
    wrong = _rlm(*base, "--overwrite", "--engine", "local", "--spark-master", "local[2]")
    assert wrong.returncode == 2 and "--spark-master needs --engine spark" in wrong.stderr
    wrong = _rlm(*base, "--overwrite", "--engine", "spark", "--parallelism", "2")
    assert wrong.returncode == 2 and "--parallelism" in wrong.stderr


def test_a_retried_task_rewrites_its_own_file_and_a_failed_one_leaves_none(env: Env, tmp_path: Path) -> None:
    """What a Spark retry does to a sink: the same index again gives the same single file; a
    write that fails part-way leaves no attempt file behind."""
    from rlm.jobs.reading.decode import read_task_bytes, task_to_arrow
    from rlm.jobs.reading.plan import BackendSpec
    from rlm.jobs.tables.export_local import run_task
    from rlm.jobs.tables.sink import ParquetSink

    task = plan_read(env.settings, ["other"]).tasks[0]
    spec = BackendSpec.from_settings(env.settings)
    sink = ParquetSink.begin(tmp_path / "out")
    first = run_task(sink, spec, 0, task)
    again = run_task(sink, spec, 0, task)
    assert first == again and len(first) == 1 and first[0].records > 0

    def breaks_after_one_batch() -> Any:
        yield next(iter(task_to_arrow(task, read_task_bytes(task, spec))))
        raise RlmError("the store went away")

    with pytest.raises(RlmError, match="went away"):
        sink.write_task(1, task, breaks_after_one_batch())
    sink.commit(again)
    assert layout(tmp_path / "out") == {"_SUCCESS": 0, "topic=other/partition=0": 1}
    assert not [p for p in (tmp_path / "out").rglob(".*")]  # no attempt file left
