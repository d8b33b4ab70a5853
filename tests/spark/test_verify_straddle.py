"""``rlm verify --deep`` on a replica that rolled elsewhere than the one whose sidecar tiered first
(docs/cluster-copy.md): its local segment files start at other offsets than the manifests, and
one manifest is a partial copy of a local segment. None of that is a problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlm.config import load_settings
from rlm.jobs import verify
from tests.tiering.test_straddle import ROLLS_B, _cluster, tier_replica_a, write_replica

pytestmark = pytest.mark.spark


def test_verify_accepts_other_roll_points_and_partial_copies(spark: Any, tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    logs_a = tier_replica_a(cluster)
    write_replica(tmp_path / "b", ROLLS_B)
    cfg_b = cluster.config("b", tmp_path / "b")
    assert cluster.manager(cfg_b).run_once()[0].error is None
    assert any(m.partial for m in cluster.manifests())

    report = verify(spark, load_settings(cfg_b), deep=True)
    assert report.ok, report.summary_lines()
    assert report.problems == [], report.summary_lines()
    assert report.segments == 5 and report.batches_checked == 52

    # Replica A's log dir against the same store: its local index lags (no follower sync in this
    # test), but nothing about its segment files or the partial manifest is reported.
    report_a = verify(spark, load_settings(cluster.config("a", logs_a)), deep=True)
    assert not [p for p in report_a.problems if p.check in ("compacted", "gap", "overlap", "manifest_key")], (
        report_a.summary_lines()
    )
