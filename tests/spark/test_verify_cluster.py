"""``rlm verify`` reads the store as the daemons serve it (docs/cluster.md): a segment another
sidecar overlapped is a warning until the leader uncommits it, and a lineage marker's cut is
checked against the follower's clipped local index, not against the whole uploaded segment."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import pytest

from rlm.cli.generate import generate_log_dir
from rlm.config import load_settings
from rlm.formats.records import iter_batches
from rlm.logdir.discovery import list_segments
from rlm.storage.local import LocalBackend
from rlm.testing.configs import write_config
from rlm.tiering.converge.sync import sync_partition
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.local.remote_root import of_context
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.store import object_keys
from rlm.tiering.store.lineage import LineageMarker

pytestmark = pytest.mark.spark

TOPIC = "vcl"


def test_verify_follows_the_chain(spark: Any, tmp_path: Path) -> None:
    from rlm.jobs import verify

    a_dir, b_dir, store = tmp_path / "a", tmp_path / "b", tmp_path / "store"
    generate_log_dir(a_dir, [(TOPIC, 1)], seed=9, records=600, segment_bytes=8 * 1024)
    shutil.copytree(a_dir, b_dir)
    cfg_a = write_config(tmp_path / "a.toml", [a_dir], root=store, index_entry_bytes=2048)
    cfg_b = write_config(tmp_path / "b.toml", [b_dir], root=store, index_entry_bytes=2048)
    leader = RemoteLogManager(load_settings(cfg_a), LocalBackend(root=str(store)), metrics=TieringMetrics())
    leader.run_once()
    follower = RemoteLogManager(load_settings(cfg_b), LocalBackend(root=str(store)), metrics=TieringMetrics())
    follower.run_once()
    assert verify(spark, load_settings(cfg_b), deep=True).problems == []

    # A stale sidecar's commit that the chain wholly covers: a warning, never an error.
    ctx = next(leader.contexts())
    first = ctx.store.chain.links[0].manifest
    doc = dataclasses.replace(first, base_offset=first.base_offset + 1).to_json()
    extra = object_keys.manifest_key(TOPIC, 0, first.base_offset + 1, ctx.key_id)
    leader.store.put(extra, doc)
    report = verify(spark, load_settings(cfg_b), deep=True)
    assert report.ok and [(p.check, p.severity, p.base_offset) for p in report.problems] == [
        ("overlap", "warning", first.base_offset + 1)
    ], report.summary_lines()
    assert sync_partition(ctx, leader=True).uncommitted == (first.base_offset + 1,)
    assert not leader.store.exists(extra)

    # An unclean election's marker cuts a segment in the middle: the follower's index is clipped
    # and verify compares it with the clipped entries.
    ctx_b = next(follower.contexts())
    seg = ctx_b.store.chain.links[1].manifest
    offsets = sorted(
        b.base_offset
        for s in list_segments(b_dir / f"{TOPIC}-0")
        for b in iter_batches(s.log.read_bytes())
        if seg.base_offset < b.base_offset <= seg.last_offset
    )
    cut = offsets[len(offsets) // 2]
    lineage = (*((e, s) for e, s in seg.leader_epochs if s < cut), (9, cut))
    of_context(ctx_b).create_lineage_marker(LineageMarker(9, lineage, cut, 1, 0))
    sync_partition(ctx_b, leader=False)
    report = verify(spark, load_settings(cfg_b), deep=True)
    diverged = [p for p in report.problems if p.check == "diverged"]
    assert report.ok and diverged and all(p.severity == "warning" for p in diverged), report.summary_lines()
    assert not [p for p in report.problems if p.check.startswith("local_index")], report.summary_lines()
