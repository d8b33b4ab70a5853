"""Spark test fixtures: ONE local[2] SparkSession for the whole run, tiered log dirs, and an
independent decoder (kafka-python's ``MemoryRecords``) of the original ``.log`` files."""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rlm.config import Settings, settings_from_mapping
from rlm.formats.compression import Compression
from rlm.formats.records import (
    Header,
    Record,
    RecordSpec,
    TimestampType,
    encode_control_key,
    encode_end_txn_marker,
)
from rlm.logdir.discovery import discover_partitions, list_segments, partition_state, read_checkpoints
from rlm.logdir.writer import LogWriter
from rlm.storage.registry import create_backend, open_backend
from rlm.tiering.manager import RemoteLogManager
from tests.storage.conftest import aws_env, moto_endpoint  # noqa: F401  (fixtures for the s3 tests)
from tests.tiering.helpers import roll_after_last

pytest.importorskip("pyspark")
pytest.importorskip("pandas")

#: (offset, timestamp, key, value, headers) — what a Kafka consumer sees of one record.
Rec = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from rlm.jobs import spark_session

    session = spark_session(
        "local[2]",
        "rlm-tests",
        progress=False,
        conf={
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.driver.memory": "1g",
            "spark.python.worker.reuse": "true",
        },
    )
    yield session
    session.stop()


