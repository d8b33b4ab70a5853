"""``[remote] prefix_spread`` end to end (docs/key-spread.md): ``rlm run --once``, status, fetch
from the remote tier, gc, ``rebuild-index`` and the local export engine as real subprocesses, over
spread 0 and 2, on the local store and on SeaweedFS; the keys actually stored are checked through
the raw (unmapped) backend, the tiered data through the independent checker."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from rlm.cli.generate import generate_log_dir
from rlm.storage.api import StorageBackend
from rlm.storage.registry import create_backend, open_backend
from rlm.testing.configs import write_config
from rlm.testing.daemon import free_port, rlm_cli, run_daemon, stop
from rlm.testing.store_check import check_store
from rlm.tiering.store import object_keys
from tests.jobs.helpers import read_export
from tests.lookup.helpers import delete_local_segments
from tests.s3servers import S3Target
from tests.tiering.helpers import local_index_files

pytestmark = pytest.mark.integration

LAYOUT = "rlm-layout.json"


def _sha(name: str, digits: int) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:digits]


def _store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    if kind == "local":
        return "local", {"root": str(tmp_path / "store")}
    pytest.importorskip("rlm_storage_s3")
    target: S3Target = request.getfixturevalue("s3_target")
    return "s3", target.options()


def _assert_stored_keys(raw: StorageBackend, spread: int) -> None:
    """Every stored key lies under the hash of its partition's name (spread 0: under the root)."""
    stored = [o.key for o in raw.list("")]
    assert len(stored) > 10
    assert (LAYOUT in stored) == (spread > 0)
    for key in stored:
        if key == LAYOUT:
            continue
        if spread:
            head, _, logical = key.partition("/")
        else:
            head, logical = "", key
        root = object_keys.parse_root(logical)
        assert root is not None, key
        assert head == _sha(f"{root.topic}-{root.partition}", spread), key


