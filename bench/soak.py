"""Soak: produce, tier through a faulty store, SIGKILL and restart the daemon at random, then check
that nothing was lost, duplicated or left behind.

* a producer (this process) appends batches with :class:`rlm.logdir.writer.LogWriter` to several
  partitions (small segments, so they roll every few seconds) and raises the high watermark in
  ``replication-offset-checkpoint`` as it goes;
* ``rlm run`` — the real daemon, a subprocess, ``task_interval_ms`` small — tiers to
  ``backend = "faulty"`` (throttling, 5xx, timeouts, lost acks, partial uploads, latency) over
  ``inner = "local"``;
* a separate killer process SIGKILLs the daemon at random intervals and restarts it (each start
  gets another fault seed);
* at the end: production stops (the active segments are rolled and the HW raised to the log end),
  the daemon drains with faults still on, is stopped with SIGTERM, then a final ``rlm run --once``
  and ``rlm gc`` (grace 1 s) run without faults, and the checks run:
  every eligible segment is remote; every produced offset is in exactly one remote segment and the
  records decoded from the remote ranges equal what was produced; the local index == the
  concatenation of the manifests' uploaded entries objects (``rlm.testing.store_check.check_store``,
  deep); GC leaves no data object without a manifest.

Not in CI (minutes of wall time). Runs niced; CPU use is modest by design.

    make soak SOAK_MINUTES=10
    .venv/bin/python bench/soak.py --minutes 2 --no-record   # quick
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchlib import OUT, machine, record
from rlm.formats.compression import Compression
from rlm.formats.records import RecordSpec, decode_records, iter_batches
from rlm.logdir.discovery import (
    discover_partitions,
    eligible_segments,
    list_segments,
    partition_state,
    read_checkpoints,
)
from rlm.logdir.writer import LogWriter
from rlm.storage.faults import FaultyBackend
from rlm.storage.local import LocalBackend
from rlm.testing.configs import faulty_local_options, write_config
from rlm.testing.daemon import free_port
from rlm.testing.store_check import assert_manifests_complete, check_store

SECTION = "## Soak"
TOPIC = "soak"
FAULTS = {
    "throttle_rate": 0.04,
    "error_rate": 0.04,
    "timeout_rate": 0.01,
    "lost_ack_rate": 0.04,
    "partial_upload_rate": 0.03,
    "latency_ms": 2.0,
    "latency_jitter_ms": 8.0,
}
CODECS = (Compression.NONE, Compression.NONE, Compression.GZIP, Compression.ZSTD, Compression.SNAPPY)

# Runs the CLI with the faulty wrapper dumping its injected-fault counters to a file every second
# (a SIGKILL loses at most the last second's counts).
LAUNCHER = """
import json, os, sys, threading, time
from rlm.storage import faults
_init = faults.FaultyBackend.__init__
def _patched(self, *a, **k):
    _init(self, *a, **k)
    path = os.environ["SOAK_FAULTS_FILE"]
    def dump():
        while True:
            time.sleep(1)
            with open(path + ".tmp", "w") as f:
                json.dump(dict(self.injected), f)
            os.replace(path + ".tmp", path)
    threading.Thread(target=dump, daemon=True).start()
