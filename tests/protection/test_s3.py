"""Protection on a real S3 server (SeaweedFS, tests/s3servers.py), through real `rlm` processes:
nothing stored is plaintext, compressible data stores at ≤ 0.5×, every record reads back
byte-identical over HTTP after the local segments are deleted, rotation keeps old segments
readable, a missing key and a tampered object are one line (exit 1) and an HTTP status, and a
remote lookup costs one ranged GET (counted by the daemon's store request metering)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from rlm.config import Settings
from rlm.formats.indexes.remote_index import iter_entries
from rlm.storage.api import StorageBackend
from rlm.storage.registry import create_backend
from rlm.testing.daemon import free_port, rlm_cli, run_daemon
from tests.lookup.helpers import BruteLog, delete_local_segments
from tests.protection.helpers import (
    TOPIC,
    key_file,
    plaintext_found,
    settings,
    stored_objects,
    write_secrets,
    write_toml,
)
from tests.s3servers import S3Target
from tests.tiering.helpers import REPO

pytestmark = [pytest.mark.s3, pytest.mark.integration]


@contextmanager
def _daemon(config: Path, port: int, log: Path) -> Iterator[httpx.Client]:
    """``rlm run`` as a real process; yields a client once its API answers and its first pass over
    every partition is done (no pass reads meanwhile)."""
    with (
        run_daemon(
            config, port, log, cwd=REPO, ready=lambda: "every partition passed once" in log.read_text()
        ),
        httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client,
    ):
        yield client
    assert "Traceback" not in log.read_text()


def _s3_settings(tmp: Path, logs: Path, target: S3Target, **protection: object) -> Settings:
    return settings(tmp, logs, backend="s3", options=target.options(), **protection)  # type: ignore[arg-type]


def _gets(client: httpx.Client) -> float:
    text = client.get("/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith('rlm_store_requests_total{op="get"') and f'topic="{TOPIC}"' in line
    )


def _read_over_http(client: httpx.Client, start: int, end: int) -> bytes:
    out, offset = [], start
    while offset < end:
        resp = client.get(
            f"/v1/topics/{TOPIC}/partitions/0/records", params={"offset": offset, "max_bytes": 4096}
        )
        assert resp.status_code == 200, resp.text
        out.append(resp.content)
        offset = int(resp.headers["X-Rlm-Next-Offset"])
    return b"".join(out)


def _hide_later_segments(logs: Path) -> dict[Path, Path]:
    """Rename the newer half of the partition's segments away (as if not yet rolled)."""
    segments = sorted((logs / f"{TOPIC}-0").glob("*.log"))
    later = {p: p.with_name(p.name + ".later") for p in segments[len(segments) // 2 + 1 :]}
    for p, q in later.items():
        p.rename(q)
    return later


def test_protected_store_on_seaweedfs(tmp_path: Path, s3_target: S3Target) -> None:
    logs = tmp_path / "logs"
    brute = write_secrets(logs, batches=240)
    keys = {"A": key_file(tmp_path / "keys", "A"), "B": key_file(tmp_path / "keys", "B")}
    port = free_port()

    # copy with key A, then rotate to B (A kept) and copy the rest
    later = _hide_later_segments(logs)
    with_a = write_toml(
        tmp_path / "a.toml", _s3_settings(tmp_path, logs, s3_target, keys={"A": keys["A"]}, active="A")
    )
    proc = rlm_cli("run", "--config", with_a, "--once")
    assert proc.returncode == 0, proc.stderr
    for p, q in later.items():
        q.rename(p)
    s = _s3_settings(tmp_path, logs, s3_target, keys=keys, active="B")
    both = write_toml(tmp_path / "ab.toml", s, server_port=port)
    proc = rlm_cli("run", "--config", both, "--once")
    assert proc.returncode == 0, proc.stderr

    backend = create_backend("s3", s3_target.options())
    objects = stored_objects(backend)
    assert plaintext_found(objects, brute) == []
    manifests = [json.loads(v) for k, v in objects.items() if "/manifests/" in k]
    assert {m["protection"]["encryption"]["key_id"] for m in manifests} == {"A", "B"}
    plaintext = sum(m["size_bytes"] for m in manifests)
    stored = sum(len(v) for k, v in objects.items() if "/data/" in k)
    assert stored <= 0.5 * plaintext, (stored, plaintext)

    deleted = delete_local_segments(logs / f"{TOPIC}-0")
    start, end = brute.records[0].offset, brute.records[-1].offset + 1
    expected = b"".join(b.data for b in brute.batches if start <= b.batch.base_offset < end)
    with _daemon(both, port, tmp_path / "daemon.log") as client:
        _check_lookup_cost(client, logs, brute, max(deleted))  # first: nothing read or cached yet
        assert _read_over_http(client, start, end) == expected

    # a ring without A: the old segments cannot be opened — one line, exit 1; HTTP 500
    only_b = write_toml(
        tmp_path / "b.toml",
        _s3_settings(tmp_path, logs, s3_target, keys={"B": keys["B"]}, active="B"),
        server_port=port,
    )
    proc = rlm_cli("fetch", "--config", only_b, "--topic", TOPIC, "--partition", "0", "--offset", "0")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    # the first thing the lost key stops is the check of the segment's manifest (its MAC)
    assert "'A'" in lines[0] and f"{TOPIC}-0 segment 0" in lines[0] and "manifests/" in lines[0]
    with _daemon(only_b, port, tmp_path / "daemon-b.log") as client:
        resp = client.get(f"/v1/topics/{TOPIC}/partitions/0/records", params={"offset": 0})
        assert resp.status_code == 500 and "'A'" in resp.json()["error"]["reason"]
        newest = manifests[-1]
        ok = client.get(f"/v1/topics/{TOPIC}/partitions/0/offsets/{max(m['base_offset'] for m in manifests)}")
        assert ok.status_code == 200 and ok.json()["found"], (ok.text, newest)

    _tampered_object_is_named(backend, objects, both, port, tmp_path / "daemon-t.log")


def _tampered_object_is_named(
    backend: StorageBackend, objects: dict[str, bytes], config: Path, port: int, daemon_log: Path
) -> None:
    """A tampered object: ``rlm fetch`` prints one line naming it, exit 1; the daemon answers HTTP 502."""
    first_log = min(k for k in objects if k.endswith("segment.log") and "/data/00000000000000000000-" in k)
    data = bytearray(objects[first_log])
    data[64] ^= 0x10
    backend.put(first_log, bytes(data))
    proc = rlm_cli("fetch", "--config", config, "--topic", TOPIC, "--partition", "0", "--offset", "0")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert "authentication" in lines[0] and first_log in lines[0] and "'A'" in lines[0]
    with _daemon(config, port, daemon_log) as client:
        resp = client.get(f"/v1/topics/{TOPIC}/partitions/0/records", params={"offset": 0})
        assert resp.status_code == 502 and "authentication" in resp.json()["error"]["reason"]


def _check_lookup_cost(client: httpx.Client, logs: Path, brute: BruteLog, below: int) -> None:
    """Within one segment: the first lookup reads one entry (and the segment's manifest, for the
    wrapped data key, unless the daemon already knows it); a lookup in another entry of the segment
    then costs exactly one ranged GET, a repeat none."""
    entries = [
        d.entry
        for p in sorted((logs / f"{TOPIC}-0").glob("*.remotelogindex"))
        for d in iter_entries(p.read_bytes())
    ]
    by_object: dict[str, list[int]] = {}
    for e in entries:
        if e.last_offset < below:
            by_object.setdefault(e.rdi.url, []).append(e.first_offset)
    firsts = next(v for v in by_object.values() if len(v) >= 3)

    def cost(offset: int) -> float:
        before = _gets(client)
        resp = client.get(f"/v1/topics/{TOPIC}/partitions/0/offsets/{offset}")
        assert resp.status_code == 200 and resp.json()["found"] and resp.json()["tier"] == "remote", resp.text
        return _gets(client) - before

    # the entry, plus the manifest unless the daemon read it since it started (docs/protection.md)
    assert cost(firsts[0]) in (1, 2)
    assert cost(firsts[2]) == 1  # another entry of the same segment: one ranged GET
    assert cost(firsts[2]) == 0  # cached
