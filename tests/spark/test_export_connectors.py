"""``rlm export --engine spark --out hdfs://… | s3a://…``: Spark's own Hadoop connectors write the
export, as docs/export.md ("HDFS and S3 outputs") tells users to run it, and Spark reads it back
through the same connector with every row and file (``part-<task index>`` per partition directory)
the local engine writes.

* ``hdfs://``: the session's MiniDFSCluster over its NameNode RPC, from the shared ``local[2]``
  session — pyspark's own Hadoop client (3.5.0) speaks it, no extra jar. The CLI (in-process, so
  it reuses that session), an export without rows, and a failed export (what it leaves at ``out``).
* ``s3a://``: the session's SeaweedFS through hadoop-aws (``make spark-s3a``) given to Spark only
  by ``PYSPARK_SUBMIT_ARGS`` (``--jars`` and ``spark.hadoop.fs.s3a.*``), in a subprocess: the test
  process's Spark has no S3A jars. On ``local[*]``, not the standalone cluster: a JVM of its own
  costs ~24 s already, the cluster's executors ~17 s more (measured; run once by hand, it passed).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rlm.cli.main import main
from rlm.errors import ExportOutputExistsError
from rlm.jobs import export, export_local
from rlm.testing.configs import write_config
from tests.jobs.helpers import corrupt_one_object, layout, sorted_rows, table_rows
from tests.needs import unavailable
from tests.spark.conftest import Env, generated_env
from tests.spark.hadoop_paths import (
    hadoop_files,
    hadoop_layout,
    layout_of,
    local_files,
    part_files,
    spark_rows,
)

REPO = Path(__file__).resolve().parents[2]
#: tools/spark-s3a/pom.xml's hadoop.version: the Hadoop client pyspark ships, which hadoop-aws must match.
SPARK_HADOOP_VERSION = "3.5.0"


def s3a_jars() -> list[Path]:
    """The S3A connector's jars (``make spark-s3a``; ``$RLM_SPARK_S3A_LIBS`` names another folder).
    Fails when pyspark's Hadoop is no longer the one they were fetched for."""
    import pyspark

    shipped = sorted(Path(pyspark.__file__).parent.glob("jars/hadoop-client-api-*.jar"))
    assert [p.name for p in shipped] == [f"hadoop-client-api-{SPARK_HADOOP_VERSION}.jar"], (
        f"pyspark ships {[p.name for p in shipped]}: move tools/spark-s3a/pom.xml, the Makefile's "
        "SPARK_HADOOP_VERSION and docs/export.md to its Hadoop version"
    )
    env = os.environ.get("RLM_SPARK_S3A_LIBS")
    libs = Path(env) if env else REPO / ".cache" / f"spark-s3a-{SPARK_HADOOP_VERSION}" / "libs"
    if not (libs / ".complete").is_file():
        unavailable(f"no S3A connector in {libs}: run `make spark-s3a` (Maven fetches it once)")
    return sorted(libs.glob("*.jar"))


def hdfs_base(hdfs_server: Any) -> str:
    """Where this run's HDFS is, for Hadoop's client: the MiniDFSCluster's NameNode RPC, or the
    WebHDFS URL of RLM_TEST_HDFS_URL (Hadoop's client speaks ``webhdfs://`` too)."""
    base = hdfs_server.rpc_url if hdfs_server is not None else os.environ["RLM_TEST_HDFS_URL"]
    return f"{base}/rlm-export-{uuid.uuid4().hex[:10]}"