faults.FaultyBackend.__init__ = _patched
sys.argv = ["rlm", *sys.argv[1:]]
from rlm.cli import main
main()
"""


def value_for(partition: int, offset: int) -> bytes:
    return f"{TOPIC}-{partition}@{offset}|".encode() * 4


def daemon_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLM_")}
    env.update(extra)
    return env


def killer(
    cfg: str, out: str, seed: int, min_s: float, max_s: float, drain: Any, stop: Any, stats_path: str
) -> None:
    """The separate process: own the daemon, SIGKILL + restart it at random until ``drain``."""
    rng = random.Random(seed)
    starts = 0
    kills = 0
    log = open(Path(out) / "daemon.log", "ab")  # noqa: SIM115

    def start() -> subprocess.Popen[bytes]:
        nonlocal starts
        starts += 1
        env = daemon_env(
            {
                "RLM_REMOTE__OPTIONS__SEED": str(seed * 1000 + starts),
                "SOAK_FAULTS_FILE": str(Path(out) / f"faults-{starts}.json"),
            }
        )
        log.write(f"--- start {starts} at {time.time():.1f}\n".encode())
        log.flush()
        return subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, "run", "--config", cfg], stdout=log, stderr=log, env=env
        )

    proc = start()
    while not drain.is_set():
        if drain.wait(rng.uniform(min_s, max_s)):
            break
        proc.kill()
        proc.wait()
        kills += 1
        log.write(f"--- SIGKILL {kills} at {time.time():.1f}\n".encode())
        proc = start()
    stop.wait()
    proc.send_signal(signal.SIGTERM)
    try:
        rc: int | str = proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = "did not stop within 120 s"
    Path(stats_path).write_text(json.dumps({"starts": starts, "kills": kills, "final_rc": rc}))


def drained(logs: Path, inner: LocalBackend) -> tuple[int, int]:
    """(eligible non-empty segments, of which remote)."""
    cps = read_checkpoints(logs)
    total = remote = 0
    for part in discover_partitions([logs]):
        segs = list_segments(part)
        eligible = [
            s for s in eligible_segments(segs, partition_state(part, cps), "high-watermark") if s.size > 0
        ]
        have = {i.key.rsplit("/", 1)[1] for i in inner.list(f"{part.name}/manifests/")}
        total += len(eligible)
        remote += sum(f"{s.base_offset:020d}.json" in have for s in eligible)
    return total, remote


def check_records(logs: Path, inner: LocalBackend, produced: dict[int, int]) -> int:
    """Every produced offset in exactly one remote segment, with the produced record; returns the
    number of records checked."""
    checked = 0
    for p, end in produced.items():
        name = f"{TOPIC}-{p}"
        expect = 0
        for info in inner.list(f"{name}/manifests/"):
            doc = json.loads(inner.read(info.key))
            data = inner.read(doc["objects"]["log"]["key"])
            for batch in iter_batches(data, verify_crc=True):
                for rec in decode_records(data, batch):
                    assert rec.offset == expect, f"{name}: offset {rec.offset}, expected {expect}"
                    assert rec.value == value_for(p, rec.offset), f"{name}: record {rec.offset} differs"
                    expect += 1
                    checked += 1
        assert expect == end, f"{name}: remote holds offsets [0, {expect}), produced [0, {end})"
    return checked


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="production time (default 10)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--segment-kib", type=int, default=48, help="segment.bytes of the producer")
    ap.add_argument("--kill-min-s", type=float, default=4.0)
    ap.add_argument("--kill-max-s", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--no-record", action="store_true", help="do not write BENCHMARKS.md")
    return ap.parse_args(argv)


@dataclass
class Soak:
    """One soak run's places and counters: the producer's log dir and writers, the store read
    directly (``inner``, no faults), the daemon's faulty config and the clean one for the final pass."""

    out: Path
    logs: Path
    inner: LocalBackend
    cfg: Path
    clean_cfg: Path
    writers: dict[int, LogWriter]
    started: float = 0.0
    records: int = 0
    batches: int = 0
    checks: int = 0
    produce_s: float = 0.0
    drain_s: float = 0.0


def setup(args: argparse.Namespace) -> Soak:
    """A fresh OUT/soak: the configs (faulty store for the daemon, clean for the final pass) and one
    LogWriter per partition, its high watermark at 0."""
    out = OUT / "soak"
    shutil.rmtree(out, ignore_errors=True)
    logs, store = out / "logs", out / "store"
    logs.mkdir(parents=True)
    index = {"index_entry_bytes": 8192, "index_rotate_bytes": 256 * 1024}
    cfg = write_config(
        out / "soak.toml",
        [logs],
        backend="faulty",
        options=faulty_local_options(store, FAULTS),
        server_port=free_port(),
        task_interval_ms=500,
        gc_grace_ms=5000,
        **index,
    )
    clean_cfg = write_config(out / "final.toml", [logs], root=store, gc_grace_ms=1000, **index)
    writers = {
        p: LogWriter(logs, TOPIC, p, segment_bytes=args.segment_kib * 1024, index_interval_bytes=4096)
        for p in range(args.partitions)
    }
    for w in writers.values():
        w.high_watermark = 0
        w.write_checkpoints()
    return Soak(out, logs, LocalBackend(root=str(store)), cfg, clean_cfg, writers)