def _fetch(cfg: Path, topic: str, partition: int) -> list[dict[str, Any]]:
    proc = rlm_cli(
        "fetch",
        "--config",
        cfg,
        "--topic",
        topic,
        "--partition",
        partition,
        "--offset",
        0,
        "--max-bytes",
        1 << 22,
    )
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def _assert_gc_deletes_an_abandoned_attempt(
    cfg: Path, store: StorageBackend, raw: StorageBackend, topic: str, partition: int, spread: int
) -> None:
    """GC lists the partition's data prefix and deletes an abandoned attempt (under its hash prefix)."""
    orphan = object_keys.data_key(topic, partition, 0, object_keys.new_attempt_id(1), object_keys.LOG)
    store.put(orphan, b"abandoned")
    physical = f"{_sha(f'{topic}-{partition}', spread)}/{orphan}" if spread else orphan
    assert raw.exists(physical)
    proc = rlm_cli("gc", "--config", cfg, "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert [d["objects"] for d in map(json.loads, proc.stdout.splitlines())] == [[orphan]]
    assert not raw.exists(physical)


@pytest.mark.parametrize("spread", [0, 2])
@pytest.mark.parametrize("kind", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_tiering_reads_gc_rebuild_and_export_with_spread(
    kind: str, spread: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    logs = tmp_path / "logs"
    summaries = generate_log_dir(logs, seed=11, records=500, segment_bytes=16 * 1024)
    name, options = _store(kind, tmp_path, request)
    cfg = write_config(
        tmp_path / "c.toml",
        [logs],
        backend=name,
        options=options,
        prefix_spread=spread,
        index_entry_bytes=4096,
    )
    proc = rlm_cli("run", "--config", cfg, "--once")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["segments_copied"] > 0

    raw = create_backend(name, options)
    _assert_stored_keys(raw, spread)
    store = open_backend(name, options, spread)
    check = check_store([logs], store, deep=True)
    for s in summaries:
        assert len(check.partitions[f"{s.topic}-{s.partition}"].manifests) == s.eligible_segments > 0

    # Remote reads: the same records from the local tier first, then (local segments gone) remote.
    s = summaries[0]
    before = _fetch(cfg, s.topic, s.partition)
    assert before and {r["tier"] for r in before} == {"local"}
    delete_local_segments(logs / f"{s.topic}-{s.partition}")
    after = _fetch(cfg, s.topic, s.partition)
    assert {r["tier"] for r in after} == {"remote"}
    strip = [{k: v for k, v in r.items() if k != "tier"} for r in after]
    assert strip == [{k: v for k, v in r.items() if k != "tier"} for r in before[: len(after)]]

    _assert_gc_deletes_an_abandoned_attempt(cfg, store, raw, s.topic, s.partition, spread)

    # rebuild-index from the manifests reproduces the local sets byte for byte.
    sets = local_index_files([logs])
    for path in logs.glob("*/*.remote*"):
        path.unlink()
    proc = rlm_cli("rebuild-index", "--config", cfg, "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert local_index_files([logs]) == sets

    # The local export engine rebuilds the store from plain args in its worker processes.
    out = tmp_path / "out"
    proc = rlm_cli("export", "--config", cfg, "--topic", s.topic, "--out", out, "--engine", "local")
    assert proc.returncode == 0, proc.stderr
    table = read_export(out).to_pylist()
    exported = sorted((r["offset"], r["value"]) for r in table if r["partition"] == s.partition)
    assert [o for o, _ in exported] == list(range(len(exported)))  # every offset, once
    assert exported[: len(before)] == [(r["offset"], base64.b64decode(r["value"])) for r in before]
    check_store([logs], store, complete=False)  # local segments of one partition were deleted


def test_a_config_disagreeing_with_the_store_is_refused_with_exit_code_2(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    generate_log_dir(logs, seed=5, records=200, segment_bytes=8 * 1024)
    store = tmp_path / "store"
    spread2 = write_config(tmp_path / "two.toml", [logs], root=store, prefix_spread=2)
    assert rlm_cli("run", "--config", spread2, "--once").returncode == 0
    stored = sorted(str(p.relative_to(store)) for p in store.rglob("*") if p.is_file())
    for other, cmd in ((0, "status"), (1, "run"), (3, "gc")):
        cfg = write_config(tmp_path / f"c{other}.toml", [logs], root=store, prefix_spread=other)
        proc = rlm_cli(cmd, "--config", cfg, *(["--once"] if cmd == "run" else []))
        assert proc.returncode == 2, proc.stderr
        [line] = proc.stderr.splitlines()
        assert line.startswith(f"rlm: error: config key remote.prefix_spread = {other} does not match")
        assert "records prefix_spread = 2" in line and str(store / LAYOUT) in line
    # Nothing was written by the refused processes.
    assert sorted(str(p.relative_to(store)) for p in store.rglob("*") if p.is_file()) == stored

    # A store written before spread existed (no layout object) is spread 0.
    plain, logs0 = tmp_path / "plain", tmp_path / "logs0"
    generate_log_dir(logs0, seed=6, records=200, segment_bytes=8 * 1024)
    spread0 = write_config(tmp_path / "zero.toml", [logs0], root=plain)
    assert rlm_cli("run", "--config", spread0, "--once").returncode == 0
    assert not (plain / LAYOUT).exists()
    cfg = write_config(tmp_path / "c4.toml", [logs0], root=plain, prefix_spread=4)
    proc = rlm_cli("status", "--config", cfg)
    assert proc.returncode == 2
    assert "but no rlm-layout.json, i.e. prefix_spread = 0" in proc.stderr


def test_rewrap_finds_every_manifest_of_a_spread_store_through_the_cli_wrappers(tmp_path: Path) -> None:
    """`rlm rewrap` lists the whole store (remote_state.store_manifest_keys): on a spread store that is the
    merge over every hash prefix, paged through the health and metering wrappers as the CLI has it."""
    from rlm.storage.health import HealthTrackingBackend, StoreHealth
    from rlm.storage.metering import MeteringBackend, RequestMeter
    from rlm.tiering.store import store_manifest_keys

    logs = tmp_path / "logs"
    summaries = generate_log_dir(logs, seed=2, records=300, segment_bytes=8 * 1024)
    options = {"root": str(tmp_path / "store")}
    cfg = write_config(tmp_path / "c.toml", [logs], options=options, prefix_spread=1)
    assert rlm_cli("run", "--config", cfg, "--once").returncode == 0
    store = open_backend("local", options, 1)
    want = {o.key for s in summaries for o in store.list(object_keys.manifests_prefix(s.topic, s.partition))}
    assert len(want) > len(summaries)
    meter = RequestMeter()
    wrapped = HealthTrackingBackend(MeteringBackend(store, meter), StoreHealth())
    found = [k for k, _ in store_manifest_keys(wrapped, None)]
    assert sorted(found) == sorted(want) and len(found) == len(want)
    topic = summaries[0].topic
    only = {k for k, _ in store_manifest_keys(wrapped, frozenset({topic}))}
    assert only == {k for k in want if object_keys.parse_root(k).topic == topic}  # type: ignore[union-attr]


def _get(url: str) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@pytest.mark.s3
def test_daemon_tiers_and_serves_remote_records_with_spread_on_seaweedfs(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """`rlm run` (the daemon, a subprocess) on a spread-2 SeaweedFS store: it tiers, its API serves
    records the local tier no longer holds, and its metering counts the requests per partition."""
    import time

    from tests.tiering.helpers import REPO

    logs = tmp_path / "logs"
    summaries = generate_log_dir(logs, [("daemon.sp", 3)], seed=8, records=300, segment_bytes=8 * 1024)
    name, options = _store("s3", tmp_path, request)
    port = free_port()
    cfg = write_config(
        tmp_path / "c.toml",
        [logs],
        backend=name,
        options=options,
        prefix_spread=2,
        server_port=port,
        task_interval_ms=200,
    )
    log = tmp_path / "daemon.stderr"
    with run_daemon(cfg, port, log, cwd=REPO) as daemon:
        base = daemon.url
        deadline = time.monotonic() + 90
        rows: list[dict[str, Any]] = []
        while not (rows and all(r["remote_segments"] and r["copy_lag_segments"] == 0 for r in rows)):
            daemon.alive()
            assert time.monotonic() < deadline, f"daemon did not tier within 90 s: {rows}"
            time.sleep(0.2)
            code, body = _get(base + "/v1/partitions")
            rows = json.loads(body) if code == 200 else []
        _assert_stored_keys(create_backend(name, options), 2)
        s = summaries[0]
        url = f"{base}/v1/topics/{s.topic}/partitions/{s.partition}/records?offset=0&format=json"
        code, local = _get(url)
        assert code == 200 and json.loads(local)["tier"] == "local"
        delete_local_segments(logs / f"{s.topic}-{s.partition}")
        code, remote = _get(url)
        assert code == 200, remote
        got, want = json.loads(remote), json.loads(local)
        assert got["tier"] == "remote"
        assert got["batches"] == want["batches"][: len(got["batches"])] and got["batches"]
        [row] = [
            r
            for r in json.loads(_get(base + "/v1/partitions")[1])
            if (r["topic"], r["partition"]) == (s.topic, s.partition)
        ]
        assert row["store_requests"]["put"] > 0 and row["store_requests"]["get"] > 0
        stop(daemon.proc)  # SIGTERM
    err = log.read_text()
    assert daemon.proc.returncode == 0 and "Traceback" not in err, err
