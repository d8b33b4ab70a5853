"""Roles in a replicated cluster (rlm/tiering/roles.py): only the leader copies, applies retention
and collects garbage; a follower learns the store and serves the same index; status says who is who."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from rlm.cli.generate import generate_log_dir
from rlm.config import load_settings
from rlm.storage.local import LocalBackend
from rlm.testing.configs import write_config
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.store import object_keys
from tests.tiering.helpers import local_index_files

TOPIC = "roles"


def _cluster_config(
    tmp_path: Path, name: str, log_dir: Path, store: Path, node: int, leader: int, **tiering: Any
) -> Path:
    cfg = write_config(tmp_path / f"{name}.toml", [log_dir], root=store, **tiering)
    with cfg.open("a") as fh:
        fh.write(
            f'[cluster]\nnode_id = {node}\nleadership = "static"\n[cluster.leaders]\n"{TOPIC}-0" = {leader}\n'
        )
    return cfg


def _manager(cfg: Path, store: Path, clock: Any = None) -> RemoteLogManager:
    return RemoteLogManager(
        load_settings(cfg), LocalBackend(root=str(store)), metrics=TieringMetrics(), clock_ms=clock
    )


def _value(mgr: RemoteLogManager, name: str, **labels: str) -> float:
    found = mgr.shared.metrics.registry.get_sample_value(name, {"topic": TOPIC, "partition": "0", **labels})
    return found or 0.0


def _index_files(log_dir: Path) -> dict[str, bytes]:
    return {k.split("/", 1)[1]: v for k, v in local_index_files([log_dir]).items()}


def test_only_the_leader_copies_retains_and_collects(tmp_path: Path) -> None:
    a_dir, b_dir, store = tmp_path / "a", tmp_path / "b", tmp_path / "store"
    generate_log_dir(a_dir, [(TOPIC, 1)], seed=3, records=500, segment_bytes=8 * 1024)
    shutil.copytree(a_dir, b_dir)
    follower = _manager(_cluster_config(tmp_path, "b", b_dir, store, node=2, leader=1), store)
    follower.run_once()
    assert not store.exists() or not any(store.rglob("*.json"))  # nothing is led there: nothing copied
    row = follower.status(observe=False)[0]
    assert (row["role"], row["leader"], row["leadership_source"]) == ("follower", 1, "static")
    assert row["leadership_detail"] is None  # a plain follower: nothing to explain
    assert row["copy_lag_segments"] > 0  # what waits for the leader, not a false 0

    leader = _manager(_cluster_config(tmp_path, "a", a_dir, store, node=1, leader=1), store)
    leader.run_once()
    copied = _value(leader, "rlm_remote_copy_bytes_total")
    assert copied > 0 and _value(leader, "rlm_partition_is_leader") == 1
    follower.run_once()
    assert _value(follower, "rlm_remote_copy_bytes_total") == 0
    assert _value(follower, "rlm_partition_is_leader") == 0
    assert _index_files(a_dir) == _index_files(b_dir) != {}
    row = follower.status(observe=False)[0]
    lead_row = leader.status(observe=False)[0]
    for field in (
        "highest_tiered_offset",
        "remote_log_start_offset",
        "remote_segments",
        "store_highest_offset",
    ):
        assert row[field] == lead_row[field], field
    assert row["sync_lag_offsets"] == 0 and row["last_error"] is None

    # An abandoned attempt past the grace: the follower's GC leaves it, the leader's deletes it.
    stray = object_keys.data_key(
        TOPIC, 0, 999_999, "0000000000001-dead", object_keys.LOG, next(leader.contexts()).key_id
    )
    leader.store.put(stray, b"x")
    assert follower.collect_garbage() == [] and leader.store.exists(stray)
    assert [o.attempt_id for o in leader.collect_garbage()] == ["0000000000001-dead"]
    assert not leader.store.exists(stray)

    # Retention: configured on the follower it does nothing; the leader deletes, the follower follows.
    follower = _manager(
        _cluster_config(tmp_path, "b2", b_dir, store, node=2, leader=1, retention_bytes=1), store
    )
    follower.run_once()
    assert _value(follower, "rlm_remote_delete_requests_total") == 0
    before = len(next(follower.contexts()).manifests)
    leader = _manager(
        _cluster_config(tmp_path, "a2", a_dir, store, node=1, leader=1, retention_bytes=1), store
    )
    leader.run_once()
    assert _value(leader, "rlm_remote_delete_requests_total") > 0
    follower.run_once()
    ctx = next(follower.contexts())
    assert len(ctx.manifests) < before
    assert ctx.progress.remote_log_start_offset == next(leader.contexts()).progress.remote_log_start_offset
    first = ctx.family.first_offset
    assert first is None or ctx.family.last_offset >= ctx.progress.remote_log_start_offset


def test_the_role_gauges_follow_a_leadership_change(tmp_path: Path) -> None:
    """The gauges are set only when a partition's leadership differs from the last asked (a sweep
    asks for every partition): a change is still published."""
    log_dir, store = tmp_path / "a", tmp_path / "store"
    generate_log_dir(log_dir, [(TOPIC, 1)], seed=3, records=50, segment_bytes=8 * 1024)
    mgr = _manager(_cluster_config(tmp_path, "a", log_dir, store, node=1, leader=1), store)
    ctx = mgr.context(mgr.discover()[0])
    mgr.roles.of(ctx)
    mgr.roles.of(ctx)
    assert (_value(mgr, "rlm_partition_is_leader"), _value(mgr, "rlm_partition_leader")) == (1, 1)
    mgr.roles.source.leaders[f"{TOPIC}-0"] = 2  # type: ignore[attr-defined]  # as a re-read source would
    mgr.roles.of(ctx)
    assert (_value(mgr, "rlm_partition_is_leader"), _value(mgr, "rlm_partition_leader")) == (0, 2)
