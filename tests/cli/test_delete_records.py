"""``rlm delete-records`` and ``POST …/delete-records`` (docs/cli.md, docs/http-api.md §4a): real
subprocesses — the command alone (it takes the state-dir lock), the command beside a daemon (it asks
the daemon's HTTP API), the route with and without ``[server] token`` — and the crash point
``after_log_start_marker`` (SIGKILL, then ``rlm run --once`` converges)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
import pytest

from rlm.cli.generate import generate_log_dir
from rlm.logdir.discovery import list_segments
from rlm.storage.local import LocalBackend
from rlm.testing.configs import write_config
from rlm.testing.daemon import free_port, rlm_cli, run_daemon
from rlm.tiering.store import object_keys

pytestmark = pytest.mark.integration

TOKEN = "s3cret-token"
TOPIC = "dr"


def _setup(tmp_path: Path, token: str | None = TOKEN) -> tuple[Path, Path, int, list[int]]:
    """A tiered partition whose two oldest segments the broker's retention deleted: config, store,
    HTTP port, the segment bases as written."""
    logs = tmp_path / "logs"
    generate_log_dir(logs, [(TOPIC, 1)], seed=4, records=600, segment_bytes=8 * 1024)
    port = free_port()
    server = {"port": port, **({"token": token} if token else {})}
    cfg = write_config(
        tmp_path / "c.toml",
        [logs],
        root=tmp_path / "store",
        eligibility="rolled",
        sections={"server": server},
    )
    assert rlm_cli("run", "--config", cfg, "--once").returncode == 0
    bases = [s.base_offset for s in list_segments(logs / f"{TOPIC}-0")]
    assert len(bases) >= 5, bases
    return cfg, tmp_path / "store", port, bases


def _delete(cfg: Path, before: int, **env: str) -> tuple[int, dict[str, object] | str]:
    proc = rlm_cli(
        "delete-records", "--config", cfg, "--topic", TOPIC, "--partition", 0, "--before", before, env=env
    )
    return proc.returncode, (json.loads(proc.stdout) if proc.returncode == 0 else proc.stderr)


def _lookup(cfg: Path, offset: int) -> dict[str, object]:
    proc = rlm_cli("lookup", "--config", cfg, "--topic", TOPIC, "--partition", 0, "--offset", offset)
    assert proc.returncode == 0, proc.stderr
    answer: dict[str, object] = json.loads(proc.stdout)
    return answer


def _assert_start(cfg: Path, point: int, *, empty: bool = False) -> None:
    """Every CLI read surface answers ``point`` as the log start and nothing below it (``empty``:
    nothing at all, the point is the high watermark)."""
    assert _lookup(cfg, point - 1)["found"] is False
    assert _lookup(cfg, point)["found"] is not empty
    assert empty or _lookup(cfg, point)["offset"] == point
    earliest = rlm_cli("lookup", "--config", cfg, "--topic", TOPIC, "--partition", 0, "--timestamp", -2)
    assert json.loads(earliest.stdout)["offset"] == point
    below = rlm_cli("fetch", "--config", cfg, "--topic", TOPIC, "--partition", 0, "--offset", point - 1)
    assert below.returncode == 2 and "out of range" in below.stderr


def test_the_command_alone_raises_the_log_start(tmp_path: Path) -> None:
    cfg, store, _port, bases = _setup(tmp_path)
    point = bases[2] + 1
    code, answer = _delete(cfg, point)
    assert code == 0, answer
    assert answer == {
        "topic": TOPIC,
        "partition": 0,
        "low_watermark": point,
        "previous_log_start_offset": 0,
        "deleted_segments": 2,
    }
    _assert_start(cfg, point)
    assert _delete(cfg, 3)[1]["low_watermark"] == point  # type: ignore[index]  # never backwards
    code, err = _delete(cfg, 10**9)
    assert code == 2 and "rlm: error:" in str(err) and "high watermark" in str(err)
    proc = rlm_cli("delete-records", "--config", cfg, "--topic", "nope", "--partition", 0, "--before", 1)
    assert proc.returncode == 1 and "not in log.dirs" in proc.stderr
    manifests = LocalBackend(root=str(store)).list(object_keys.manifests_prefix(TOPIC, 0))
    assert min(object_keys.parse_manifest_key(TOPIC, 0, i.key) or 1 << 62 for i in manifests) == bases[2]


def test_beside_a_daemon_the_command_and_the_route_ask_the_daemon(tmp_path: Path) -> None:
    cfg, _store, port, bases = _setup(tmp_path)
    url = f"http://127.0.0.1:{port}/v1/topics/{TOPIC}/partitions/0/delete-records"
    with run_daemon(cfg, port, tmp_path / "daemon.log") as daemon:
        assert httpx.post(url, json={"before": bases[1]}).status_code == 401  # the token is required
        point = bases[1] + 2
        code, answer = _delete(cfg, point)  # the state dir is locked: through the daemon's API
        assert code == 0 and answer["low_watermark"] == point, answer  # type: ignore[index]
        headers = {"Authorization": f"Bearer {TOKEN}"}
        reader = f"http://127.0.0.1:{port}/v1/topics/{TOPIC}/partitions/0"
        assert httpx.get(f"{reader}/offsets/{point - 1}", headers=headers).json()["found"] is False
        assert (
            httpx.get(f"{reader}/records", params={"offset": point - 1}, headers=headers).status_code == 416
        )
        got = httpx.post(url, json={"before": -1}, headers=headers)
        end = httpx.get(f"{reader}/timestamps/-1", headers=headers).json()["offset"]
        assert got.status_code == 200 and got.json()["low_watermark"] == end
        assert httpx.post(url, json={"before": end + 1}, headers=headers).status_code == 416
        assert "delete-records: log start" in daemon.log_text()
    _assert_start(cfg, end, empty=True)


def test_without_a_token_the_route_refuses_everyone(tmp_path: Path) -> None:
    cfg, _store, port, bases = _setup(tmp_path, token=None)
    url = f"http://127.0.0.1:{port}/v1/topics/{TOPIC}/partitions/0/delete-records"
    with run_daemon(cfg, port, tmp_path / "daemon.log"):
        got = httpx.post(url, json={"before": bases[1]})
        assert got.status_code == 403 and "token" in got.json()["error"]["reason"]
        code, err = _delete(cfg, bases[1])
        assert code == 1 and "token" in str(err)
    assert _lookup(cfg, 0)["found"] is True  # nothing was deleted


def test_a_crash_after_the_store_marker_converges(tmp_path: Path) -> None:
    cfg, store, _port, bases = _setup(tmp_path)
    point = bases[2] + 1
    proc = rlm_cli(
        "delete-records",
        "--config",
        cfg,
        "--topic",
        TOPIC,
        "--partition",
        0,
        "--before",
        point,
        env={"RLM_CRASH_AT": "after_log_start_marker"},
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    listing = LocalBackend(root=str(store)).list(object_keys.manifests_prefix(TOPIC, 0))
    assert object_keys.log_start_marker_key(TOPIC, 0, point) in {i.key for i in listing}
    (state,) = (tmp_path / "logs.rlm-state").glob(f"{TOPIC}-0*")
    assert json.loads((state / "progress.json").read_text())["delete_records_offset"] == -1

    once = rlm_cli("run", "--config", cfg, "--once")  # the open journal entry: recovery from the store
    assert once.returncode == 0, once.stderr
    assert json.loads(once.stdout)["segments_deleted"] == 2
    _assert_start(cfg, point)
    status = json.loads(rlm_cli("status", "--config", cfg).stdout)[0]
    assert (status["log_start_offset"], status["delete_records_offset"]) == (point, point)
    assert json.loads(rlm_cli("run", "--config", cfg, "--once").stdout)["segments_deleted"] == 0
