"""HDFS failing under rlm (issue #34; docs/storage.md "hdfs"), on a MiniDFSCluster of this
module's own (the session's stays whole): a DataNode stopped in the middle of an upload, a DataNode
away while the daemon tiers, the NameNode restarted while it tiers.

Each fault is a transient error to the one retry seam (never a partial object under a key); the
daemon keeps answering, and once HDFS is back every segment written meanwhile is tiered, each
offset remote exactly once."""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from rlm_storage_hdfs import HdfsBackend  # the repo's plugin, installed by `make install`

from rlm.errors import TransientStorageError
from rlm.logdir.writer import LogWriter
from rlm.testing.configs import write_config
from rlm.testing.daemon import clean_env, free_port, run_daemon
from rlm.testing.hdfs_cluster import HdfsCluster
from rlm.testing.kafka_cluster import wait_until
from rlm.testing.store_check import check_store
from tests.hdfsservers import require_hdfs
from tests.tiering.helpers import REPO, append_rolled

pytestmark = [pytest.mark.hdfs, pytest.mark.integration, pytest.mark.slow]


TOPIC, PARTITIONS = "hdfs.outage", 2
#: Short network timeouts: a DataNode that went away is seen in about a second.
TIMEOUTS = {"connect_timeout": 1.0, "read_timeout": 5.0}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HdfsCluster]:
    require_hdfs()
    hdfs = HdfsCluster(tmp_path_factory.mktemp("hdfs-outage"))
    try:
        yield hdfs.start()
    finally:
        hdfs.close()


class _StopsMidway(io.RawIOBase):
    """``data`` in 256 KiB reads. Past ``at`` bytes it starts ``fault`` in a thread once, then
    feeds slowly until the fault returned, so the upload is still in flight when it strikes."""

    def __init__(self, data: bytes, at: int, fault: Any) -> None:
        self.data, self.at, self.pos = memoryview(data), at, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=lambda: (fault(), self.done.set()))

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        if self.pos >= self.at and not self.thread.is_alive() and not self.done.is_set():
            self.thread.start()
        if self.thread.is_alive():
            time.sleep(0.05)
        n = min(len(buf), 256 << 10, len(self.data) - self.pos)
        buf[:n] = self.data[self.pos : self.pos + n]
        self.pos += n
        return n


def test_a_datanode_stopped_mid_upload_is_transient_and_publishes_nothing(cluster: HdfsCluster) -> None:
    data = os.urandom(6 << 20)
    with HdfsBackend(url=cluster.url, root=f"/midway-{uuid.uuid4().hex[:8]}", **TIMEOUTS) as backend:
        stream = _StopsMidway(data, 2 << 20, cluster.stop_datanode)
        try:
            with pytest.raises(TransientStorageError):
                backend.put("t-0/segment", stream)
            stream.done.wait(120)
            assert not backend.exists("t-0/segment")  # the NameNode answers: nothing published
            assert [o.key for o in backend.list("")] == []
        finally:
            stream.done.wait(120)
            cluster.start_datanode(0)
        backend.put("t-0/segment", data)  # the same call, HDFS whole again
        assert backend.read("t-0/segment") == data
        assert backend.read("t-0/segment", 5 << 20, (5 << 20) + 7) == data[5 << 20 : (5 << 20) + 7]


@dataclass
class Rig:
    writers: list[LogWriter]
    logs: Path
    http: httpx.Client
    daemon: subprocess.Popen[bytes]
    stderr: Path
    options: dict[str, Any]
    ts: int = 1_700_000_000_000

    def produce(self, segments: int) -> None:
        """Append ``segments`` rolled segments to every partition, the HW at the end (append_rolled)."""
        self.ts = append_rolled(self.writers, segments, self.ts, value_bytes=512)

    def tiered(self) -> bool:
        assert self.daemon.poll() is None, self.stderr.read_text()[-4000:]
        rows = self.http.get("/v1/partitions").json()
        ends = {w.partition: w.segment_base_offsets[-1] - 1 for w in self.writers}
        return len(rows) == PARTITIONS and all(
            r["highest_tiered_offset"] == ends[r["partition"]] and r["copy_lag_segments"] == 0 for r in rows
        )

    def wait_tiered(self, what: str) -> None:
        wait_until(self.tiered, timeout=120, what=what)


@pytest.fixture
def rig(cluster: HdfsCluster, tmp_path: Path) -> Iterator[Rig]:
    stderr = tmp_path / "daemon.stderr"
    options = {"url": cluster.url, "root": f"/daemon-{uuid.uuid4().hex[:8]}", **TIMEOUTS}
    with contextlib.ExitStack() as stack:
        logs = tmp_path / "logs"
        writers = [
            stack.enter_context(LogWriter(logs, TOPIC, p, index_interval_bytes=256))
            for p in range(PARTITIONS)
        ]
        port = free_port()
        cfg = write_config(
            tmp_path / "rlm.toml",
            [logs],
            backend="hdfs",
            options=options,
            server_port=port,
            task_interval_ms=300,
        )
        http = stack.enter_context(httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10))
        env = clean_env({"RLM_REMOTE__UNREACHABLE_AFTER_MS": "1000", "RLM_REMOTE__PROBE_INTERVAL_MS": "500"})
        rig = Rig(writers, logs, http, None, stderr, options)  # type: ignore[arg-type]
        rig.produce(2)
        rig.daemon = stack.enter_context(run_daemon(cfg, port, stderr, env=env, cwd=REPO, wait=False)).proc
        yield rig


def test_tiering_goes_on_through_a_datanode_outage_and_a_namenode_restart(
    cluster: HdfsCluster, rig: Rig
) -> None:
    rig.wait_tiered("the first segments on HDFS")
    cluster.stop_datanode(0)
    try:
        rig.produce(2)
        time.sleep(3)  # several passes meet the missing DataNode
        assert rig.daemon.poll() is None and not rig.tiered()  # nothing tiered without a DataNode
        assert rig.http.get("/healthz").json()["status"] == "ok"
    finally:
        cluster.start_datanode(0)
    rig.wait_tiered("the segments written while the DataNode was away")
    restart = threading.Thread(target=cluster.restart_namenode)
    restart.start()
    rig.produce(2)
    restart.join(180)
    rig.wait_tiered("the segments written across a NameNode restart")
    rig.daemon.terminate()
    rig.daemon.wait(60)
    with HdfsBackend(**rig.options) as backend:
        # complete=False: contiguity below is the completeness check (as tests/ops/test_outage.py)
        check = check_store([rig.logs], backend, deep=True, complete=False)
    for w in rig.writers:
        ranges = [
            (m["base_offset"], m["last_offset"]) for m in check.partitions[f"{TOPIC}-{w.partition}"].manifests
        ]
        assert ranges[0][0] == 0 and ranges[-1][1] == w.segment_base_offsets[-1] - 1
        for (_, last), (base, _) in itertools.pairwise(ranges):
            assert base == last + 1, ranges  # contiguous: nothing lost, nothing twice