def produce(soak: Soak, args: argparse.Namespace, rng: random.Random) -> dict[int, int]:
    """Append random batches to every partition for ``--minutes``, moving the high watermark every
    0.2–2 s and checking manifest completeness every 60 s; then roll, commit everything and return
    each partition's log end offset."""
    deadline = soak.started + args.minutes * 60
    next_hw = next_check = time.monotonic()
    while time.monotonic() < deadline:
        for p, w in soak.writers.items():
            n, base = rng.randint(5, 40), w.log_end_offset
            specs = [
                RecordSpec(int(time.time() * 1000), f"k{base + i}".encode(), value_for(p, base + i))
                for i in range(n)
            ]
            w.append(specs, compression=rng.choice(CODECS))
            soak.records += n
            soak.batches += 1
        now = time.monotonic()
        if now >= next_hw:  # the broker commits: HW moves up to somewhere in [HW, LEO]
            for w in soak.writers.values():
                w.high_watermark = rng.randint(w.high_watermark, w.log_end_offset)
                w.write_checkpoints()
            next_hw = now + rng.uniform(0.2, 2.0)
        if now >= next_check:  # mid-run: nothing reader-visible without its data
            assert_manifests_complete(soak.inner)
            soak.checks += 1
            next_check = now + 60
            total, remote = drained(soak.logs, soak.inner)
            print(
                f"  {now - soak.started:6.0f} s: {soak.records} records, "
                f"{remote}/{total} eligible segments remote",
                flush=True,
            )
        time.sleep(0.02)
    produced = {}
    for p, w in soak.writers.items():  # stop producing: roll the active segments, commit everything
        w.roll()
        w.high_watermark = w.log_end_offset
        produced[p] = w.log_end_offset
        w.close()
    soak.produce_s = time.monotonic() - soak.started
    return produced


def wait_drained(soak: Soak) -> None:
    """Until every eligible segment is remote (at most 15 min, then say so and go on)."""
    t = time.monotonic()
    while True:
        total, remote = drained(soak.logs, soak.inner)
        if remote == total:
            break
        if time.monotonic() - t > 900:
            print(f"daemon did not drain in 15 min: {remote}/{total}", flush=True)
            break
        time.sleep(3)
    soak.drain_s = time.monotonic() - t


def _rlm(*argv: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "rlm", *argv, "--quiet"],
        capture_output=True,
        text=True,
        env=daemon_env({}),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def final_pass(soak: Soak) -> tuple[int, int, int]:
    """A faultless `rlm run --once` then `rlm gc`: (segments still copied, orphan objects before
    GC, attempts GC deleted)."""
    once = _rlm("run", "--config", str(soak.clean_cfg), "--once")
    final_copied = int(json.loads(once.stdout)["segments_copied"])
    orphans_before = check_store([soak.logs], soak.inner, deep=False).unreferenced
    time.sleep(1.2)
    gc = _rlm("gc", "--config", str(soak.clean_cfg))
    return final_copied, len(orphans_before), len(gc.stdout.splitlines())


def verify(soak: Soak, produced: dict[int, int]) -> tuple[int, int]:
    """The deep store check (no orphans) and every produced offset decoded from remote once:
    (segments tiered, local index entries)."""
    check = check_store([soak.logs], soak.inner, deep=True, url_backend=FaultyBackend.wrap(soak.inner))
    assert not check.unreferenced, f"GC left {len(check.unreferenced)} orphans"
    checked = check_records(soak.logs, soak.inner, produced)
    assert checked == soak.records, (checked, soak.records)
    segments = sum(len(pc.manifests) for pc in check.partitions.values())
    entries = sum(len(pc.local_entries) for pc in check.partitions.values())
    return segments, entries


def injected_faults(out: Path) -> dict[str, int]:
    """The faults every daemon run counted (faults-*.json), summed by kind."""
    faults: dict[str, int] = {}
    for f in out.glob("faults-*.json"):
        for k, v in json.loads(f.read_text()).items():
            faults[k] = faults.get(k, 0) + v
    return faults


