"""The jobs on a real Spark standalone cluster (a master and two workers from pyspark's jars,
:mod:`rlm.testing.spark_cluster`), run through the CLI as a user runs them: ``rlm export``,
``rlm verify --deep`` and ``rlm rebuild-index`` with ``--spark-master spark://...``, all three
against a SeaweedFS S3 server and the export against the local store too (each Spark job costs tens
of seconds on two cores; the three read the store through the same executor code). Results must
equal the same job on ``local[2]``.

Executors are other JVMs whose Python workers run in their own working directories: the configs
here use paths relative to the CLI's working directory (the driver resolves them), and every test
checks, from the executors' own logs, that tasks ran on executors of both workers.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rlm.formats.compression import Compression
from rlm.jobs import export, rebuild_index, verify
from rlm.testing.toml import toml_value
from tests.spark.conftest import Env, arrow_records, make_settings, tier, write_generated

pytestmark = [pytest.mark.spark_cluster, pytest.mark.slow, pytest.mark.integration]

TOPICS = ["gen", "other"]
#: For the jobs meant to fail: no task retries (Spark settings reach `rlm` through
#: PYSPARK_SUBMIT_ARGS, as docs/spark-cluster.md tells users).
FAIL_FAST = {
    "SPARK_LOCAL_IP": "127.0.0.1",
    "PYSPARK_SUBMIT_ARGS": "--conf spark.task.maxFailures=1 pyspark-shell",
}


def write_config(env: Env, cwd: Path) -> Path:
    """``env``'s settings as a TOML file in ``cwd`` whose log dirs (and local store root) are
    relative to ``cwd``: only the driver can resolve them."""
    remote = env.settings.remote
    options = dict(remote.options)
    if remote.backend == "local":
        options["root"] = os.path.relpath(options["root"], cwd)
    dirs = [os.path.relpath(d, cwd) for d in env.log_dirs]
    text = "\n".join(
        [
            "[log]",
            f"dirs = {toml_value(dirs)}",
            "[remote]",
            f"backend = {toml_value(remote.backend)}",
            "[remote.options]",
            *(f"{k} = {toml_value(v)}" for k, v in options.items()),
            "[tiering]",
            "gc_grace_ms = 0",
            f"index_entry_bytes = {env.settings.tiering.index_entry_bytes}",
            "[topics]",
            "follow_kafka_configs = false",
            "[cluster]",
            'leadership = "always"',
            "",
        ]
    )
    path = cwd / "rlm.toml"
    path.write_text(text)
    return path


def run_cli(cluster: Any, cwd: Path, *args: str, ok_codes: tuple[int, ...] = (0,)) -> str:
    """``python -m rlm <args> --spark-master <the cluster>`` in ``cwd``; its stdout."""
    # The driver binds to loopback like the daemons (a user's driver binds to its host's address).
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    proc = subprocess.run(
        [sys.executable, "-m", "rlm", *args, "--spark-master", cluster.master_url],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode in ok_codes, f"rlm {args[0]} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    return proc.stdout


def error_line(stderr: str) -> str:
    """The CLI's one error line (the JVM may log a WARN line or two after it, as it shuts down)."""
    lines = [line for line in stderr.splitlines() if line.startswith("rlm: error: ")]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def assert_ran_on_executors(cluster: Any, app_name: str) -> None:
    """The application's tasks ran in executors on both workers, none in the driver."""
    logs = cluster.executor_logs(cluster.app_id(app_name))
    assert {k.split("/")[0] for k in logs} == {"worker-0", "worker-1"}, sorted(logs)
    finished = {k: text.count("Finished task") for k, text in logs.items()}
    assert sum(finished.values()) > 0, finished


def parquet_layout(out: Path) -> set[str]:
    return {str(p.parent.relative_to(out)) for p in out.rglob("*.parquet")}


def export_equal_to_local(spark: Any, cluster: Any, env: Env, cwd: Path, config: Path) -> None:
    doc = json.loads(
        run_cli(
            cluster,
            cwd,
            "export",
            "--config",
            config.name,
            "--topic",
            TOPICS[0],
            "--topic",
            TOPICS[1],
            "--out",
            "out",
            "--task-mib",
            "1",
        )
    )
    assert_ran_on_executors(cluster, "rlm export")
    import pyarrow.parquet as pq

    ref = cwd / "ref"
    expected = export(spark, env.settings, TOPICS, str(ref), target_bytes=1024 * 1024)
    assert doc == {**expected.to_json(), "out": "out"}
    assert doc["records"] > 0 and doc["tasks"] > 1
    assert parquet_layout(cwd / "out") == parquet_layout(ref)  # written under the driver's cwd
    assert arrow_records(pq.read_table(cwd / "out")) == arrow_records(pq.read_table(ref))


