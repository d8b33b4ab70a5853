"""Three ``rlm run`` daemons beside three replicas (rlm.testing.replicas), one S3 store.

Each daemon is a real subprocess with its own log dir, config (``[cluster] node_id``), HTTP port and
state dir; leadership is ``static`` (a ``[cluster.leaders]`` table: a change rewrites the configs and
restarts the daemons whose role changed) or ``kraft`` (each broker's ``__cluster_metadata-0``; a
change is a PartitionChangeRecord, no restart). Chaos: :meth:`ClusterRig.settle` SIGKILLs daemons at
random moments (seeded) while waiting, and restarts them.

The store is read with boto3 directly (:class:`RawStore`), never through rlm, so the checks in
tests/cluster/chain_check.py see what is really there.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from rlm.testing.configs import write_config
from rlm.testing.daemon import free_port
from rlm.testing.replicas import ReplicaSet
from tests.tiering.helpers import REPO

#: Small intervals so leadership moves and syncs are seen within a second or two.
TASK_INTERVAL_MS = 200
#: GC's grace for attempts no manifest names. Not the tests' usual 0: under ``leadership =
#: "kraft"`` a sidecar that lost leadership still commits the segment in flight (docs/cluster.md),
#: and only the grace keeps the new leader's GC from deleting that attempt's objects between its
#: listing of the manifests and the old leader's commit — with 0 it did (a manifest naming deleted
#: objects, every sidecar then failing to read them). Longer than any copy here, short enough for
#: the final "store clean" check.
GC_GRACE_MS = 5_000


class RawStore:
    """One bucket + prefix through boto3 (no rlm code): list and read objects."""

    def __init__(self, client: Any, bucket: str, prefix: str) -> None:
        self.client, self.bucket, self.prefix = client, bucket, prefix.rstrip("/") + "/"

    def list(self, under: str = "") -> dict[str, int]:
        """Key (relative to the prefix) → size, for every object under ``under``."""
        out: dict[str, int] = {}
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix + under
        )
        for page in pages:
            for obj in page.get("Contents", []):
                out[obj["Key"][len(self.prefix) :]] = int(obj["Size"])
        return out

    def read(self, key: str) -> bytes:
        """The object's bytes; KeyError when it is gone — GC may delete what a listing just showed,
        and :meth:`ClusterRig.settle` waits that race out instead of failing on it."""
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self.prefix + key)["Body"]
        except self.client.exceptions.NoSuchKey as err:
            raise KeyError(key) from err
        data: bytes = body.read()
        return data


@dataclass
class Daemon:
    """``python -m rlm run`` for one broker; stderr goes to a file (a full pipe would block it)."""

    broker: int
    config: Path
    port: int
    stderr: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    kills: int = 0

    def start(self) -> None:
        assert not self.running
        with self.stderr.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "rlm", "run", "--config", str(self.config)],
                cwd=REPO,
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: a crash at whatever moment the daemon is in."""
        if self.running:
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(30)
            self.kills += 1

    def stop(self) -> None:
        """SIGTERM (a clean shutdown), SIGKILL after 30 s."""
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)

    def restart(self) -> None:
        self.stop()
        self.start()

    def tail(self, chars: int = 3000) -> str:
        return self.stderr.read_text(errors="replace")[-chars:] if self.stderr.exists() else ""

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=20)


@dataclass
class ClusterRig:
    rs: ReplicaSet
    store: RawStore
    options: dict[str, Any]
    mode: str
    tmp: Path
    env: dict[str, str]
    rng: random.Random
    daemons: dict[int, Daemon] = field(default_factory=dict)
    #: partition → the highest offset known tiered (an earlier leader may have tiered beyond the
    #: current leader's closed segments); lowered only by an unclean election.
    floor: dict[int, int] = field(default_factory=dict)

    # -- configs and daemons -------------------------------------------------------------------

    def config_for(self, broker: int) -> Path:
        cluster: dict[str, Any] = {"node_id": broker, "leadership": self.mode}
        if self.mode == "static":
            cluster["leaders"] = self.rs.leaders()
        return write_config(
            self.tmp / f"rlm-{broker}.toml",
            [self.rs.log_dirs[broker]],
            backend="s3",
            options=self.options,
            server_port=self.daemons[broker].port if broker in self.daemons else free_port(),
            cluster=cluster,
            task_interval_ms=TASK_INTERVAL_MS,
            index_entry_bytes=1024,
            gc_grace_ms=GC_GRACE_MS,
        )

    def start_all(self) -> None:
        for broker in self.rs.brokers:
            port = free_port()
            self.daemons[broker] = Daemon(
                broker, self.tmp / f"rlm-{broker}.toml", port, self.tmp / f"daemon-{broker}.stderr", self.env
            )
            self.config_for(broker)
            self.daemons[broker].start()

    def move_leader(self, partition: int, broker: int) -> None:
        """A clean leader change. Static: the old leader's daemon is restarted first (it stops
        copying), then the new one's; kraft: only the metadata logs change."""
        old = self.rs.partition(partition).leader
        self.rs.move_leader(partition, broker)
        if self.mode == "static":
            for b in self.rs.brokers:
                self.config_for(b)
            for b in (old, broker):
                self.daemons[b].restart()

    def chaos_kill(self) -> None:
        """SIGKILL a random daemon after a random moment, then start it again."""
        time.sleep(self.rng.uniform(0.1, 1.5))
        victim = self.daemons[self.rng.choice(sorted(self.daemons))]
        if victim.running:
            victim.kill()
            time.sleep(self.rng.uniform(0.0, 0.5))
            victim.start()

    def settle(self, what: str, check: Callable[[], bool], *, kills: int = 1, timeout: float = 60) -> None:
        """Wait until ``check()`` holds, SIGKILLing ``kills`` random daemons on the way."""
        for _ in range(kills):
            self.chaos_kill()
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            for d in self.daemons.values():
                assert d.proc is None or d.running or d.proc.returncode in (-9, 0, -15), (
                    f"daemon {d.broker} exited {d.proc.returncode}: {d.tail()}"
                )
            try:
                if check():
                    return
            except (httpx.HTTPError, AssertionError, KeyError) as err:
                last = err
            time.sleep(0.25)
        tails = "\n".join(f"--- daemon {b}:\n{d.tail()}" for b, d in self.daemons.items())
        pytest.fail(f"{what}: not reached within {timeout} s (last: {last!r})\n{tails}")

    def partition_rows(self, broker: int) -> dict[int, dict[str, Any]]:
        with self.daemons[broker].http() as client:
            resp = client.get("/v1/partitions")
            resp.raise_for_status()  # an error answer (e.g. a deadline under load) is retried by settle
            rows = resp.json()
        return {r["partition"]: r for r in rows if r["topic"] == self.rs.topic}

    def stop_all(self) -> None:
        for d in self.daemons.values():
            d.stop()


@contextlib.contextmanager
def cluster_rig(
    tmp: Path, store: RawStore, options: dict[str, Any], *, mode: str, seed: int, env: dict[str, str]
) -> Iterator[ClusterRig]:
    """A ReplicaSet under ``tmp/logs`` and (not yet started) daemons; everything stopped at exit."""
    rs = ReplicaSet(tmp / "logs", partitions=2, seed=seed, segment_bytes=4096, kraft=mode == "kraft")
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("RLM_", "AWS_"))}
    rig = ClusterRig(rs, store, options, mode, tmp, base_env | env, random.Random(seed))
    try:
        yield rig
    finally:
        for d in rig.daemons.values():
            d.kill()
        rs.close()
