"""Kill `rlm run --once` (a real subprocess, SIGKILL via RLM_CRASH_AT) at every named crash point,
restart it, and check that the store and the local index converge (docs/architecture.md §5)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from rlm.cli.generate import generate_log_dir
from rlm.storage.api import StorageBackend
from rlm.storage.local import LocalBackend
from rlm.storage.registry import create_backend
from rlm.testing.configs import write_config
from rlm.testing.daemon import rlm_cli
from rlm.testing.store_check import assert_manifests_complete, check_store
from rlm.tiering.expire.gc_schedule import GC_FILE
from rlm.tiering.local import crash
from tests.hdfsservers import HdfsTarget
from tests.s3servers import S3Target
from tests.tiering.helpers import local_index_files

pytestmark = pytest.mark.integration

# Crash in a later segment where it matters (the 3rd time the point is reached), so committed
# segments, the crashed one and untouched ones coexist. Retention deletes the oldest segments.
SPECS = {point: f"{point}:3" for point in crash.POINTS}
SPECS["after_delete_manifest"] = "after_delete_manifest:2"
RETENTION_BYTES = 40_000


def _setup(
    tmp_path: Path, point: str, remote: S3Target | HdfsTarget | None = None
) -> tuple[Path, Path, StorageBackend]:
    """Log dir, config and a checker's view of the store: a local dir, ``s3`` (SeaweedFS) or
    ``hdfs`` (a MiniDFSCluster)."""
    logs = tmp_path / "logs"
    generate_log_dir(logs, [("crash.t-x", 2)], seed=11, records=500, segment_bytes=12 * 1024)
    store = tmp_path / "store"
    extra = {"retention_bytes": RETENTION_BYTES} if point == "after_delete_manifest" else {}
    name = "s3" if isinstance(remote, S3Target) else "hdfs"
    where: dict[str, Any] = {"root": store}
    if remote is not None:
        where = {"backend": name, "options": remote.options()}
    # Small entries and rotation: a segment's append spans several entries and sometimes two sets.
    cfg = write_config(
        tmp_path / "c.toml", [logs], index_entry_bytes=2048, index_rotate_bytes=3000, **where, **extra
    )
    backend = LocalBackend(root=str(store)) if remote is None else create_backend(name, remote.options())
    return logs, cfg, backend


def _crash(cfg: Path, spec: str) -> None:
    proc = rlm_cli("run", "--config", cfg, "--once", env={"RLM_CRASH_AT": spec})
    assert proc.returncode == -signal.SIGKILL, (spec, proc.returncode, proc.stderr[-2000:])


def _gc_lines(cfg: Path, *extra: str) -> list[dict[str, object]]:
    proc = rlm_cli("gc", "--config", cfg, *extra)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


@pytest.mark.parametrize("point", crash.POINTS)
def test_crash_point_converges(tmp_path: Path, point: str) -> None:
    _crash_and_converge(tmp_path, point, *_setup(tmp_path, point))


# The points where a real S3 server's behaviour matters (a multipart upload cut short, objects
# without a manifest, two attempts open with one uploading, a manifest without its local index,
# a deleted manifest): the same rounds on
# the session's SeaweedFS, through real `rlm run` subprocesses.
@pytest.mark.s3
@pytest.mark.parametrize(
    "point", ["mid_upload", "after_data", "after_next_start", "after_manifest", "after_delete_manifest"]
)
def test_crash_point_converges_on_s3(tmp_path: Path, point: str, s3_target: S3Target) -> None:
    _crash_and_converge(tmp_path, point, *_setup(tmp_path, point, s3_target))


# The same on HDFS: a CREATE streamed to a DataNode cut short, the temp-and-rename publish.
@pytest.mark.hdfs
@pytest.mark.parametrize("point", ["mid_upload", "after_data", "after_manifest", "after_delete_manifest"])
def test_crash_point_converges_on_hdfs(tmp_path: Path, point: str, hdfs_target: HdfsTarget) -> None:
    _crash_and_converge(tmp_path, point, *_setup(tmp_path, point, hdfs_target))


def _crash_and_converge(tmp_path: Path, point: str, logs: Path, cfg: Path, backend: StorageBackend) -> None:
    _crash(cfg, SPECS[point])

    # Right after the crash: no reader-visible segment without its data.
    orphans = assert_manifests_complete(backend)
    if point == "after_data":  # (mid_upload dies inside the first put: nothing is published)
        assert orphans, "the killed attempt should have left uploaded objects behind"
    # gc --dry-run lists exactly the unreferenced objects and deletes nothing.
    before = {i.key for i in backend.list("")}
    listed = _gc_lines(cfg, "--dry-run")
    assert {k for o in listed for k in o["objects"]} == orphans
    assert all(o["deleted"] is False for o in listed)
    assert {i.key for i in backend.list("")} == before

    # Restart without the crash: everything eligible is remote, each offset indexed exactly once.
    proc = rlm_cli("run", "--config", cfg, "--once")
    assert proc.returncode == 0, proc.stderr
    check = check_store([logs], backend, deep=True)
    assert not check.unreferenced
    assert _gc_lines(cfg) == []
    if point == "after_delete_manifest":
        for pc in check.partitions.values():
            sizes = [m["size_bytes"] for m in pc.manifests]
            assert sum(sizes) >= RETENTION_BYTES and sum(sizes[1:]) < RETENTION_BYTES
            assert pc.manifests[0]["base_offset"] > 0  # something was deleted
        status = json.loads(rlm_cli("status", "--config", cfg).stdout)
        for row in status:
            pc = check.partitions[f"{row['topic']}-{row['partition']}"]
            assert row["remote_log_start_offset"] == pc.manifests[0]["base_offset"]

    # And once converged, another pass changes nothing.
    files = local_index_files([logs])
    keys = {i.key for i in backend.list("")}
    assert json.loads(rlm_cli("run", "--config", cfg, "--once").stdout)["segments_copied"] == 0
    assert local_index_files([logs]) == files
    assert {i.key for i in backend.list("")} == keys


@pytest.mark.parametrize("point", ["after_data", "after_manifest"])
def test_crash_with_lost_journal_gc_collects_orphans(tmp_path: Path, point: str) -> None:
    """The journal is lost with the crash (a replaced disk): recovery cannot know the attempt, so
    GC — not recovery — must collect its objects; committed segments are never touched."""
    logs, cfg, backend = _setup(tmp_path, point)
    _crash(cfg, SPECS[point])
    for journal in (tmp_path / "logs.rlm-state").glob("*/journal.jsonl"):
        journal.unlink()
    orphans = assert_manifests_complete(backend)
    # Restart with a long grace period: the run's own GC must leave the young orphans alone.
    proc = rlm_cli("run", "--config", cfg, "--once", env={"RLM_TIERING__GC_GRACE_MS": "3600000"})
    assert proc.returncode == 0, proc.stderr
    check = check_store([logs], backend)
    assert check.unreferenced == orphans
    if point != "after_manifest":
        assert orphans
    listed = _gc_lines(cfg, "--dry-run")
    assert {k for o in listed for k in o["objects"]} == orphans
    assert {i.key for i in backend.list("")} >= orphans
    deleted = _gc_lines(cfg)
    assert {k for o in deleted for k in o["objects"]} == orphans
    check = check_store([logs], backend, deep=True)
    assert not check.unreferenced


def test_once_collects_garbage_only_when_due(tmp_path: Path) -> None:
    """`rlm run --once` keeps to the daemon's GC interval (docs/operations.md "GC"): GC lists every
    partition in the store, so a --once from cron must not pay for it on every run. Orphans of a
    crash whose journal was lost wait for the next due GC, which then collects them."""
    logs, cfg, backend = _setup(tmp_path, "after_data")
    _crash(cfg, SPECS["after_data"])
    state = tmp_path / "logs.rlm-state"
    for journal in state.glob("*/journal.jsonl"):
        journal.unlink()
    orphans = assert_manifests_complete(backend)
    assert orphans

    def once(**env: str) -> dict[str, Any]:
        proc = rlm_cli("run", "--config", cfg, "--once", env=env)
        assert proc.returncode == 0, proc.stderr
        gc: dict[str, Any] = json.loads(proc.stdout)["gc"]
        return gc

    # No GC ever finished on this state root: it runs (a long grace: the young orphans stay).
    first = once(RLM_TIERING__GC_GRACE_MS="3600000")
    assert first["ran"] and "no finished GC recorded" in first["why"], first
    assert check_store([logs], backend).unreferenced == orphans
    # Grace 0 now, but the interval (max(task interval, grace / 4) = 1 h) has not passed: no GC.
    hourly = {"RLM_TIERING__GC_GRACE_MS": "0", "RLM_TIERING__TASK_INTERVAL_MS": "3600000"}
    second = once(**hourly)
    assert not second["ran"] and "next due in" in second["why"], second
    assert check_store([logs], backend).unreferenced == orphans
    # An hour later (the recorded time moved back): due, and it collects them.
    record = state / GC_FILE
    finished = json.loads(record.read_text())["finished_ms"]
    record.write_text(json.dumps({"finished_ms": finished - 3_700_000}))
    third = once(**hourly)
    assert third["ran"] and "every 3600 s" in third["why"], third
    assert not check_store([logs], backend, deep=True).unreferenced
    # `rlm gc` runs whenever asked, and counts as the last GC.
    assert _gc_lines(cfg) == []
    assert json.loads(record.read_text())["finished_ms"] > finished
