"""``rlm restore`` after a broker lost its data disk (docs/restore.md, "After losing a broker's
disk"): the partitions come from the cluster's KRaft metadata log when ``log.dirs`` has no
directory for them, and the stub directory the docs have an operator make (only a
``partition.metadata``) is replaced when ``--out`` is that log dir. Found beside a live broker
(tests/live/test_restore_broker.py): both refused before."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rlm.config import Settings, settings_from_mapping
from rlm.errors import ExportOutputExistsError, PartitionNotFoundError
from rlm.formats.partition_metadata import format_partition_metadata
from rlm.formats.records import RecordSpec
from rlm.jobs.restore import restore
from rlm.logdir.discovery import PARTITION_METADATA
from rlm.logdir.writer import LogWriter
from rlm.storage.registry import create_backend
from rlm.testing.kraft import MetadataLogBuilder, new_topic_id
from tests.jobs.restore_helpers import check_loadable
from tests.spark.conftest import kafka_python_records, tier

TOPIC = "lost"
#: partition -> its replicas in the cluster's metadata; this broker is node 1
REPLICAS = [[1], [2], [2, 1]]


def _settings(root: Path, *, metadata: bool) -> Settings:
    topics: dict[str, object] = {"follow_kafka_configs": False}
    if metadata:
        topics["metadata_log_dir"] = str(root / "meta" / "__cluster_metadata-0")
    return settings_from_mapping(
        {
            "log": {"dirs": [str(root / "logs")]},
            "remote": {"backend": "local", "options": {"root": str(root / "store")}},
            "tiering": {"gc_grace_ms": 0},
            "topics": topics,
            "cluster": {"leadership": "always"},
        }
    )


def _tiered_then_lost(root: Path) -> tuple[str, dict[int, list[object]]]:
    """Three partitions written and tiered, the cluster's metadata log beside them; then every
    partition directory is gone (the disk), ``meta.properties`` (node 1) is re-made by the format."""
    logs = root / "logs"
    topic_id = new_topic_id()
    with MetadataLogBuilder(root / "meta") as meta:
        meta.create_topic(TOPIC, REPLICAS, topic_id=topic_id)
    for p in range(len(REPLICAS)):
        with LogWriter(logs, TOPIC, p, segment_bytes=2048, topic_id=topic_id) as w:
            for i in range(80):
                w.append([RecordSpec(1_700_000_000_000 + i, f"k{i}".encode(), f"{p}-{i:04d}".encode() * 8)])
    tier(_settings(root, metadata=False))
    records = {p: kafka_python_records(logs / f"{TOPIC}-{p}") for p in range(len(REPLICAS))}
    shutil.rmtree(logs)
    logs.mkdir()
    (logs / "meta.properties").write_text("version=1\nnode.id=1\ncluster.id=AAAAAAAAAAAAAAAAAAAAAA\n")
    return topic_id, records


def _check_restored(out: Path, topic_id: str, records: list[object]) -> None:
    check_loadable(out)
    assert (out / PARTITION_METADATA).read_bytes() == format_partition_metadata(topic_id)
    got = kafka_python_records(out)
    assert got and got == records[: len(got)]


def test_partitions_of_a_lost_disk_come_from_the_metadata_log(tmp_path: Path) -> None:
    topic_id, records = _tiered_then_lost(tmp_path)
    backend = create_backend("local", {"root": str(tmp_path / "store")})
    logs = tmp_path / "logs"
    with pytest.raises(PartitionNotFoundError, match=r"topic lost is not in log.dirs .*, and no KRaft"):
        restore(_settings(tmp_path, metadata=False), backend, TOPIC, logs)

    result = restore(_settings(tmp_path, metadata=True), backend, TOPIC, logs)
    # only the partitions whose replicas include this broker (node.id 1 of meta.properties)
    assert [(p.partition, p.topic_id, p.skipped) for p in result.partitions] == [
        (0, topic_id, None),
        (2, topic_id, None),
    ]
    assert sorted(p.name for p in logs.iterdir() if p.is_dir()) == ["lost-0", "lost-2"]
    for p in (0, 2):
        _check_restored(logs / f"{TOPIC}-{p}", topic_id, records[p])


def test_a_named_partition_comes_from_the_metadata_log_whoever_hosts_it(tmp_path: Path) -> None:
    topic_id, records = _tiered_then_lost(tmp_path)
    backend = create_backend("local", {"root": str(tmp_path / "store")})
    out = tmp_path / "elsewhere"
    result = restore(_settings(tmp_path, metadata=True), backend, TOPIC, out, partitions=[1])
    assert [p.partition for p in result.partitions] == [1]
    _check_restored(out / f"{TOPIC}-1", topic_id, records[1])
    with pytest.raises(PartitionNotFoundError, match=r"lost-7 is not in log.dirs .* nor in the metadata log"):
        restore(_settings(tmp_path, metadata=True), backend, TOPIC, out, partitions=[7])


def test_the_partition_metadata_stub_in_the_log_dir_is_replaced(tmp_path: Path) -> None:
    """docs/restore.md: an empty ``<topic>-<partition>/`` with the topic's ``partition.metadata``
    names the incarnation; restoring into that same log dir needs no ``--overwrite``."""
    topic_id, records = _tiered_then_lost(tmp_path)
    backend = create_backend("local", {"root": str(tmp_path / "store")})
    logs = tmp_path / "logs"
    stub = logs / f"{TOPIC}-0"
    stub.mkdir()
    (stub / PARTITION_METADATA).write_bytes(format_partition_metadata(topic_id))
    restore(_settings(tmp_path, metadata=False), backend, TOPIC, logs)
    _check_restored(stub, topic_id, records[0])

    # anything more than the stub is still data a restore does not replace unasked
    (logs / f"{TOPIC}-0" / "00000000000000000000.log").unlink()
    (logs / f"{TOPIC}-0" / "stray").write_bytes(b"x")
    with pytest.raises(ExportOutputExistsError, match="already exists"):
        restore(_settings(tmp_path, metadata=False), backend, TOPIC, logs, partitions=[0])
