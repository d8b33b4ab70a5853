"""Key rotation end to end on a real S3 server (SeaweedFS, the ``s3_target`` fixture), through
real ``python -m rlm`` subprocesses (docs/security.md §4):

1. topic ``alpha`` tiered compressed and encrypted under key A; A rotated out of ``active_key`` for
   B, topic ``beta`` then tiered under B;
2. with only B in the ring, ``rlm rewrap --to B`` fails one line per ``alpha`` manifest naming it
   and key A, exit 1, and changes nothing;
3. ``--dry-run`` counts and writes nothing; ``rlm rewrap --to B`` with A and B rewrites exactly the
   ``alpha`` manifests — every data object keeps its bytes — and a second run rewrites none
   (the rewrap runs during step 4);
4. the local segments deleted, a running ``rlm run`` (A and B) serves every record while the
   rewrap runs and after it (its readers cached the A-wrapped manifests);
5. A retired (the ring holds only B): a restarted ``rlm run`` serves every record of both topics
   over HTTP, equal to the log as written.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from rlm.http.client import RlmClient
from rlm.storage.registry import create_backend
from rlm.testing.configs import write_config
from rlm.testing.daemon import free_port, rlm_cli, run_daemon
from rlm.testing.secrets import write_secret
from rlm.tiering.store.manifest import SegmentManifest
from tests.lookup.helpers import BruteLog, delete_local_segments, write_generated
from tests.s3servers import S3Target
from tests.tiering.helpers import REPO

pytestmark = [pytest.mark.integration, pytest.mark.s3]
A, B = "key-a", "key-b"


def _config(
    path: Path,
    logs: Path,
    target: S3Target,
    key_files: dict[str, Path],
    active: str,
    include: list[str],
    port: int | None = None,
) -> Path:
    write_config(
        path,
        [logs],
        backend="s3",
        options=target.options(),
        eligibility="rolled",
        server_port=port,
        topics={"include": include},
    )
    files = ", ".join(f'"{k}" = "{v}"' for k, v in key_files.items())
    with path.open("a") as f:
        f.write(
            '[remote.compression]\ncodec = "zstd"\n'
            f'[remote.encryption]\nkey_files = {{ {files} }}\nactive_key = "{active}"\n'
        )
    return path


def _store(target: S3Target) -> dict[str, bytes]:
    backend = create_backend("s3", target.options())
    return {i.key: backend.read(i.key) for i in backend.list("")}


def _wrap_ids(objects: dict[str, bytes]) -> dict[str, str]:
    """manifest key → the key id its data key is wrapped by."""
    out = {}
    for key, body in objects.items():
        if "/manifests/" in key and not key.rsplit("/", 1)[1].startswith("lineage-"):
            m = SegmentManifest.from_json(body, key=key)
            assert m.protection is not None and m.protection.encryption is not None, key
            out[key] = m.protection.encryption.key_id
    return out


def _catch(fn: Any, *args: Any) -> BaseException | None:
    try:
        fn(*args, remote_only=False)
    except BaseException as err:  # handed to the test thread
        return err
    return None


def _ok(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return doc


def _key_files(tmp_path: Path) -> dict[str, Path]:
    """A fresh random 32-byte key for each of A and B, base64 in tmp_path/<id>.b64."""
    key_files = {}
    for key_id in (A, B):
        key_files[key_id] = tmp_path / f"{key_id}.b64"
        write_secret(key_files[key_id], base64.b64encode(os.urandom(32)).decode() + "\n")
    return key_files


def _assert_rewrap_without_key_a_refuses_and_changes_nothing(
    tmp_path: Path, logs: Path, s3_target: S3Target, key_b: Path, alpha: list[str], before: dict[str, bytes]
) -> None:
    """Only B's key configured: every A-wrapped manifest is one error line, the store unchanged."""
    everything = ["alpha", "beta"]
    only_b = _config(tmp_path / "3.toml", logs, s3_target, {B: key_b}, B, everything)
    proc = rlm_cli("rewrap", "--config", only_b, "--to", B)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == len(alpha)
    for line, key in zip(lines, alpha, strict=True):
        assert key in line and repr(A) in line, line
    assert _store(s3_target) == before


