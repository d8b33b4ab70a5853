"""`rlm run --once` end to end on the real-broker fixtures and on LogWriter-generated log dirs."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from rlm.cli.generate import generate_log_dir
from rlm.storage.local import LocalBackend
from rlm.testing.configs import write_config
from rlm.testing.daemon import rlm_cli
from rlm.testing.store_check import StoreCheck, check_store
from tests.tiering.helpers import copy_partition_as, local_index_files, roll_after_last

pytestmark = pytest.mark.integration

ARTHUR = "ArthurArutunyan04__Backend_labs"


def _fixture_log_dirs(fixtures_dir: Path, tmp_path: Path) -> list[Path]:
    """A private copy of every fixture log dir, each partition rolled once (empty next segment),
    plus ``offsets_copy-19``: the compacted ``__consumer_offsets-19`` under a user topic's name."""
    dirs = []
    for src in sorted((fixtures_dir / "kafka-logs").iterdir()):
        dst = tmp_path / "logs" / src.name
        shutil.copytree(src, dst)
        if src.name == ARTHUR:
            copy_partition_as(dst, "__consumer_offsets-19", "offsets_copy-19")
        for part in sorted(p for p in dst.iterdir() if p.is_dir()):
            if any(part.glob("*.log")):
                roll_after_last(part)
        dirs.append(dst)
    return dirs


def _dump_local_sets(log_dirs: list[Path]) -> dict[str, list[dict[str, object]]]:
    files = sorted(p for d in log_dirs for p in d.glob("*/*.remote*"))
    proc = rlm_cli("dump", *files)
    assert proc.returncode == 0, proc.stderr
    docs = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(docs) == len(files)
    return {d["file"]: d for d in docs}


def _assert_dump_contiguous(dumps: dict[str, dict], partition_dir: Path, manifests: list[dict]) -> None:
    """The dumped entries of one partition: CRC-valid, contiguous, covering exactly the copied bytes."""
    log_docs = sorted(
        (d for f, d in dumps.items() if Path(f).parent == partition_dir and d["kind"] == "remote_log_index"),
        key=lambda d: d["base_offset"],
    )
    entries = [e for d in log_docs for e in d["entries"]]
    assert entries and all(e["crc_valid"] for e in entries)
    for doc in log_docs:
        assert doc["base_offset"] == doc["entries"][0]["first_offset"]
    for a, b in itertools.pairwise(entries):
        assert a["last_offset"] < b["first_offset"]
    assert sum(e["data_length"] for e in entries) == sum(m["size_bytes"] for m in manifests)
    assert entries[-1]["last_offset"] == manifests[-1]["last_offset"]
    offsets = [
        d for f, d in dumps.items() if Path(f).parent == partition_dir and d["kind"] == "remote_offset_index"
    ]
    assert sum(len(d["entries"]) for d in offsets) == len(entries)


def test_fixtures_tier_completely_and_idempotently(fixtures_dir: Path, tmp_path: Path) -> None:
    log_dirs = _fixture_log_dirs(fixtures_dir, tmp_path)
    store = tmp_path / "store"
    backend = LocalBackend(root=str(store))
    # Engine invariants over every user topic, whatever the fixtures' metadata logs say
    # (tests/tiering/test_policy.py and test_retention_tiers.py cover following Kafka's configs).
    no_kafka = {"follow_kafka_configs": False}
    # The fixtures come from three different clusters: no one metadata log says who leads them all.
    hw_cfg = write_config(
        tmp_path / "hw.toml", log_dirs, root=store, topics=no_kafka, cluster={"leadership": "always"}
    )

    check = _first_pass_tiers_every_user_topic(hw_cfg, log_dirs, backend)
    dumps = _dump_local_sets(log_dirs)
    arthur = log_dirs[[d.name for d in log_dirs].index(ARTHUR)]
    for name in ("oms_order_created-1", "oms_order_status_changed-3", "offsets_copy-19"):
        _assert_dump_contiguous(dumps, arthur / name, check.partitions[name].manifests)

    # A second pass changes nothing, locally or remotely.
    before_local = local_index_files(log_dirs)
    before_remote = {i.key: i.size for i in backend.list("")}
    proc = rlm_cli("run", "--config", hw_cfg, "--once")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["segments_copied"] == 0
    assert local_index_files(log_dirs) == before_local
    assert {i.key: i.size for i in backend.list("")} == before_remote

    _rolled_eligibility_still_skips_internal_logs(tmp_path, log_dirs, store, no_kafka)


