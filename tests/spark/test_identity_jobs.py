"""The Spark jobs on a topic deleted and re-created (docs/topic-identity.md): read, verify and
rebuild-index see only the live incarnation; a name-only conflict is read from the local log only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlm.jobs import rebuild_index, verify
from rlm.jobs.tables.dataframe import read_tiered
from tests.tiering.test_identity import ID_A, ID_B, NAME, TOPIC, TS, Env


def _values(spark_df: Any) -> list[tuple[int, bytes]]:
    return sorted((r["offset"], bytes(r["value"])) for r in spark_df.select("offset", "value").collect())


def test_jobs_see_only_the_live_incarnation(spark: Any, tmp_path: Path) -> None:
    env = Env(tmp_path)
    env.write(ID_A, "A", 300)
    env.manager().run_once()
    env.delete_partition()
    leo_b = env.write(ID_B, "B", 120)
    manager = env.manager()
    manager.run_once()
    [row] = manager.status()
    env.drop_tiered_local_segments(row["highest_tiered_offset"])

    rows = _values(read_tiered(spark, env.settings, [TOPIC]))
    assert [o for o, _ in rows] == list(range(leo_b))
    assert all(v.startswith(b"B-") for _, v in rows)
    report = verify(spark, env.settings, deep=True)
    assert report.ok, [p.line() for p in report.problems]
    assert report.segments == len(env.manifests(ID_B)) == row["remote_segments"]
    counts = rebuild_index(spark, env.settings)
    assert set(counts) == {NAME} and counts[NAME] > 0
    found = env.readers().reader(TOPIC, 0).lookup_offset(0)
    assert found.tier == "remote" and found.timestamp == TS["B"]
    # A gap in the live incarnation names that incarnation's manifest key, not the name-only one.
    middle = env.manifests(ID_B)[1]
    env.backend.delete(middle)
    gaps = [p for p in verify(spark, env.settings).problems if p.check == "gap"]
    assert [g.key for g in gaps] == [env.manifests(ID_B)[1]], [p.line() for p in gaps]


def test_name_only_conflict_is_read_from_the_local_log_only(spark: Any, tmp_path: Path) -> None:
    env = Env(tmp_path)
    env.write(None, "A", 250)
    env.manager().run_once()
    env.delete_partition()
    leo_b = env.write(None, "B", 60)
    env.manager().run_once()
    rows = _values(read_tiered(spark, env.settings, [TOPIC]))
    assert [o for o, _ in rows] == list(range(leo_b))
    assert all(v.startswith(b"B-") for _, v in rows)