def verify_equal_to_local(spark: Any, cluster: Any, env: Env, cwd: Path, config: Path) -> None:
    run_cli(cluster, cwd, "verify", "--deep", "--config", config.name, "--report", "report.json")
    assert_ran_on_executors(cluster, "rlm verify")
    got = json.loads((cwd / "report.json").read_text())
    expected = verify(spark, env.settings, deep=True).to_json()
    assert got == expected
    assert got["ok"] and got["summary"]["batches_checked"] > 0


def tree(root: Path) -> dict[str, Any]:
    """Every file's bytes; of ``index-sets.json`` (set base offset → creation time) only the sets."""
    return {
        str(p.relative_to(root)): sorted(json.loads(p.read_bytes()))
        if p.name == "index-sets.json"
        else p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def rebuild_equal_to_local(
    spark: Any, cluster: Any, env: Env, tmp: Path, store_options: dict[str, Any] | None = None
) -> None:
    """Rebuild the index sets of two copies of ``env``'s log dirs (and state, and a local store):
    one on the cluster, one on local[2]; both trees must end up byte for byte the same."""
    copies = []
    for name in ("cluster", "local"):
        root = tmp / name
        shutil.copytree(env.root, root, ignore=shutil.ignore_patterns("weed"))
        copies.append(root)

    def settings_of(copy: Path) -> Env:
        dirs = [copy / d.relative_to(env.root) for d in env.log_dirs]
        store = Path(env.settings.remote.options.get("root", env.root))
        options = store_options or {"root": str(copy / store.relative_to(env.root))}
        return Env(
            dirs,
            make_settings(
                dirs,
                env.settings.remote.backend,
                options,
                index_entry_bytes=env.settings.tiering.index_entry_bytes,
            ),
            copy,
        )

    on_cluster, on_local = settings_of(copies[0]), settings_of(copies[1])
    config = write_config(on_cluster, copies[0])
    got = json.loads(run_cli(cluster, copies[0], "rebuild-index", "--config", config.name))
    assert_ran_on_executors(cluster, "rlm rebuild-index")
    expected = rebuild_index(spark, on_local.settings)
    assert got == expected and sum(got.values()) > 0
    for d, ld in zip(on_cluster.log_dirs, on_local.log_dirs, strict=True):
        assert tree(d) == tree(ld)
        assert tree(d.with_name(d.name + ".rlm-state")) == tree(ld.with_name(ld.name + ".rlm-state"))


# --- the local store -------------------------------------------------------------------------------


def test_the_cluster_has_two_alive_workers(spark_cluster: Any) -> None:
    workers = spark_cluster.alive_workers()
    assert len(workers) == 2 and all(w["cores"] == 1 for w in workers)


def test_export_on_the_cluster_equals_local(
    spark: Any, spark_cluster: Any, gen_env: Env, tmp_path: Path
) -> None:
    """The local-folder store read by executors, its root relative to the CLI's working directory.
    ``verify --deep`` and ``rebuild-index`` read the store the same way: they run on S3 below."""
    config = write_config(gen_env, tmp_path)
    export_equal_to_local(spark, spark_cluster, gen_env, tmp_path, config)


def test_iceberg_export_on_the_cluster_equals_the_parquet_export(
    spark: Any, spark_cluster: Any, gen_env: Env, tmp_path: Path
) -> None:
    """Executors write the table's data files, the driver commits (docs/iceberg.md); ``--out`` is
    relative to the CLI's working directory; a repeated ``--incremental`` run appends nothing."""
    pytest.importorskip("pyiceberg")
    import pyarrow.parquet as pq

    from rlm.jobs.tables.iceberg import IcebergTarget, load_table

    config = write_config(gen_env, tmp_path)
    args = [
        "export",
        "--config",
        config.name,
        "--topic",
        TOPICS[0],
        "--topic",
        TOPICS[1],
        "--format",
        "iceberg",
        "--out",
        "tbl",
        "--incremental",
    ]
    run_cli(spark_cluster, tmp_path, *args)
    assert_ran_on_executors(spark_cluster, "rlm export")
    table = load_table(IcebergTarget.from_settings(gen_env.settings, tmp_path / "tbl"))
    snapshots = len(table.snapshots())
    export(spark, gen_env.settings, TOPICS, str(tmp_path / "ref"))
    expected = arrow_records(pq.read_table(tmp_path / "ref"))
    assert arrow_records(table.scan().to_arrow()) == expected and expected
    again = json.loads(run_cli(spark_cluster, tmp_path, *args))
    assert again["snapshot_id"] is None and again["records"] == 0, again
    table = load_table(IcebergTarget.from_settings(gen_env.settings, tmp_path / "tbl"))
    assert arrow_records(table.scan().to_arrow()) == expected and len(table.snapshots()) == snapshots
    assert {f.file.file_path for f in table.scan().plan_files()} and all(
        f.file.file_path.startswith((tmp_path / "tbl").as_uri()) for f in table.scan().plan_files()
    )


def test_a_failed_task_is_one_line_naming_the_executors_error(
    spark_cluster: Any, gen_env: Env, tmp_path: Path
) -> None:
    """A corrupt batch in a remote object fails the export on an executor: the CLI prints that
    executor's exception (class, object, byte position), not the JVM's report, and exits 1."""
    root = tmp_path / "copy"
    shutil.copytree(gen_env.root, root)
    store = root / Path(gen_env.settings.remote.options["root"]).relative_to(gen_env.root)
    victim = sorted(store.glob("gen-2/data/*/segment.log"))[1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside some batch's CRC-covered bytes
    victim.write_bytes(bytes(data))
    dirs = [root / d.relative_to(gen_env.root) for d in gen_env.log_dirs]
    config = write_config(Env(dirs, make_settings(dirs, options={"root": str(store)}), root), tmp_path)
    env = {**os.environ, **FAIL_FAST}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlm",
            "export",
            "--config",
            config.name,
            "--topic",
            "gen",
            "--out",
            "out",
            "--spark-master",
            spark_cluster.master_url,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = error_line(proc.stderr)
    assert last.startswith("rlm: error: a Spark task failed: rlm.errors.CorruptRecordError: "), last
    assert str(victim.relative_to(store)) in last and "byte " in last, last
    assert not list((tmp_path / "out").rglob("*.parquet"))  # the aborted job committed nothing
    # One attempt, not Spark's default four: PYSPARK_SUBMIT_ARGS reached the job's Spark config.
    logs = spark_cluster.executor_logs(spark_cluster.app_id("rlm export"))
    assert sum(text.count("Exception in task") for text in logs.values()) == 1


def test_executors_with_another_rlm_than_the_driver_refuse_the_job(
    spark_cluster: Any, gen_env: Env, tmp_path: Path
) -> None:
    """The driver runs a copy of rlm with one changed line; the executors run this checkout's:
    the job fails on the executors with the one-line build mismatch, before reading anything."""
    import rlm

    src = tmp_path / "driver-src"
    shutil.copytree(Path(rlm.__file__).parent, src / "rlm", ignore=shutil.ignore_patterns("__pycache__"))
    with open(src / "rlm" / "jobs" / "reading" / "plan.py", "a") as f:
        f.write("# a driver built from other sources\n")
    config = write_config(gen_env, tmp_path)
    path = os.pathsep.join([str(src), *os.environ.get("PYTHONPATH", "").split(os.pathsep)])
    env = {**os.environ, **FAIL_FAST, "PYTHONPATH": path}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlm",
            "verify",
            "--config",
            config.name,
            "--spark-master",
            spark_cluster.master_url,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = error_line(proc.stderr)
    assert last.startswith(
        "rlm: error: a Spark task failed: rlm.errors.ExecutorEnvironmentError: "
        f"executor host {socket.gethostname()} runs rlm "
    ), last
    assert str(Path(rlm.__file__).parent) in last and "docs/spark-cluster.md" in last, last


def test_a_local_task_off_the_sidecar_host_names_the_host(tmp_path: Path) -> None:
    from rlm.errors import LogDirError
    from rlm.jobs.reading.decode import read_task_bytes
    from rlm.jobs.reading.plan import ReadTask

    task = ReadTask("t", 0, "local", str(tmp_path / "t-0" / "00000000000000000000.log"), 0, 100, 0, 9)
    with pytest.raises(LogDirError, match=f"missing on host {socket.gethostname()}.*spark-cluster.md"):
        read_task_bytes(task, None)


# --- an S3 server (SeaweedFS) ----------------------------------------------------------------------


@pytest.fixture
def s3_env(s3_target: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Env, dict[str, Any]]:
    """Four partitions (snappy, zstd, gzip, lz4) tiered to the session's S3 server (SeaweedFS,
    tests/s3servers.py), credentials in the options."""
    pytest.importorskip("rlm_storage_s3")
    root = tmp_path_factory.mktemp("cluster-s3")
    options = s3_target.options()
    log_dir = root / "logs"
    log_dir.mkdir()
    for p, codec in enumerate([Compression.SNAPPY, Compression.ZSTD, Compression.GZIP]):
        write_generated(log_dir, "gen", p, codec, seed=100 + p, batches=32)
    write_generated(log_dir, "other", 0, Compression.LZ4, seed=7, batches=16)
    settings = make_settings([log_dir], "s3", options, index_entry_bytes=8192)
    tier(settings)
    return Env([log_dir], settings, root), options


def test_jobs_on_the_cluster_over_s3_equal_local(
    spark: Any, spark_cluster: Any, s3_env: tuple[Env, dict[str, Any]], tmp_path: Path
) -> None:
    env, options = s3_env
    run = tmp_path / "run"
    run.mkdir()
    config = write_config(env, run)
    export_equal_to_local(spark, spark_cluster, env, run, config)
    verify_equal_to_local(spark, spark_cluster, env, run, config)
    rebuild_equal_to_local(spark, spark_cluster, env, tmp_path / "rebuild", store_options=options)
