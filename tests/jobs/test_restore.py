"""``rlm restore`` (rlm.jobs.restore, docs/restore.md): real broker fixtures and LogWriter logs of
every codec are tiered by the real copy protocol, every local segment is deleted, and the restored
partition directories are compared with the originals — byte for byte (segments, the brokers'
indexes), through rlm's own reader and broker-file checks, and record by record with kafka-python's
independent codec; then from a real S3 server. Where the restored log starts and ends:
tests/jobs/test_restore_range.py; failures, targets and the CLI: tests/jobs/test_restore_cli.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlm.formats import naming
from rlm.formats.checkpoint import parse_leader_epoch_checkpoint
from rlm.formats.records import iter_batches
from rlm.jobs.restore import restore
from rlm.logdir.discovery import (
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    PARTITION_METADATA,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
)
from rlm.storage.registry import create_backend
from rlm.testing.configs import write_config
from rlm.testing.daemon import rlm_cli
from tests.jobs.restore_helpers import (
    SEGMENT_SUFFIXES,
    assert_restored,
    check_loadable,
    delete_local_logs,
    original_segments,
    read_checkpoint,
    records_by_partition,
    restore_settings,
    tier_generated_logs,
    tiered_partitions,
)
from tests.lookup.helpers import delete_local_segments
from tests.spark.conftest import CODECS, copy_fixture_dirs, kafka_python_records, tier

# --- the real brokers' fixtures -------------------------------------------------------------------


@pytest.fixture(scope="module")
def fixtures_restored(fixtures_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("restore-fixtures")
    dirs = copy_fixture_dirs(fixtures_dir, root / "logs")
    settings = restore_settings(dirs, {"backend": "local", "options": {"root": str(root / "store")}})
    tier(settings)
    originals, records = original_segments(dirs, tiered_partitions(settings)), records_by_partition(dirs)
    delete_local_logs(dirs)
    out = root / "restored"
    backend = create_backend("local", {"root": str(root / "store")})
    results = {}
    for topic in sorted({name.rpartition("-")[0] for name in originals}):
        results[topic] = restore(settings, backend, topic, out / topic).to_json()
    return {"dirs": dirs, "originals": originals, "records": records, "out": out, "results": results}


def test_fixture_segments_and_broker_indexes_restore_byte_for_byte(fixtures_restored: dict[str, Any]) -> None:
    originals: dict[str, dict[str, bytes]] = fixtures_restored["originals"]
    out: Path = fixtures_restored["out"]
    assert {"oms_order_status_changed-0", "oms_order_created-1", "_schemas-0"} <= set(originals)
    for name, files in originals.items():
        restored = out / name.rpartition("-")[0] / name
        got = {p.name: p.read_bytes() for p in restored.iterdir() if p.suffix in SEGMENT_SUFFIXES}
        logs = {f for f in files if f.endswith(naming.LOG)}
        assert {f for f in got if f.endswith(naming.LOG)} == logs and files.keys() <= got.keys(), name
        for file_name, data in files.items():
            assert got[file_name] == data, f"{name}/{file_name} differs"
        # Where the broker left no index (one fixture's upstream lacks them) rlm's rebuild is there.
        assert len(got) == 3 * len(logs)


def test_fixture_restore_opens_and_decodes_like_the_original(
    fixtures_restored: dict[str, Any], fixtures_dir: Path
) -> None:
    out: Path = fixtures_restored["out"]
    for name, want in fixtures_restored["records"].items():
        if name not in fixtures_restored["originals"]:
            continue
        topic = name.rpartition("-")[0]
        restored = out / topic / name
        check_loadable(restored)
        assert kafka_python_records(restored) == want, name  # HW from the restored checkpoint
        source = next((fixtures_dir / "kafka-logs").glob(f"*/{name}"))
        end = (
            max(
                b.last_offset
                for b in iter_batches(
                    b"".join(
                        d for f, d in fixtures_restored["originals"][name].items() if f.endswith(naming.LOG)
                    )
                )
            )
            + 1
        )
        # The broker's own partition.metadata and leader-epoch cache come back as they were, the
        # cache as Kafka trims it to the log (truncateFromEnd: no epoch starting at its end).
        assert (restored / PARTITION_METADATA).read_bytes() == (source / PARTITION_METADATA).read_bytes()
        epochs = parse_leader_epoch_checkpoint((source / LEADER_EPOCH_CHECKPOINT).read_bytes()).entries
        assert parse_leader_epoch_checkpoint((restored / LEADER_EPOCH_CHECKPOINT).read_bytes()).entries == [
            e for e in epochs if e.start_offset < end
        ]
        key = (topic, int(name.rpartition("-")[2]))
        assert read_checkpoint(out / topic, REPLICATION_OFFSET_CHECKPOINT)[key] == end
        assert read_checkpoint(out / topic, RECOVERY_POINT_CHECKPOINT)[key] == end
        assert key not in read_checkpoint(out / topic, LOG_START_OFFSET_CHECKPOINT)  # starts at its base


def test_compacted_fixture_segment_keeps_its_base_below_its_first_batch(
    tmp_path: Path, fixtures_dir: Path
) -> None:
    """``__consumer_offsets-19``'s only segment is named 0 and starts with offset 186795 (the
    cleaner kept the base): restored under the same name with the broker's indexes."""
    from tests.tiering.helpers import copy_partition_as

    logs = copy_fixture_dirs(fixtures_dir, tmp_path / "logs")
    arthur = next(d for d in logs if d.name.startswith("Arthur"))
    copy_partition_as(arthur, "__consumer_offsets-19", "offsets.copy-19")
    settings = restore_settings(
        [arthur],
        {"backend": "local", "options": {"root": str(tmp_path / "store")}},
    )
    tier(settings)
    source = arthur / "offsets.copy-19"
    original = {p.name: p.read_bytes() for p in source.iterdir() if p.name.startswith("0" * 20)}
    want = kafka_python_records(source)
    delete_local_segments(source, keep_last=1)
    backend = create_backend("local", {"root": str(tmp_path / "store")})
    restore(settings, backend, "offsets.copy", tmp_path / "out")
    restored = tmp_path / "out" / "offsets.copy-19"
    for file_name in (naming.segment_file_name(0, s) for s in SEGMENT_SUFFIXES):
        assert (restored / file_name).read_bytes() == original[file_name]
    check_loadable(restored)
    assert kafka_python_records(restored) == want and want[0][0] == 186795


