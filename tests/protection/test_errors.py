"""A missing key and a tampered object: one line naming object, partition, offset and key id —
CLI exit 1 (a real subprocess), the API's status, and `verify`'s problems (its executor-side
checks, run here without Spark; tests/protection/test_s3.py runs the command)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from rlm.cli.wiring import build_api
from rlm.http.server import ApiServer
from rlm.jobs.checks.verify_deep import deep_check_segment
from rlm.jobs.checks.verify_store import scrub_partition
from rlm.jobs.reading.plan import BackendSpec
from rlm.storage.local import LocalBackend
from rlm.testing.daemon import rlm_cli
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.store.manifest import SegmentManifest
from tests.lookup.helpers import delete_local_segments
from tests.protection.helpers import TOPIC, key_file, settings, write_secrets, write_toml


@pytest.fixture
def tiered(tmp_path: Path) -> tuple[Path, Path, dict[str, Path]]:
    """A partition tiered encrypted with key "k1", local segments deleted: (log dir, store, keys)."""
    logs, store = tmp_path / "logs", tmp_path / "store"
    write_secrets(logs, batches=80)
    keys = {"k1": key_file(tmp_path / "keys", "k1"), "k2": key_file(tmp_path / "keys", "k2")}
    s = settings(tmp_path, logs, keys={"k1": keys["k1"]}, active="k1")
    assert all(r.error is None for r in RemoteLogManager(s, LocalBackend(root=str(store))).run_once())
    delete_local_segments(logs / f"{TOPIC}-0")
    return logs, store, keys


def _first_log_object(store: Path) -> Path:
    return sorted(store.rglob("00000000000000000000-*/segment.log"))[0]


def _fetch(config: Path) -> tuple[int, list[str]]:
    proc = rlm_cli("fetch", "--config", config, "--topic", TOPIC, "--partition", "0", "--offset", "3")
    return proc.returncode, proc.stderr.strip().splitlines()


Tiered = tuple[Path, Path, dict[str, Path]]


def test_cli_missing_key_is_one_line_exit_1(tmp_path: Path, tiered: Tiered) -> None:
    logs, _, keys = tiered
    ok = write_toml(tmp_path / "ok.toml", settings(tmp_path, logs, keys={"k1": keys["k1"]}, active="k1"))
    code, err = _fetch(ok)
    assert code == 0 and err == []
    # the ring lost k1 (rotated to k2 and k1 dropped too early)
    config = write_toml(tmp_path / "rlm.toml", settings(tmp_path, logs, keys={"k2": keys["k2"]}, active="k2"))
    code, err = _fetch(config)
    assert code == 1 and len(err) == 1, err
    line = err[0]
    assert line.startswith("rlm: error: ") and "Traceback" not in line
    # the first thing the lost key stops is the check of the segment's manifest (its MAC)
    assert "'k1'" in line and f"{TOPIC}-0 segment 0" in line and "manifests/" in line


def test_cli_wrong_key_under_the_same_id(tmp_path: Path, tiered: tuple[Path, Path, dict[str, Path]]) -> None:
    logs, _, keys = tiered
    shutil.copy(keys["k2"], keys["k1"])  # the file under id k1 now holds another key
    config = write_toml(tmp_path / "rlm.toml", settings(tmp_path, logs, keys={"k1": keys["k1"]}, active="k1"))
    code, err = _fetch(config)
    assert code == 1 and len(err) == 1 and "'k1' does not unwrap" in err[0], err


def test_cli_tampered_object_is_one_line_exit_1(
    tmp_path: Path, tiered: tuple[Path, Path, dict[str, Path]]
) -> None:
    logs, store, keys = tiered
    obj = _first_log_object(store)
    data = bytearray(obj.read_bytes())
    data[40] ^= 0x80
    obj.write_bytes(bytes(data))
    config = write_toml(tmp_path / "rlm.toml", settings(tmp_path, logs, keys={"k1": keys["k1"]}, active="k1"))
    code, err = _fetch(config)
    assert code == 1 and len(err) == 1, err
    assert "authentication" in err[0] and "offset 0" in err[0] and "'k1'" in err[0]
    assert str(obj.relative_to(store)) in err[0]


def test_api_statuses(tmp_path: Path, tiered: tuple[Path, Path, dict[str, Path]]) -> None:
    logs, store, keys = tiered
    s = settings(tmp_path, logs, keys={"k2": keys["k2"]}, active="k2")
    server = ApiServer(
        build_api(s, RemoteLogManager(s, LocalBackend(root=str(store)))).app, "127.0.0.1", 0
    ).start()
    path = f"/v1/topics/{TOPIC}/partitions/0/records"
    url = server.url + path
    try:
        missing = httpx.get(url, params={"offset": 0}, timeout=30)
        assert missing.status_code == 500 and missing.json()["error"]["field"] == "key"
        assert "'k1'" in missing.json()["error"]["reason"]
    finally:
        server.stop()
    obj = _first_log_object(store)
    data = bytearray(obj.read_bytes())
    data[-1] ^= 0x01  # the last entry's tag
    obj.write_bytes(bytes(data))
    s = settings(tmp_path, logs, keys={"k1": keys["k1"]}, active="k1")
    server = ApiServer(
        build_api(s, RemoteLogManager(s, LocalBackend(root=str(store)))).app, "127.0.0.1", 0
    ).start()
    url = server.url + path
    try:
        ok = httpx.get(url, params={"offset": 0, "max_bytes": 100}, timeout=30)
        assert ok.status_code == 200 and ok.headers["X-Rlm-Tier"] == "remote"  # the first entry is intact
        manifest = SegmentManifest.from_json((store / f"{TOPIC}-0/manifests/{0:020d}.json").read_bytes())
        last_offset = manifest.last_offset
        tampered = httpx.get(url, params={"offset": last_offset}, timeout=30)
        assert tampered.status_code == 502, tampered.text
        assert "authentication" in tampered.json()["error"]["reason"]
    finally:
        server.stop()


def _verify(s, store: Path) -> list[str]:  # type: ignore[no-untyped-def]
    """verify's stage 1 and 2 for the partition (the functions its Spark tasks run)."""
    spec = BackendSpec.from_settings(s)
    facts = scrub_partition(spec, TOPIC, 0, 0, 0)
    lines = [p.line() for p in facts.problems]
    for m in facts.manifests:
        base = SegmentManifest.from_json(m).base_offset
        problems, _, _ = deep_check_segment(spec, m, facts.entries.get(base))
        lines += [p.line() for p in problems]
    return lines