def _first_pass_tiers_every_user_topic(
    hw_cfg: Path, log_dirs: list[Path], backend: LocalBackend
) -> StoreCheck:
    """One `rlm run --once`: every user topic's eligible segments reach the store, no internal log does."""
    proc = rlm_cli("run", "--config", hw_cfg, "--once")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.splitlines()[-1])
    assert summary["errors"] == {}
    check = check_store(log_dirs, backend, deep=True)
    # Named expectations (not only "whatever the scanner says"):
    assert check.remote_bases("oms_order_created-1") == [81908]
    assert check.partitions["oms_order_created-1"].manifests[0]["last_offset"] == 94645
    # Kafka's internal logs are never tiered, whatever their checkpoints say.
    for internal in (
        "__consumer_offsets-19",
        "__consumer_offsets-29",
        "__transaction_state-44",
        "__cluster_metadata-0",
    ):
        assert check.remote_bases(internal) == [], internal
        assert not list(backend.list(internal + "/")), internal
    # A user topic whose name starts with underscores is an ordinary topic.
    assert check.remote_bases("_confluent-ksql-default__command_topic-0") == [0]
    # Compacted (a user topic holding a copy of __consumer_offsets-19): the file's base is 0 but
    # its first batch is 186795.
    assert check.remote_bases("offsets_copy-19") == [0]
    assert check.partitions["offsets_copy-19"].local_entries[0].first_offset == 186795
    assert summary["segments_copied"] == sum(len(p.manifests) for p in check.partitions.values())
    assert not check.unreferenced
    return check


def _rolled_eligibility_still_skips_internal_logs(
    tmp_path: Path, log_dirs: list[Path], store: Path, no_kafka: dict[str, Any]
) -> None:
    # "rolled" makes every rolled segment eligible, but the KRaft metadata log is still no topic.
    rolled_cfg = write_config(
        tmp_path / "rolled.toml", log_dirs, root=store, eligibility="rolled", topics=no_kafka
    )
    backend = LocalBackend(root=str(store))
    proc = rlm_cli("run", "--config", rolled_cfg, "--once")
    assert proc.returncode == 0, proc.stderr
    check = check_store(log_dirs, backend, eligibility="rolled", deep=True)
    assert check.remote_bases("__cluster_metadata-0") == []
    assert not list(backend.list("__cluster_metadata-0/"))
    assert not check.unreferenced
    status = json.loads(rlm_cli("status", "--config", rolled_cfg).stdout)
    # Internal logs are listed as not tiered, with the reason (docs/topic-policy.md), never silently.
    rows = {f"{r['topic']}-{r['partition']}": r for r in status}
    for name in ("__consumer_offsets-19", "__cluster_metadata-0", "__transaction_state-44"):
        assert rows[name]["tiered"] is False and rows[name]["remote_segments"] == 0, name
        assert rows[name]["policy"]["source"] == "selection", name
    assert "KRaft metadata log" in rows["__cluster_metadata-0"]["excluded_reason"]
    assert "internal topic" in rows["__consumer_offsets-19"]["excluded_reason"]
    assert rows["oms_order_created-1"]["tiered"] is True


def test_generated_log_dir_tiers_completely(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    summaries = generate_log_dir(logs, seed=7, records=900, segment_bytes=24 * 1024)
    store = tmp_path / "store"
    backend = LocalBackend(root=str(store))
    cfg = write_config(tmp_path / "c.toml", [logs], root=store, index_entry_bytes=4096)
    proc = rlm_cli("run", "--config", cfg, "--once")
    assert proc.returncode == 0, proc.stderr
    check = check_store([logs], backend, deep=True)
    for s in summaries:
        pc = check.partitions[f"{s.topic}-{s.partition}"]
        assert len(pc.manifests) == s.eligible_segments > 0
        # Several entries per segment (index_entry_bytes = 4 KiB), none larger unless one batch is.
        assert len(pc.local_entries) > len(pc.manifests)
    dumps = _dump_local_sets([logs])
    for name, pc in check.partitions.items():
        _assert_dump_contiguous(dumps, logs / name, pc.manifests)

    status = json.loads(rlm_cli("status", "--config", cfg).stdout)
    for row in status:
        pc = check.partitions[f"{row['topic']}-{row['partition']}"]
        assert row["highest_tiered_offset"] == pc.manifests[-1]["last_offset"]
        assert row["remote_segments"] == len(pc.manifests)
        assert row["copy_lag_segments"] == 0

    before = local_index_files([logs])
    proc = rlm_cli("run", "--config", cfg, "--once")
    assert proc.returncode == 0 and json.loads(proc.stdout)["segments_copied"] == 0
    assert local_index_files([logs]) == before


def test_rebuild_index_reproduces_identical_sets(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    generate_log_dir(logs, seed=3, records=700, segment_bytes=16 * 1024)
    store = tmp_path / "store"
    # Small rotation size: several sets per partition, which the rebuild must cut identically.
    cfg = write_config(
        tmp_path / "c.toml", [logs], root=store, index_entry_bytes=2048, index_rotate_bytes=1500
    )
    assert rlm_cli("run", "--config", cfg, "--once").returncode == 0
    before = local_index_files([logs])
    assert sum(1 for k in before if k.endswith(".remotelogindex")) > 2 * 5
    for path in logs.glob("*/*.remote*"):
        path.unlink()
    proc = rlm_cli("rebuild-index", "--config", cfg)
    assert proc.returncode == 0, proc.stderr
    rebuilt = json.loads(proc.stdout)
    assert set(rebuilt) == {p.name for p in logs.iterdir() if p.is_dir()}
    assert local_index_files([logs]) == before
    check_store([logs], LocalBackend(root=str(store)))
    # And a pass after the rebuild copies nothing again.
    proc = rlm_cli("run", "--config", cfg, "--once")
    assert json.loads(proc.stdout)["segments_copied"] == 0