def table(soak: Soak, args: argparse.Namespace, stats: dict[str, Any], results: tuple[int, ...]) -> str:
    """The Markdown result table; ``results`` = (segments tiered, local index entries, segments the
    final pass copied, orphans before GC, attempts GC deleted)."""
    segments, entries, final_copied, orphans_before, gc_attempts = results
    faults = injected_faults(soak.out)
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(faults.items())) or "n/a"
    total_s = time.monotonic() - soak.started
    return (
        "| measurement | value |\n|---|---|\n"
        f"| production time / drain time / total | {soak.produce_s / 60:.1f} min / {soak.drain_s:.0f} s / "
        f"{total_s / 60:.1f} min |\n"
        f"| partitions / records produced / batches | {args.partitions} / {soak.records:,} / "
        f"{soak.batches:,} |\n"
        f"| segments tiered (checked remote) / local index entries | {segments:,} / {entries:,} |\n"
        f"| daemon SIGKILLs / starts / final SIGTERM exit code | {stats['kills']} / {stats['starts']} / "
        f"{stats['final_rc']} |\n"
        f"| faults injected (counted per daemon, ≤ 1 s lost per kill) | {sum(faults.values()):,} "
        f"({kinds}) |\n"
        f"| segments the final `run --once` still copied | {final_copied} |\n"
        f"| orphan attempts before / deleted by final `rlm gc` / left | {orphans_before} objects / "
        f"{gc_attempts} attempts / 0 |\n"
        f"| records decoded from remote ranges == produced (each offset once) | {soak.records:,} ✔ |\n"
        f"| mid-run manifest-completeness checks | {soak.checks} ✔ |\n"
    )


def report(args: argparse.Namespace, argv: list[str] | None, stats: dict[str, Any], result: str) -> None:
    """Append the run to BENCHMARKS.md's Soak section."""
    given = argv if argv is not None else sys.argv[1:]
    entry = (
        f"### {dt.date.today().isoformat()} — {args.minutes:g} min, {args.partitions} partitions, "
        f"{stats['kills']} kills: all checks passed\n\n"
        f"- machine: {machine()}\n"
        f"- command: `{' '.join(['.venv/bin/python bench/soak.py', *given])}` (`make soak`)\n"
        f"- faults: {json.dumps(FAULTS)}; kill interval uniform "
        f"{args.kill_min_s:g}–{args.kill_max_s:g} s; segment.bytes {args.segment_kib} KiB; "
        "task_interval_ms 500\n\n" + result
    )
    record(
        SECTION,
        entry,
        intro=(
            "`bench/soak.py` (`make soak`, not in CI): LogWriter produces into several partitions while "
            "the real `rlm run` daemon tiers through the faulty store and a separate process SIGKILLs "
            "and restarts it at random; then drain, clean stop, final `run --once` + `gc`, and the "
            "checks (every produced offset remote exactly once and decoded equal, local index == "
            "manifests' entries, no orphans)."
        ),
    )
    print("recorded in BENCHMARKS.md")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.nice(10)  # shares the machine with other people's test runs
    soak = setup(args)
    ctx = mp.get_context("spawn")
    drain, stop = ctx.Event(), ctx.Event()
    stats_path = soak.out / "killer.json"
    kp = ctx.Process(
        target=killer,
        args=(
            str(soak.cfg),
            str(soak.out),
            args.seed,
            args.kill_min_s,
            args.kill_max_s,
            drain,
            stop,
            str(stats_path),
        ),
    )
    soak.started = time.monotonic()
    kp.start()
    print(f"soak: {args.partitions} partitions for {args.minutes} min; output in {soak.out}", flush=True)
    produced = produce(soak, args, random.Random(args.seed))
    drain.set()
    wait_drained(soak)
    stop.set()
    kp.join(180)
    stats = json.loads(stats_path.read_text())
    print(f"drained in {soak.drain_s:.0f} s; killer: {stats}", flush=True)
    final = final_pass(soak)
    result = table(soak, args, stats, (*verify(soak, produced), *final))
    print(result, flush=True)
    if not args.no_record:
        report(args, argv, stats, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