def test_verify_deep_flags_missing_key_and_tampering(
    tmp_path: Path, tiered: tuple[Path, Path, dict[str, Path]]
) -> None:
    logs, store, keys = tiered
    good = settings(tmp_path, logs, keys={"k1": keys["k1"]}, active="k1")
    assert _verify(good, store) == []
    missing = _verify(settings(tmp_path, logs, keys={"k2": keys["k2"]}, active="k2"), store)
    assert missing and all("protection" in line and "'k1'" in line for line in missing), missing
    # one problem per segment for a missing key, not one per entry or object: its manifest's MAC
    # cannot be checked, so nothing the manifest names is trusted further
    segments = len(list((store / f"{TOPIC}-0/manifests").glob("*.json")))
    assert len(missing) == segments and all("manifests/" in line for line in missing), missing
    obj = _first_log_object(store)
    data = bytearray(obj.read_bytes())
    data[200] ^= 0x04
    obj.write_bytes(bytes(data))
    index = next(obj.parent.glob("segment.timeindex"))
    index.write_bytes(index.read_bytes()[:-1] + bytes([index.read_bytes()[-1] ^ 1]))
    found = _verify(good, store)
    assert any("protection" in line and "segment.log" in line and "authentication" in line for line in found)
    assert any("protection" in line and "segment.timeindex" in line for line in found), found
    assert not any("batch_crc" in line for line in found)  # never a decrypted-garbage CRC report
    report = json.dumps(found)
    assert "'k1'" in report