# --- generated logs, every codec ------------------------------------------------------------------


@pytest.mark.parametrize("parallelism", [1, 4])
def test_every_codec_restores_byte_for_byte_and_decodes(tmp_path: Path, parallelism: int) -> None:
    settings, dirs = tier_generated_logs(
        tmp_path, {"backend": "local", "options": {"root": str(tmp_path / "store")}}
    )
    originals, records = original_segments(dirs, tiered_partitions(settings)), records_by_partition(dirs)
    assert len(originals) == len(CODECS) and all(len(f) >= 6 for f in originals.values())
    delete_local_logs(dirs)
    backend = create_backend("local", {"root": str(tmp_path / "store")})
    read: list[int] = []
    result = restore(
        settings, backend, "gen", tmp_path / "out", parallelism=parallelism, on_bytes=read.append
    ).to_json()
    assert sum(read) == result["bytes"]  # every .log byte read once, through the progress hook
    assert_restored(tmp_path / "out", originals, records, result)
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]  # no staging left


@pytest.mark.s3
@pytest.mark.parametrize("spread", [0, 2])  # [remote] prefix_spread, docs/key-spread.md
def test_restore_from_s3(tmp_path: Path, s3_target: Any, spread: int) -> None:
    store = {"backend": "s3", "options": s3_target.options(), "prefix_spread": spread}
    settings, dirs = tier_generated_logs(tmp_path, store)
    originals, records = original_segments(dirs, tiered_partitions(settings)), records_by_partition(dirs)
    delete_local_logs(dirs)
    cfg = write_config(
        tmp_path / "c.toml",
        dirs,
        backend="s3",
        options=s3_target.options(),
        topics={"follow_kafka_configs": False},
        cluster={"leadership": "always"},
        prefix_spread=spread,
    )
    proc = rlm_cli("restore", "--config", cfg, "--topic", "gen", "--out", tmp_path / "out")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert_restored(tmp_path / "out", originals, records, json.loads(proc.stdout))


@pytest.mark.hdfs
def test_restore_from_hdfs(tmp_path: Path, hdfs_target: Any) -> None:
    """Tiered to a live HDFS (WebHDFS), the local logs deleted: restore reads every segment back
    byte for byte."""
    store = {"backend": "hdfs", "options": hdfs_target.options()}
    settings, dirs = tier_generated_logs(tmp_path, store)
    originals, records = original_segments(dirs, tiered_partitions(settings)), records_by_partition(dirs)
    delete_local_logs(dirs)
    backend = create_backend("hdfs", hdfs_target.options())
    result = restore(settings, backend, "gen", tmp_path / "out", parallelism=4).to_json()
    assert_restored(tmp_path / "out", originals, records, result)
