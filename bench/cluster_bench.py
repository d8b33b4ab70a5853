"""Cluster bench (issue #13): what three sidecars beside three replicas cost the store.

**Upload amplification** — three ``rlm run`` daemons (subprocesses), one per broker, beside three
replicas of P partitions written by :mod:`rlm.testing.replicas` (byte-identical batches, each broker
rolling at its own points), on one S3 store (moto in its own process). Leadership is ``static``
(each partition led by one broker); halfway every partition's leader moves (configs rewritten,
daemons restarted; each replica's active segment open where its own rolls left it, so the new
leader's segment straddles what the old one tiered) and the log grows (then rolls). Reported:
bytes stored (every ``segment.log`` object) / one replica's tiered bytes (1.0 ideal; the bound is
one segment per leader change), and bytes uploaded (``rlm_remote_copy_bytes_total`` summed over the
daemons and their restarts; it counts every uploaded file, indexes too) / every object the kept
copies hold (1.0 = nothing uploaded twice).

**Follower sync cost** — 1000 partitions (tiny segments) on two brokers, a ``local`` store: the
leader tiers everything (``rlm run --once``), then a follower's manager runs in this process on a
:class:`rlm.testing.counting.CountingBackend`: its first pass (catching up with the store) and an
idle pass (nothing new), store requests counted by operation. Reported: requests per idle pass
and per partition.

``--baseline`` writes no ``[cluster]`` section (single-broker behaviour: every daemon tiers every
replica) — the figures before cluster mode. The same seed gives the same bytes.

    .venv/bin/python bench/cluster_bench.py                  # cluster mode
    .venv/bin/python bench/cluster_bench.py --baseline       # before: no [cluster]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent.parent))  # after PYTHONPATH: rlm may come from elsewhere

from bench.benchlib import FAKE_AWS, OUT, MotoProcess, machine, record
from rlm.testing.daemon import free_port, run_daemon
from rlm.testing.replicas import ReplicaSet
from rlm.testing.toml import toml_value

SECTION = "## Cluster"
INTRO = (
    "`bench/cluster_bench.py`: three `rlm run` daemons beside three replicas (byte-identical "
    "batches, different roll points) on one S3 store (moto), leaders moved once: stored `.log` bytes "
    "/ one replica's tiered bytes, uploaded bytes / stored objects (1.0 = ideal). And a follower's "
    "store requests per idle pass at 1000 partitions (local store, requests counted by "
    "`rlm.testing.counting`)."
)
BUCKET = "rlm-cluster-bench"
COPY_BYTES = re.compile(r"^rlm_remote_copy_bytes_total(?:\{[^}]*\})? ([0-9.e+]+)$", re.M)


def write_cfg(
    path: Path,
    log_dir: Path,
    backend: str,
    options: dict[str, Any],
    port: int,
    cluster: dict[str, Any] | None,
    **tiering: Any,
) -> Path:
    """A TOML config; ``cluster`` None writes no ``[cluster]`` section (the baseline)."""
    lines = [
        "[log]",
        f"dirs = {toml_value([str(log_dir)])}",
        "[remote]",
        f"backend = {toml_value(backend)}",
        "[remote.options]",
        *[f"{k} = {toml_value(v)}" for k, v in options.items()],
        "[tiering]",
        *[f"{k} = {toml_value(v)}" for k, v in tiering.items()],
        "[server]",
        f"port = {port}",
    ]
    if cluster is not None:
        lines += ["[cluster]", *[f"{k} = {toml_value(v)}" for k, v in cluster.items() if k != "leaders"]]
        lines += ["[cluster.leaders]", *[f"{json.dumps(n)} = {b}" for n, b in cluster["leaders"].items()]]
    path.write_text("\n".join(lines) + "\n")
    return path


def rlm_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("RLM_", "AWS_"))} | FAKE_AWS


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        body: bytes = r.read()
    return body.decode()


class Daemons:
    """One ``rlm run`` per broker; copied bytes are read from /metrics before every stop."""

    def __init__(self, rs: ReplicaSet, work: Path, options: dict[str, Any], baseline: bool) -> None:
        self.rs, self.work, self.options, self.baseline = rs, work, options, baseline
        self.ports = {b: free_port() for b in rs.brokers}
        self.running = contextlib.ExitStack()  # the run_daemon contexts of the current start
        self.starts = 0
        self.copied = 0.0

    def config(self, broker: int) -> Path:
        cluster = (
            None
            if self.baseline
            else {"node_id": broker, "leadership": "static", "leaders": self.rs.leaders()}
        )
        return write_cfg(
            self.work / f"rlm-{broker}.toml",
            self.rs.log_dirs[broker],
            "s3",
            self.options,
            self.ports[broker],
            cluster,
            task_interval_ms=200,
            gc_grace_ms=0,
        )

    def start(self) -> None:
        """Spawn every broker's daemon (not waited for: wait() polls the store); stderr of start n
        goes to daemon-<broker>-<n>.stderr."""
        self.starts += 1
        for b in self.rs.brokers:
            log = self.work / f"daemon-{b}-{self.starts}.stderr"
            daemon = run_daemon(self.config(b), self.ports[b], log, env=rlm_env(), cwd=self.work, wait=False)
            self.running.enter_context(daemon)

    def stop(self) -> None:
        for b in self.rs.brokers:
            # A daemon that exited (e.g. on a config it refuses) has no metrics: its stderr says why.
            with contextlib.suppress(OSError):
                self.copied += sum(float(v) for v in COPY_BYTES.findall(_get(self._url(b, "/metrics"))))
        self.running.close()  # SIGTERM each, SIGKILL after 30 s

    def _url(self, broker: int, path: str) -> str:
        return f"http://127.0.0.1:{self.ports[broker]}{path}"

    def synced(self) -> bool:
        for b in self.rs.brokers:
            rows = json.loads(_get(self._url(b, "/v1/partitions")))
            ends = {r["partition"]: r["highest_tiered_offset"] for r in rows}
            # The leader's closed segments (an earlier leader may have tiered beyond them).
            for p in self.rs.partitions:
                if ends.get(p.partition, -1) < p.replicas[p.leader].closed_end:
                    return False
        return True

    def wait(self, store: Any, timeout: float) -> bool:
        """Until every daemon reports everything tiered (True), or the store has not changed for
        10 s (False: not converging, e.g. the baseline's overlap refusals)."""
        deadline, last, since = time.monotonic() + timeout, None, time.monotonic()
        while time.monotonic() < deadline:
            try:
                if self.synced():
                    return True
            except OSError:
                pass
            listing = store_sizes(store)
            if listing != last:
                last, since = listing, time.monotonic()
            elif time.monotonic() - since > 10:
                return False
            time.sleep(0.5)
        return False


def store_sizes(store: tuple[Any, str]) -> dict[str, int]:
    client, bucket = store
    out: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            out[obj["Key"]] = int(obj["Size"])
    return out


def amplification(partitions: int, baseline: bool, seed: int) -> dict[str, Any]:
    import boto3

    work = OUT / "cluster" / "amplification"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    with (
        MotoProcess(work / "moto.log") as moto,
        ReplicaSet(work / "logs", partitions=partitions, seed=seed, segment_bytes=16384) as rs,
    ):
        client = boto3.client(
            "s3",
            endpoint_url=moto.endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        client.create_bucket(Bucket=BUCKET)
        store = (client, BUCKET)
        options = {
            "bucket": BUCKET,
            "endpoint_url": moto.endpoint,
            "path_style": True,
            "region": "us-east-1",
            "access_key_id": "testing",
            "secret_access_key": "testing",
        }
        daemons = Daemons(rs, work, options, baseline)
        rs.grow(96, roll=False)  # active segments left open: the new leaders' segments straddle
        started = time.perf_counter()
        daemons.start()
        converged = daemons.wait(store, 300)
        daemons.stop()
        for p in rs.partitions:
            rs.move_leader(p.partition, rs.brokers[(rs.brokers.index(p.leader) + 1) % len(rs.brokers)])
        rs.grow(96)
        daemons.start()
        converged = daemons.wait(store, 300) and converged
        daemons.stop()
        elapsed = time.perf_counter() - started
        listing = store_sizes(store)
        stored = sum(size for key, size in listing.items() if key.endswith("/segment.log"))
        # Every object of the kept copies (indexes too): what one upload of everything costs.
        stored_all = sum(size for key, size in listing.items() if "/data/" in key)
        tiered = sum(len(b.data) for p in rs.partitions for b in p.log)
        changes = sum(p.leader_changes for p in rs.partitions)
        bound = tiered + changes * max(r.segment_bytes for p in rs.partitions for r in p.replicas.values())
    return {
        "partitions": partitions,
        "tiered": tiered,
        "stored": stored,
        "stored_all": stored_all,
        "uploaded": daemons.copied,
        "leader_changes": changes,
        "bound": bound,
        "converged": converged,
        "seconds": elapsed,
    }


def _counting_manager(cfg: Path) -> tuple[Any, Any]:
    from rlm.config import load_settings
    from rlm.storage.registry import open_backend
    from rlm.testing.counting import CountingBackend
    from rlm.tiering.manager import RemoteLogManager

    settings = load_settings(cfg)
    counting = CountingBackend(open_backend(settings.remote.backend, settings.remote.options))
    return RemoteLogManager(settings, counting), counting


def follower_cost(partitions: int, baseline: bool, seed: int) -> dict[str, Any]:
    work = OUT / "cluster" / "follower"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    options = {"root": str(work / "store"), "fsync": False}
    t = time.perf_counter()
    with ReplicaSet(
        work / "logs",
        brokers=(1, 2),
        topic="sync",
        partitions=partitions,
        seed=seed,
        segment_bytes=512,
        records_per_batch=2,
        value_bytes=16,
    ) as rs:
        rs.grow(8)
    leaders = {p.name: 1 for p in rs.partitions}  # broker 1 leads all: broker 2 follows everywhere
    gen_s = time.perf_counter() - t

    def cfg(broker: int) -> Path:
        cluster = None if baseline else {"node_id": broker, "leadership": "static", "leaders": leaders}
        return write_cfg(
            work / f"rlm-{broker}.toml",
            rs.log_dirs[broker],
            "local",
            options,
            free_port(),
            cluster,
            task_interval_ms=3_600_000,
            gc_grace_ms=3_600_000,
        )

    t = time.perf_counter()
    cmd = [sys.executable, "-m", "rlm", "run", "--once", "--quiet", "--config", str(cfg(1))]
    leader = subprocess.run(cmd, env=rlm_env(), capture_output=True, text=True, check=False, cwd=work)
    leader_s = time.perf_counter() - t
    assert leader.returncode == 0, leader.stderr[-2000:]
    return {"partitions": partitions, "gen_s": gen_s, "leader_s": leader_s, **_follower_passes(cfg(2))}


def _follower_passes(config: Path) -> dict[str, Any]:
    """Two passes of the follower's manager over ``config`` (the first after the leader copied
    everything, then an idle one): seconds and store calls of each, segments it copied, errors."""
    manager, counting = _counting_manager(config)
    try:
        t = time.perf_counter()
        first = manager.run_once()
        first_s, first_calls = time.perf_counter() - t, dict(counting.calls)
        counting.calls.clear()
        t = time.perf_counter()
        idle = manager.run_once()
        idle_s, idle_calls = time.perf_counter() - t, dict(counting.calls)
    finally:
        manager.stop()
    return {
        "first_s": first_s,
        "first_calls": first_calls,
        "idle_s": idle_s,
        "idle_calls": idle_calls,
        "follower_copied": sum(len(r.copied) for r in first + idle),
        "errors": [r.error for r in first + idle if r.error][:3],
    }


def _calls(calls: dict[str, int]) -> str:
    return f"{sum(calls.values())} ({', '.join(f'{k} {v}' for k, v in sorted(calls.items())) or 'none'})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", type=int, default=6, help="partitions of the amplification run")
    ap.add_argument("--sync-partitions", type=int, default=1000, help="partitions of the follower run")
    ap.add_argument("--baseline", action="store_true", help="no [cluster] section (before cluster mode)")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args(argv)
    a = amplification(args.partitions, args.baseline, args.seed)
    print(json.dumps(a), flush=True)
    f = follower_cost(args.sync_partitions, args.baseline, args.seed)
    print(json.dumps(f), flush=True)
    idle_total = sum(f["idle_calls"].values())
    mode = "baseline (no `[cluster]`)" if args.baseline else 'cluster mode (`leadership = "static"`)'
    table = (
        "| measure | value |\n|---|---|\n"
        f"| stored / one replica's tiered bytes | **{a['stored'] / a['tiered']:.2f}** "
        f"({a['stored']} / {a['tiered']} B; bound {a['bound'] / a['tiered']:.2f} with "
        f"{a['leader_changes']} leader changes) |\n"
        f"| uploaded / stored (every object of the kept copies, indexes too) | "
        f"**{a['uploaded'] / max(1, a['stored_all']):.2f}** ({a['uploaded']:.0f} / {a['stored_all']} B) |\n"
        f"| every daemon reported everything tiered | {'yes' if a['converged'] else 'no'} "
        f"({a['seconds']:.0f} s) |\n"
        f"| follower first pass, {f['partitions']} partitions | {_calls(f['first_calls'])} requests, "
        f"{f['first_s']:.1f} s, {f['follower_copied']} segments copied by the follower |\n"
        f"| follower idle pass, {f['partitions']} partitions | **{_calls(f['idle_calls'])}** requests = "
        f"**{idle_total / f['partitions']:.2f} per partition**, {f['idle_s']:.1f} s |\n"
    )
    if f["errors"]:
        table += f"| follower errors | {'; '.join(f['errors'])} |\n"
    print(table)
    if not args.no_record:
        flag = " --baseline" if args.baseline else ""
        entry = (
            f"### {dt.date.today().isoformat()} — {mode}\n\n- machine: {machine()}\n"
            f"- command: `.venv/bin/python bench/cluster_bench.py{flag}`; "
            f"{a['partitions']} partitions × 3 replicas for amplification, {f['partitions']} × 2 for "
            "the follower\n\n" + table
        )
        record(SECTION, entry, intro=INTRO)
        print("recorded in BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