def executor_pythonpath() -> str:
    """Where this run imports rlm and the s3 plugin from: the executors' ``PYTHONPATH``, which
    stands for "rlm + plugin installed on the executors" (docs/spark-cluster.md)."""
    import rlm_storage_s3

    import rlm

    return os.pathsep.join(
        dict.fromkeys(str(Path(m.__file__).resolve().parent.parent) for m in (rlm, rlm_storage_s3))
    )


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Spark standalone master and two workers (1 core, 1 GiB each) for the whole run."""
    from rlm.testing.spark_cluster import SparkCluster

    with SparkCluster(
        tmp_path_factory.mktemp("spark-cluster"),
        workers=2,
        executor_env={"PYTHONPATH": executor_pythonpath()},
    ) as cluster:
        yield cluster


@pytest.hookimpl(tryfirst=True)  # before tests/conftest.py groups the spark tests (tests/xdist_groups.py)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/spark/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.spark)


@dataclass
class Env:
    """A log dir set + a store, tiered once."""

    log_dirs: list[Path]
    settings: Settings
    root: Path

    @property
    def backend(self) -> Any:
        return create_backend(self.settings.remote.backend, self.settings.remote.options)


def make_settings(
    log_dirs: list[Path], backend: str = "local", options: dict[str, Any] | None = None, **tiering: Any
) -> Settings:
    tiering.setdefault("gc_grace_ms", 0)
    return settings_from_mapping(
        {
            "log": {"dirs": [str(d) for d in log_dirs]},
            "remote": {"backend": backend, "options": options or {}},
            "tiering": tiering,
            # Fixture topics carry a 1-day Kafka retention.ms that would delete what these jobs read.
            "topics": {"follow_kafka_configs": False},
            # The fixtures come from three clusters whose brokers were stopped: no leaders recorded.
            "cluster": {"leadership": "always"},
        }
    )


def tier(settings: Settings) -> None:
    remote = settings.remote  # the store as rlm opens it: with its key layout (docs/key-spread.md)
    manager = RemoteLogManager(settings, open_backend(remote.backend, remote.options, remote.prefix_spread))
    results = manager.run_once()
    assert all(r.error is None for r in results), [r.error for r in results]
    assert any(r.copied for r in results)


def txn_env(root: Path) -> tuple[Settings, Any]:
    """A transactional partition ``txn-0`` (one transaction left open) tiered with small entries,
    its local log trimmed to the last 3 segments so reads plan remote and local tasks both;
    returns the settings and the kafka-python oracle (tests/tiering/txn_helpers.py)."""
    from tests.lookup.helpers import delete_local_segments
    from tests.tiering.txn_helpers import Oracle, write_txn_log

    logs = root / "logs"
    write_txn_log(logs, "txn", 0, seed=5, leave_open=True)
    oracle = Oracle.of(logs / "txn-0")
    settings = make_settings(
        [logs], options={"root": str(root / "store")}, index_entry_bytes=2_000, state_dir=str(root / "state")
    )
    tier(settings)
    delete_local_segments(logs / "txn-0", keep_last=3)
    return settings, oracle


def copy_fixture_dirs(fixtures_dir: Path, dst: Path) -> list[Path]:
    """A private copy of every fixture log dir, each partition rolled (empty next segment)."""
    dirs = []
    for src in sorted((fixtures_dir / "kafka-logs").iterdir()):
        d = dst / src.name
        shutil.copytree(src, d)
        for part in sorted(p for p in d.iterdir() if p.is_dir()):
            if any(part.glob("*.log")):
                roll_after_last(part)
        dirs.append(d)
    return dirs


CODECS = [Compression.NONE, Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD]
BASE_TS = 1_700_000_000_000


def write_generated(
    log_dir: Path,
    topic: str,
    partition: int,
    codec: Compression,
    *,
    seed: int,
    batches: int = 48,
    log_append_time: bool = False,
) -> None:
    """A partition of several segments: out-of-order timestamps, null keys/values, headers, a
    transaction marker (control batch) every 16 batches. The last segment stays active (local)."""
    rng = random.Random(seed)
    with LogWriter(
        log_dir,
        topic,
        partition,
        segment_bytes=48 * 1024,
        index_interval_bytes=1024,
        clock=lambda: BASE_TS + 777,
    ) as w:
        for i in range(batches):
            specs = []
            for j in range(rng.randint(1, 12)):
                ts = BASE_TS + i * 1000 + j * 10 - rng.randint(0, 1500)  # timestamps go backwards too
                key = None if rng.random() < 0.1 else f"k{rng.randint(0, 99)}".encode()
                value = None if rng.random() < 0.05 else rng.randbytes(rng.randint(0, 900))
                headers = tuple(
                    Header(f"h{n}", None if n == 2 else rng.randbytes(3))
                    for n in range(rng.choice([0, 0, 1, 3]))
                )
                specs.append(RecordSpec(ts, key, value, headers))
            w.append(
                specs,
                compression=codec,
                timestamp_type=TimestampType.LOG_APPEND_TIME
                if log_append_time
                else TimestampType.CREATE_TIME,
            )
            if i % 16 == 15:
                marker = Record(
                    w.log_end_offset, BASE_TS + i * 1000, encode_control_key(1), encode_end_txn_marker(0)
                )
                w.append([marker], is_control=True, is_transactional=True, producer_id=7, producer_epoch=0)


def generated_env(root: Path) -> Env:
    log_dir = root / "gen-logs"
    log_dir.mkdir(parents=True)
    for p, codec in enumerate(CODECS):
        write_generated(log_dir, "gen", p, codec, seed=p, log_append_time=(p == 4))
    write_generated(log_dir, "other", 0, Compression.ZSTD, seed=99, batches=20)
    settings = make_settings([log_dir], options={"root": str(root / "store")}, index_entry_bytes=8192)
    tier(settings)
    return Env([log_dir], settings, root)


@pytest.fixture(scope="session")
def fixture_env(fixtures_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Env:
    """The real-broker fixtures, tiered over the local backend (read-only: do not modify)."""
    root = tmp_path_factory.mktemp("fixtures-tiered")
    dirs = copy_fixture_dirs(fixtures_dir, root / "logs")
    settings = make_settings(dirs, options={"root": str(root / "store")})
    tier(settings)
    return Env(dirs, settings, root)


@pytest.fixture(scope="session")
def gen_env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    """LogWriter partitions (every codec), tiered (read-only: do not modify)."""
    return generated_env(tmp_path_factory.mktemp("gen-tiered"))


# --- the independent decoder ---------------------------------------------------------------------


def kafka_python_records(partition_dir: Path) -> list[Rec]:
    """Every non-control record of the partition's ``.log`` files, decoded by kafka-python, that a
    consumer may read (offset < the high watermark), in offset order.

    A partition without a high watermark in its log dir's checkpoint has nothing provably
    committed under ``log.eligibility = "high-watermark"`` (docs/visibility.md): none. The
    fixtures' only such partition is the KRaft metadata log, which is never tiered either.
    """
    from kafka.record.memory_records import MemoryRecords

    out: dict[int, Rec] = {}
    for seg in list_segments(partition_dir):
        records = MemoryRecords(seg.log.read_bytes())
        while True:
            batch = records.next_batch()
            if batch is None:
                break
            if getattr(batch, "is_control_batch", False):
                continue
            for r in batch:
                headers = tuple((k, v) for k, v in (getattr(r, "headers", None) or []))
                out[r.offset] = (r.offset, r.timestamp, r.key, r.value, headers)
    parts = [p for p in discover_partitions([partition_dir.parent]) if p.path == partition_dir]
    hw = partition_state(parts[0], read_checkpoints(partition_dir.parent)).high_watermark
    return [out[o] for o in sorted(out) if hw is not None and o < hw]


def arrow_records(table: Any) -> dict[tuple[str, int], list[Rec]]:
    """A Kafka-schema Arrow table (``df.toArrow()`` or Parquet) → per partition, records in offset
    order, timestamps in ms."""
    import pyarrow as pa

    col = table.column("timestamp")
    per_ms = {"s": None, "ms": 1, "us": 1000, "ns": 1_000_000}[col.type.unit]
    assert per_ms is not None
    millis = [None if v is None else v // per_ms for v in col.cast(pa.int64()).to_pylist()]
    out: dict[tuple[str, int], list[Rec]] = {}
    cols = {
        name: table.column(name).to_pylist()
        for name in ("topic", "partition", "offset", "key", "value", "headers")
    }
    for i, ms in enumerate(millis):
        headers = tuple((h["key"], h["value"]) for h in (cols["headers"][i] or []))
        out.setdefault((cols["topic"][i], int(cols["partition"][i])), []).append(
            (cols["offset"][i], ms, cols["key"][i], cols["value"][i], headers)
        )
    for recs in out.values():
        recs.sort()
    return out


def check_jobs_on_store(spark: Any, log_dir: Path, topic: str, backend: str, options: dict[str, Any]) -> str:
    """Three partitions of ``topic`` (three codecs) tiered to ``backend``: ``read_tiered`` returns
    every record from both tiers as kafka-python decodes them, deep ``verify`` is clean, and after
    one byte of a remote ``.log`` is flipped through the backend, verify names that object, whose
    key is returned."""
    from rlm.jobs import plan_read, read_tiered, verify

    log_dir.mkdir()
    for p, codec in enumerate(CODECS[1:4]):
        write_generated(log_dir, topic, p, codec, seed=10 + p, batches=32)
    settings = make_settings([log_dir], backend=backend, options=options, index_entry_bytes=8192)
    tier(settings)
    plan = plan_read(settings, [topic], target_bytes=20_000)
    assert {t.source for t in plan.tasks} == {"remote", "local"}

    got = arrow_records(read_tiered(spark, settings, [topic], target_bytes=20_000).toArrow())
    expected = {(p.topic, p.partition): kafka_python_records(p.path) for p in discover_partitions([log_dir])}
    assert got == expected
    assert verify(spark, settings, deep=True).ok

    victim = plan.partitions[0].manifests[0].log.key
    store = create_backend(backend, options)
    data = bytearray(store.read(victim))
    data[100] ^= 0x01
    store.put(victim, bytes(data))
    report = verify(spark, settings, deep=True)
    assert not report.ok
    assert {(p.check, p.key) for p in report.errors} >= {("object_crc32c", victim)}
    assert any(p.check in ("batch_crc", "batch_corrupt") and p.key == victim for p in report.errors)
    return victim
