"""verify (clean data and injected corruption), rebuild_index and offsets_for_times as Spark jobs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rlm.cli.main import main
from rlm.formats.records import iter_batches
from rlm.jobs import offsets_for_times, rebuild_index, verify
from rlm.testing.configs import write_config
from rlm.tiering.read.readers import TieredReaders
from rlm.tiering.store import object_keys
from rlm.tiering.store.remote_state import RemoteState
from tests.spark.conftest import BASE_TS, Env, generated_env
from tests.tiering.helpers import local_index_files

pytestmark = pytest.mark.spark


def test_verify_clean_fixtures_and_generated(spark: Any, fixture_env: Env, gen_env: Env) -> None:
    for env in (fixture_env, gen_env):
        report = verify(spark, env.settings, deep=True)
        assert report.errors == [], [p.line() for p in report.errors]
        assert report.segments > 0 and report.batches_checked > 0
        assert report.bytes_read >= sum(m.size_bytes for m in _all_manifests(env))


def _all_manifests(env: Env) -> list[Any]:
    from rlm.logdir.discovery import discover_partitions

    return [
        m
        for p in discover_partitions(env.log_dirs)
        for m in RemoteState(env.backend, p.topic, p.partition).list_manifests()
    ]


def test_verify_names_every_injected_problem(spark: Any, tmp_path: Path) -> None:
    env = generated_env(tmp_path)
    store, backend = tmp_path / "store", env.backend
    m0 = RemoteState(backend, "gen", 0).list_manifests()
    m1 = RemoteState(backend, "gen", 1).list_manifests()
    m3 = RemoteState(backend, "gen", 3).list_manifests()
    assert len(m0) >= 2 and len(m1) >= 2 and len(m3) >= 3

    # 1. a flipped byte inside the third batch of gen-0's first remote log object
    victim = m0[0].log.key
    data = bytearray(backend.read(victim))
    batch = list(iter_batches(bytes(data)))[2]
    data[batch.position + batch.size - 5] ^= 0xFF
    (store / victim).write_bytes(bytes(data))
    # 2. a deleted object: gen-1's second log object
    missing = m1[1].log.key
    (store / missing).unlink()
    # 3. a stray attempt no manifest references (old: created at ms 0)
    stray = object_keys.data_key("gen", 2, 5, object_keys.new_attempt_id(0), object_keys.LOG)
    backend.put(stray, b"junk")
    # 4. a gap: gen-3's second manifest is gone
    gone = object_keys.manifest_key("gen", 3, m3[1].base_offset)
    backend.delete(gone)

    shallow = verify(spark, env.settings)
    checks = {(p.check, p.topic, p.partition) for p in shallow.errors}
    assert ("object_missing", "gen", 1) in checks
    assert ("orphan", "gen", 2) in checks
    assert ("gap", "gen", 3) in checks
    assert not any(p.partition == 0 for p in shallow.errors)  # only a deep scrub reads the bytes

    report = verify(spark, env.settings, deep=True)
    assert not report.ok
    by_check: dict[tuple[str, int], list[Any]] = {}
    for p in report.errors:
        by_check.setdefault((p.check, p.partition), []).append(p)
    [crc] = by_check[("batch_crc", 0)]
    assert (crc.key, crc.position, crc.offset, crc.base_offset) == (
        victim,
        batch.position,
        batch.base_offset,
        m0[0].base_offset,
    )
    assert by_check[("object_crc32c", 0)][0].key == victim
    [gone_obj] = by_check[("object_missing", 1)]
    assert (gone_obj.key, gone_obj.base_offset) == (missing, m1[1].base_offset)
    [orphan] = by_check[("orphan", 2)]
    assert orphan.key == stray.rsplit("/", 1)[0] + "/" and orphan.base_offset == 5
    [gap] = by_check[("gap", 3)]
    assert (gap.offset, gap.base_offset) == (m3[0].last_offset + 1, m3[2].base_offset)
    assert "local index entry" in gap.message
    # the deleted manifest's attempt is now an orphan, its local entries belong to nothing
    assert ("orphan", 3) in by_check and ("local_index_orphan_entries", 3) in by_check
    assert {p.partition for p in report.errors} == {0, 1, 2, 3}  # gen-4 and other-0 are clean

    _cli_reports_the_problems(tmp_path, env, store, len(report.errors), victim, batch)


def _cli_reports_the_problems(
    tmp_path: Path, env: Any, store: Path, errors: int, victim: str, batch: Any
) -> None:
    """The CLI: JSON report on stdout, summary on stderr, exit 1; the flipped batch named by key."""
    cfg = write_config(tmp_path / "c.toml", env.log_dirs, root=store)
    result = CliRunner().invoke(main, ["verify", "--config", str(cfg), "--deep"])
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["ok"] is False and doc["summary"]["errors"] == errors
    assert {
        "check": "batch_crc",
        "topic": "gen",
        "partition": 0,
        "key": victim,
        "position": batch.position,
        "offset": batch.base_offset,
    }.items() <= next(p for p in doc["problems"] if p["check"] == "batch_crc").items()
    assert "problems" in result.stderr and "batch_crc" in result.stderr


def test_rebuild_index_and_cli_export(spark: Any, tmp_path: Path) -> None:
    env = generated_env(tmp_path)
    before = local_index_files(env.log_dirs)
    assert before
    for path in env.log_dirs[0].glob("*/*.remote*"):
        path.unlink()
    counts = rebuild_index(spark, env.settings)
    assert local_index_files(env.log_dirs) == before
    manifests = RemoteState(env.backend, "gen", 0).list_manifests()
    assert counts["gen-0"] == sum(m.index_entries for m in manifests)
    # and a clean verify afterwards
    assert verify(spark, env.settings).ok

    cfg = write_config(tmp_path / "c.toml", env.log_dirs, root=tmp_path / "store")
    for path in env.log_dirs[0].glob("*/*.remote*"):
        path.unlink()
    result = CliRunner().invoke(main, ["rebuild-index", "--config", str(cfg), "--spark-master", "local[2]"])
    assert result.exit_code == 0, result.output
    assert local_index_files(env.log_dirs) == before

    out = tmp_path / "out"
    args = ["export", "--config", str(cfg), "--topic", "other", "--out", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["records"] > 0 and (out / "topic=other" / "partition=0").is_dir()
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 1 and "already exists" in again.stderr


@pytest.mark.parametrize("env_name", ["fixture_env", "gen_env"])
def test_offsets_for_times_equals_in_process(
    spark: Any, env_name: str, request: pytest.FixtureRequest
) -> None:
    env: Env = request.getfixturevalue(env_name)
    readers = TieredReaders(env.settings, env.backend)
    for ts in (-1, -2, -5, 0, BASE_TS + 9_000, BASE_TS + 30_500, 1_766_000_000_000, 10**15):
        got = sorted(tuple(r) for r in offsets_for_times(spark, env.settings, ts).collect())
        want = sorted(
            (r.topic, r.partition, r.offset, r.timestamp, r.tier) for r in readers.offsets_for_times(ts)
        )
        assert got == want, ts


def test_spark_rebuild_index_leaves_what_the_in_process_rebuild_leaves(spark: Any, tmp_path: Path) -> None:
    """Both index the store's chain through `sync.index_links` and take the progress from
    `recovery.progress_after`: the same local sets, the same highest tiered offset and remote log
    start, the DeleteRecords point kept."""
    from dataclasses import replace

    from rlm.logdir.discovery import discover_partitions
    from rlm.tiering.local.state import PROGRESS_FILE, Progress, state_dir
    from rlm.tiering.manager import RemoteLogManager

    env = generated_env(tmp_path)
    paths = [state_dir(env.settings.tiering, p) / PROGRESS_FILE for p in discover_partitions(env.log_dirs)]
    first = paths[0]
    replace(Progress.load(first), delete_records_offset=1).save(first)
    RemoteLogManager(env.settings, env.backend).rebuild_index()
    in_process = local_index_files(env.log_dirs), _progress_fields(paths)
    assert in_process[1][first][2] == 1 and all(h >= 0 for h, _, _ in in_process[1].values())
    for path in env.log_dirs[0].glob("*/*.remote*"):
        path.unlink()
    for path in paths:  # a wrong progress, as a replaced disk might leave: rewritten
        replace(Progress.load(path), highest_tiered_offset=3, remote_log_start_offset=2).save(path)
    rebuild_index(spark, env.settings)
    assert (local_index_files(env.log_dirs), _progress_fields(paths)) == in_process


def _progress_fields(paths: list[Path]) -> dict[Path, tuple[int, int, int]]:
    from rlm.tiering.local.state import Progress

    return {
        p: (g.highest_tiered_offset, g.remote_log_start_offset, g.delete_records_offset)
        for p, g in ((p, Progress.load(p)) for p in paths)
    }