def test_rotate_rewrap_retire_on_s3(tmp_path: Path, s3_target: S3Target) -> None:
    logs = tmp_path / "logs"
    write_generated(logs, "alpha", 0, batches=150, seed=11)
    write_generated(logs, "beta", 0, batches=120, seed=12)
    brute = {t: BruteLog.scan(logs / f"{t}-0") for t in ("alpha", "beta")}
    key_files = _key_files(tmp_path)
    everything = ["alpha", "beta"]

    _ok(
        rlm_cli(
            "run",
            "--once",
            "--config",
            _config(tmp_path / "1.toml", logs, s3_target, {A: key_files[A]}, A, ["alpha"]),
        )
    )
    both = _config(tmp_path / "2.toml", logs, s3_target, key_files, B, everything)
    _ok(rlm_cli("run", "--once", "--config", both))
    before = _store(s3_target)
    ids = _wrap_ids(before)
    alpha = sorted(k for k in ids if k.startswith("alpha-"))
    beta = sorted(k for k in ids if k.startswith("beta-"))
    assert len(alpha) >= 3 and len(beta) >= 3
    assert {ids[k] for k in alpha} == {A} and {ids[k] for k in beta} == {B}

    _assert_rewrap_without_key_a_refuses_and_changes_nothing(
        tmp_path, logs, s3_target, key_files[B], alpha, before
    )

    dry = _ok(rlm_cli("rewrap", "--config", both, "--to", B, "--dry-run"))
    assert (dry["rewrapped"], dry["already"], dry["failed"]) == (len(alpha), len(beta), 0)
    assert _store(s3_target) == before

    for topic in everything:  # only the store holds the old segments now
        delete_local_segments(logs / f"{topic}-0", keep_last=1)
    with _daemon(tmp_path, "running", logs, s3_target, key_files, B, everything) as url:
        _read_all(url, brute, remote_only=True)  # its readers now hold the A-wrapped manifests
        reads: list[BaseException | None] = []
        reader = threading.Thread(target=lambda: reads.append(_catch(_read_all, url, brute)))
        reader.start()  # a consumer catching up while the manifests change under it
        done = _ok(rlm_cli("rewrap", "--config", both, "--to", B))
        reader.join()
        assert reads == [None]
        _read_all(url, brute, remote_only=True)
    assert done["rewrapped"] == len(alpha) and done["from_keys"] == {A: len(alpha), B: len(beta)}
    after = _store(s3_target)
    assert set(after) == set(before)
    assert {k for k in after if after[k] != before[k]} == set(alpha)  # manifests only
    assert set(_wrap_ids(after).values()) == {B}
    again = _ok(rlm_cli("rewrap", "--config", both, "--to", B))
    assert again["rewrapped"] == 0 and again["already"] == len(alpha) + len(beta)
    assert _store(s3_target) == after

    with _daemon(tmp_path, "retired", logs, s3_target, {B: key_files[B]}, B, everything) as url:
        _read_all(url, brute, remote_only=True)  # A retired: a restarted daemon reads everything


@contextmanager
def _daemon(
    tmp_path: Path,
    name: str,
    logs: Path,
    target: S3Target,
    key_files: dict[str, Path],
    active: str,
    topics: list[str],
) -> Iterator[str]:
    """``rlm run`` (a subprocess) with these keys; yields its URL once it answers."""
    port = free_port()
    cfg = _config(tmp_path / f"{name}.toml", logs, target, key_files, active, topics, port=port)
    log = tmp_path / f"{name}.stderr"
    with run_daemon(cfg, port, log, cwd=REPO) as daemon:
        yield daemon.url
    assert "Traceback" not in log.read_text()


def _read_all(url: str, brute: dict[str, BruteLog], *, remote_only: bool) -> None:
    """Every record of every topic through the API equals the log as written."""
    with RlmClient(url) as client:
        rows = {r["topic"]: r for r in client.partitions()}
        for topic, log in brute.items():
            hw = rows[topic]["high_watermark"]
            got = [(r.offset, r.key, r.value) for r in client.iter_records(topic, 0, 0)]
            want = [(r.offset, r.key, r.value) for r in log.records if r.offset < hw]
            assert hw > 0 and got == want, topic
            if remote_only:
                headers = {k.lower(): v for k, v in client.fetch_raw(topic, 0, 0)[1].items()}
                assert headers["x-rlm-tier"] == "remote"