@pytest.mark.hdfs
def test_cli_export_to_hdfs_equals_local_engine(
    spark: Any, gen_env: Env, hdfs_server: Any, tmp_path: Path
) -> None:
    base = hdfs_base(hdfs_server)
    config = write_config(tmp_path / "rlm.toml", gen_env.log_dirs, root=gen_env.root / "store")
    args = ["export", "--config", str(config), "--topic", "gen", "--topic", "other", "--engine", "spark"]
    result = CliRunner().invoke(main, [*args, "--out", f"{base}/out"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    local = export_local(gen_env.settings, ["gen", "other"], tmp_path / "local")
    assert doc == {**local.to_json(), "out": f"{base}/out", "engine": "spark"}
    rows = sorted_rows(tmp_path / "local")
    assert len(rows) > 1000 and spark_rows(spark, f"{base}/out") == rows
    files = hadoop_files(spark, f"{base}/out")
    assert layout_of(files) == layout(tmp_path / "local")
    assert part_files(files) == part_files(local_files(tmp_path / "local"))

    empty = export(spark, gen_env.settings, ["gen"], f"{base}/empty", start=10**15)
    assert empty.records == 0 and empty.tasks > 0
    assert hadoop_layout(spark, f"{base}/empty") == {"_SUCCESS": 0}


@pytest.mark.hdfs
def test_failed_export_to_hdfs_leaves_out_as_it_was(spark: Any, hdfs_server: Any, tmp_path: Path) -> None:
    """Staged beside ``out`` and renamed into place (docs/export.md, "HDFS and S3 outputs"): a
    failed export leaves nothing at ``out`` and nothing beside it, so the next export is not
    refused; a failed ``--overwrite`` keeps the previous export, a successful one replaces it."""
    base = hdfs_base(hdfs_server)
    env = generated_env(tmp_path / "env")
    good = export(spark, env.settings, ["other"], f"{base}/previous")
    before = hadoop_files(spark, f"{base}/previous")
    assert good.records > 0 and "_SUCCESS" in before
    rows = spark_rows(spark, f"{base}/previous")
    with pytest.raises(ExportOutputExistsError, match="already exists"):  # before any work
        export(spark, env.settings, ["other"], f"{base}/previous")
    corrupt_one_object(env.root / "store")
    with pytest.raises(Exception, match="CRC"):
        export(spark, env.settings, ["gen"], f"{base}/out")
    assert hadoop_files(spark, f"{base}/out") == []
    with pytest.raises(Exception, match="CRC"):
        export(spark, env.settings, ["gen"], f"{base}/previous", mode="overwrite")
    assert hadoop_files(spark, f"{base}/previous") == before
    assert spark_rows(spark, f"{base}/previous") == rows
    # Nothing staged or set aside is left, and out takes an export again.
    assert {f.split("/")[0] for f in hadoop_files(spark, base)} == {"previous"}
    again = export(spark, env.settings, ["other"], f"{base}/out")
    assert again.records == good.records and spark_rows(spark, f"{base}/out") == rows
    replaced = export(spark, env.settings, ["other"], f"{base}/previous", mode="overwrite", start=10**15)
    assert replaced.records == 0 and hadoop_layout(spark, f"{base}/previous") == {"_SUCCESS": 0}
    assert {f.split("/")[0] for f in hadoop_files(spark, base)} == {"previous", "out"}


def s3a_submit_args(jars: list[Path], target: Any) -> str:
    """``PYSPARK_SUBMIT_ARGS`` for ``target``'s S3 server, as docs/export.md writes them."""
    creds = target.credentials
    conf = {
        "fs.s3a.endpoint": target.endpoint,
        "fs.s3a.endpoint.region": creds.get("region") or "us-east-1",
        "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": str(target.endpoint.startswith("https:")).lower(),
        "fs.s3a.access.key": creds.get("access_key_id") or "",
        "fs.s3a.secret.key": creds.get("secret_access_key") or "",
    }
    if target.name == "seaweedfs":
        # A SeaweedFS without identities refuses the SDK's streaming-signed uploads; one signature
        # over the whole body is what boto3 sends it (docs/export.md).
        conf["fs.s3a.signing-algorithm"] = "AWS4SignerType"
    args = ["--jars", ",".join(map(str, jars)), "--conf", "spark.task.maxFailures=1"]
    for key, value in conf.items():
        args += ["--conf", f"spark.hadoop.{key}={value}"]
    return shlex.join([*args, "pyspark-shell"])


@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.integration
def test_cli_export_to_s3a_equals_local_engine(gen_env: Env, s3_target: Any, tmp_path: Path) -> None:
    jars = s3a_jars()
    out = f"s3a://{s3_target.bucket}/{s3_target.prefix}/export"
    config = write_config(tmp_path / "rlm.toml", gen_env.log_dirs, root=gen_env.root / "store")
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_SUBMIT_ARGS": s3a_submit_args(jars, s3_target),
    }
    cli = ["export", "--config", str(config), "--topic", "other", "--out", out, "--engine", "spark"]
    proc = subprocess.run(
        [sys.executable, "-m", "tests.spark.hadoop_paths", str(tmp_path), "--", *cli],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    local = export_local(gen_env.settings, ["other"], tmp_path / "local")
    assert json.loads(proc.stdout) == {**local.to_json(), "out": out, "engine": "spark"}

    import pyarrow.parquet as pq

    rows = sorted_rows(tmp_path / "local")
    assert len(rows) > 100 and table_rows(pq.read_table(tmp_path / "rows.parquet")) == rows
    files = json.loads((tmp_path / "files.json").read_text())
    assert layout_of(files) == layout(tmp_path / "local")
    assert part_files(files) == part_files(local_files(tmp_path / "local"))
    # The objects themselves, listed past Spark: the part files and _SUCCESS, nothing staged.
    keys = s3_target.client().list_objects_v2(Bucket=s3_target.bucket, Prefix=f"{s3_target.prefix}/")
    names = [o["Key"].removeprefix(f"{s3_target.prefix}/export/") for o in keys.get("Contents", [])]
    assert sorted(n for n in names if not n.endswith("/")) == files  # (a "dir/" key: a marker)
    assert "_SUCCESS" in files and len(files) > 2
