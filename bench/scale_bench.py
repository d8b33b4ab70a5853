"""Scale benchmark: one log dir with P partitions x S tiny segments; what a restart, an idle pass
and the first copy cost as P and S grow (issue 16; docs/remote-state.md, docs/operations.md).

For each (P, S): the log dir is written directly (one small v2 batch repeated, ``.index``/
``.timeindex``, a ``replication-offset-checkpoint`` committing every rolled segment), then measured,
each step in a fresh process with the store wrapped in a request counter
(:class:`rlm.testing.counting.CountingBackend`):

* **first copy pass** — one ``run_once`` copying all P x S segments: ms and store requests per segment
  (then, in the same process, the passes a daemon makes next, which find every partition idle and
  persist its mark: the steady state a restart meets);
* **restart + first idle pass** — a new process: imports, manager built, one pass over every
  partition with nothing to copy (the restart: local state loaded, trusted or recovered), and the
  store requests it made; then, after the directories settled, **steady idle passes** in the same
  process (ms per partition, requests) and the process's RSS;
* **restart, every partition changed** — the same after every idle mark was deleted: each first
  pass is a full local one (lists the partition directory, checks the log end, retention);
* **``rlm run --once``** — a new process running the CLI's ``--once`` (every partition's pass, GC
  only when due: docs/operations.md "GC") over the steady state, twice: first with no GC recorded
  on the state root (it runs, and learns the manifests' stamps), then again (not due), then once
  more with the recorded GC aged a day (due, stamps known): wall time from the spawn and store
  requests;
* **daemon** — ``rlm run`` (subprocess) over the steady state: process start → ``/healthz``, →
  every partition's first pass done (its "startup: every partition passed once" log line), and
  its RSS then.

Stores: ``local`` (a directory, ``fsync = false``) or ``seaweed`` (a SeaweedFS ``weed server -s3``
started for the run, rlm.testing.seaweed).

    .venv/bin/python bench/scale_bench.py --store local --partitions 4000 --segments 10 40
    .venv/bin/python bench/scale_bench.py --store seaweed --partitions 1000 --segments 10
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import json
import os
import resource
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent.parent))  # after PYTHONPATH: rlm may come from elsewhere

from bench.benchlib import OUT, machine, record, template_batch, write_checkpoint, write_segment
from rlm.formats import naming
from rlm.formats.partition_metadata import format_partition_metadata
from rlm.logdir.discovery import PARTITION_METADATA
from rlm.testing.daemon import free_port, run_daemon
from rlm.testing.toml import toml_value

SECTION = "## Scale"
TOPICS = 10
INTRO = (
    "`bench/scale_bench.py`: P partitions × S tiny segments in one log dir. The first copy pass "
    "(ms and store requests per segment); a restart (new process → every partition passed once "
    "with nothing to copy) and its store requests; steady idle passes (ms per partition, store "
    "requests); RSS; daemon startup (→ `/healthz`, → every partition's first pass). Restart cost "
    "should not depend on S (docs/remote-state.md)."
)


def generate(logs: Path, partitions: int, segments: int) -> None:
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    template = template_batch(10, 60)
    hws = {}
    for i in range(partitions):
        topic = f"scale{i % TOPICS}"
        p = i // TOPICS
        part = logs / f"{topic}-{p}"
        part.mkdir()
        # A topic id, as every broker since Kafka 2.8 writes: a restart then has identity to check.
        topic_id = base64.urlsafe_b64encode(bytes([i % TOPICS + 1] * 16)).decode().rstrip("=")
        (part / PARTITION_METADATA).write_bytes(format_partition_metadata(topic_id))
        base = 0
        for _ in range(segments):
            base = write_segment(part, base, template, 2)
        for suffix in (naming.LOG, naming.INDEX, naming.TIME_INDEX):
            (part / naming.segment_file_name(base, suffix)).write_bytes(b"")
        hws[(topic, p)] = base
    write_checkpoint(logs, "replication-offset-checkpoint", hws)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _counted_manager(cfg: str) -> tuple[Any, Any]:
    from rlm.config import load_settings
    from rlm.storage.registry import open_backend
    from rlm.testing.counting import CountingBackend
    from rlm.tiering.manager import RemoteLogManager

    settings = load_settings(Path(cfg))
    counting = CountingBackend(open_backend(settings.remote.backend, settings.remote.options))
    return RemoteLogManager(settings, counting), counting


def child_copy(cfg: str) -> None:
    """Fresh process: the first copy pass, with its store requests; then the passes a daemon makes
    next (each partition found idle and its mark persisted: the steady state a restart meets)."""
    manager, counting = _counted_manager(cfg)
    t = time.perf_counter()
    results = manager.run_once(gc=False)
    elapsed = time.perf_counter() - t
    requests = dict(counting.calls)
    time.sleep(0.3)  # a partition is marked idle only once its directory settled (rlm.fsutil.SETTLE_NS)
    settled = manager.run_once(gc=False)
    print(
        json.dumps(
            {
                "copy_s": elapsed,
                "copied": sum(len(r.copied) for r in results),
                "errors": [r.error for r in results + settled if r.error][:3],
                "requests": requests,
            }
        )
    )


def child_restart(cfg: str, started: float) -> None:
    """Fresh process: restart + first pass, then steady idle passes; requests and RSS."""
    from rlm.daemon.scheduler import tune_gc

    manager, counting = _counted_manager(cfg)
    tune_gc()  # as `rlm run` does once it is set up
    built = time.perf_counter()
    first = manager.run_once(gc=False)
    first_s = time.perf_counter() - built
    first_idle = sum(r.idle for r in first)
    restart_s = time.time() - started  # from the parent's spawn: includes interpreter + imports
    usage = resource.getrusage(resource.RUSAGE_SELF)
    restart_cpu_s = usage.ru_utime + usage.ru_stime  # the same span in CPU: what load cannot inflate
    restart_requests = dict(counting.calls)
    time.sleep(0.3)  # the first pass marks a partition idle only once its directory settled
    manager.run_once(gc=False)
    counting.calls.clear()
    steady = []
    for _ in range(3):
        t = time.perf_counter()
        results = manager.run_once(gc=False)
        steady.append(time.perf_counter() - t)
    errors = [r.error for r in first + results if r.error]
    print(
        json.dumps(
            {
                "restart_s": restart_s,
                "restart_cpu_s": restart_cpu_s,
                "first_pass_s": first_s,
                "first_idle": first_idle,
                "restart_requests": restart_requests,
                "steady_s": min(steady),
                "steady_requests": dict(counting.calls),
                "idle": sum(r.idle for r in results),
                "rss_kib": rss_kib(os.getpid()),
                "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                "errors": errors[:3],
                "partitions": len(first),
            }
        )
    )


def child_once(cfg: str, started: float) -> None:
    """Fresh process: what ``rlm run --once`` does (the CLI's own ``_once``: every partition's
    pass, then GC only when due), its wall time from the spawn and its store requests."""
    import contextlib as _contextlib
    import io

    from rlm.cli.run import _once

    manager, counting = _counted_manager(cfg)
    summary = io.StringIO()
    with _contextlib.redirect_stdout(summary):
        _once(manager, quiet=True)
    done = json.loads(summary.getvalue().strip().splitlines()[-1])
    print(
        json.dumps(
            {
                "once_s": time.time() - started,
                "requests": dict(counting.calls),
                "gc": done["gc"],
                "errors": list(done["errors"].values())[:3],
            }
        )
    )


def rlm_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RLM_")}


def write_cfg(path: Path, logs: Path, remote: dict[str, Any], port: int) -> Path:
    opts = "".join(f"{k} = {toml_value(v)}\n" for k, v in remote["options"].items())
    path.write_text(
        f'[log]\ndirs = ["{logs}"]\n[remote]\nbackend = "{remote["backend"]}"\n[remote.options]\n{opts}'
        f"[tiering]\ntask_interval_ms = 3600000\ngc_grace_ms = 3600000\n"
        f'state_dir = "{logs.parent / "state"}"\n[server]\nport = {port}\n'
    )
    return path


def daemon(cfg: Path, port: int, partitions: int) -> dict[str, float]:
    """``rlm run``: spawn → ``/healthz``, spawn → the daemon's "startup: every partition passed
    once" log line (read from its stderr: polling ``/metrics`` for it would render every
    partition's series each time, and slow the passes it measures), and its RSS then."""
    log_path = cfg.parent / "daemon.log"
    start = time.perf_counter()
    health = done = None
    with run_daemon(cfg, port, log_path, cwd=cfg.parent, wait=False) as rlm:
        while time.perf_counter() - start < 1800 and done is None:
            if health is None:
                with (
                    contextlib.suppress(OSError),
                    urllib.request.urlopen(rlm.url + "/healthz", timeout=5) as r,
                ):
                    if r.status == 200:
                        health = time.perf_counter() - start
            if "startup: every partition passed once" in log_path.read_text():
                done = time.perf_counter() - start
            rlm.alive()
            time.sleep(0.02)
        rss = rss_kib(rlm.proc.pid)
    return {"healthz": health or float("nan"), "first_pass": done or float("nan"), "rss_kib": rss}


@contextlib.contextmanager
def store(kind: str, work: Path) -> Iterator[dict[str, Any]]:
    if kind == "local":
        yield {"backend": "local", "options": {"root": str(work / "store"), "fsync": False}}
        return
    from rlm.testing.seaweed import SeaweedServer

    with SeaweedServer(work / "weed") as server:
        server.make_bucket("scale")
        yield {"backend": "s3", "options": server.options("scale")}


def _run_child(mode: str, cfg: Path, work: Path) -> dict[str, Any]:
    # cwd: not the repo, whose rlm/ would shadow a PYTHONPATH-selected one
    out = subprocess.run(
        [sys.executable, __file__, f"--child-{mode}", str(cfg), repr(time.time())],
        env=rlm_env(),
        capture_output=True,
        text=True,
        check=False,
        cwd=work,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    assert not result["errors"], result
    return result


def _age_last_gc(state: Path) -> None:
    """The last finished GC recorded a day earlier: the next ``--once`` finds it due."""
    from rlm.tiering.expire.gc_schedule import GC_FILE

    record = state / GC_FILE
    finished = json.loads(record.read_text())["finished_ms"]
    record.write_text(json.dumps({"finished_ms": finished - 86_400_000}))


def _forget_idle_marks(state: Path) -> None:
    """Every partition changed since its last pass: its persisted idle mark is gone."""
    from rlm.tiering.idle import IDLE_FILE

    for mark in state.rglob(IDLE_FILE):
        mark.unlink()


def measure(kind: str, partitions: int, segments: int) -> dict[str, Any]:
    work = OUT / "scale" / f"{kind}-{partitions}x{segments}"
    logs = work / "logs"
    shutil.rmtree(work, ignore_errors=True)
    generate(logs, partitions, segments)
    with store(kind, work) as remote:
        port = free_port()
        cfg = write_cfg(work / "scale.toml", logs, remote, port)
        copy = _run_child("copy", cfg, work)
        assert copy["copied"] == partitions * segments, copy
        restart = _run_child("restart", cfg, work)  # over the steady state the copy process left
        assert restart["partitions"] == partitions and restart["first_idle"] == partitions, restart
        # `rlm run --once` twice: no GC recorded on the state root yet (it runs), then not due.
        once_gc = _run_child("once", cfg, work)
        once = _run_child("once", cfg, work)
        assert once_gc["gc"]["ran"] and not once["gc"]["ran"], (once_gc, once)
        _age_last_gc(logs.parent / "state")  # due again, with the manifests' stamps now known
        once_gc_again = _run_child("once", cfg, work)
        assert once_gc_again["gc"]["ran"], once_gc_again
        d = daemon(cfg, port, partitions)
        _forget_idle_marks(logs.parent / "state")
        changed = _run_child("restart", cfg, work)  # every partition re-examined (local files only)
        assert changed["partitions"] == partitions and changed["first_idle"] == 0, changed
    n = partitions * segments
    res = {
        "store": kind,
        "P": partitions,
        "S": segments,
        "copy_ms_per_segment": copy["copy_s"] / n * 1000,
        "copy_requests_per_segment": sum(copy["requests"].values()) / n,
        "copy_requests": copy["requests"],
        "restart_s": restart["restart_s"],
        "first_pass_s": restart["first_pass_s"],
        "restart_cpu_s": restart["restart_cpu_s"],
        "restart_requests": restart["restart_requests"],
        "changed_s": changed["restart_s"],
        "changed_requests": changed["restart_requests"],
        "once_gc_s": once_gc["once_s"],
        "once_gc_requests": once_gc["requests"],
        "once_gc_again_s": once_gc_again["once_s"],
        "once_gc_again_requests": once_gc_again["requests"],
        "once_s": once["once_s"],
        "once_requests": once["requests"],
        "steady_ms_per_partition": restart["steady_s"] / partitions * 1000,
        "steady_requests": restart["steady_requests"],
        "idle": restart["idle"],
        "rss_mib": restart["rss_kib"] / 1024,
        "d_health": d["healthz"],
        "d_first": d["first_pass"],
        "d_rss_mib": d["rss_kib"] / 1024,
    }
    print(json.dumps(res), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return res


def table(rows: list[dict[str, Any]]) -> str:
    out = (
        "| store | partitions × segments | first copy: ms / segment | requests / segment | restart + "
        "first idle pass (of which the pass) [CPU] | its store requests | "
        "restart, every partition changed | its store requests | "
        "`run --once`, first GC | its store requests | `run --once`, GC not due | its store requests | "
        "`run --once`, GC due again | its store requests | "
        "steady idle pass: ms / partition | its store requests | "
        "RSS | daemon start → /healthz | daemon start → all passed | daemon RSS |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    for r in rows:
        out += (
            f"| {r['store']} | {r['P']} × {r['S']} | {r['copy_ms_per_segment']:.1f} | "
            f"{r['copy_requests_per_segment']:.1f} | "
            f"{r['restart_s']:.2f} s ({r['first_pass_s']:.2f} s) [{r['restart_cpu_s']:.2f} s] | "
            f"{sum(r['restart_requests'].values())} | {r['changed_s']:.2f} s | "
            f"{sum(r['changed_requests'].values())} | "
            f"{r['once_gc_s']:.2f} s | {sum(r['once_gc_requests'].values())} | "
            f"{r['once_s']:.2f} s | {sum(r['once_requests'].values())} | "
            f"{r['once_gc_again_s']:.2f} s | {sum(r['once_gc_again_requests'].values())} | "
            f"{r['steady_ms_per_partition']:.3f} | "
            f"{sum(r['steady_requests'].values())} | {r['rss_mib']:.0f} MiB | {r['d_health']:.2f} s | "
            f"{r['d_first']:.2f} s | {r['d_rss_mib']:.0f} MiB |\n"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 4 and sys.argv[1].startswith("--child-"):
        if sys.argv[1] == "--child-copy":
            child_copy(sys.argv[2])
        elif sys.argv[1] == "--child-once":
            child_once(sys.argv[2], float(sys.argv[3]))
        else:
            child_restart(sys.argv[2], float(sys.argv[3]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", choices=("local", "seaweed"), default="local")
    ap.add_argument("--partitions", type=int, nargs="+", default=[500, 1000])
    ap.add_argument("--segments", type=int, nargs="+", default=[10], help="rolled segments per partition")
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument("--label", default="")
    args = ap.parse_args(argv)
    rows = [measure(args.store, p, s) for p in args.partitions for s in args.segments]
    text = table(rows)
    print(text)
    if not args.no_record:
        given = argv if argv is not None else sys.argv[1:]
        shown = [
            a
            for i, a in enumerate(given)
            if not a.startswith("--label") and not (i and given[i - 1] == "--label")
        ]
        entry = (
            f"### {dt.date.today().isoformat()} — {args.store} store, up to {max(args.partitions)} "
            f"partitions × {max(args.segments)} segments{' — ' + args.label if args.label else ''}\n\n"
            f"- machine: {machine()}; load average at the end {os.getloadavg()[0]:.1f} (other "
            "processes share the host: the CPU column is what load cannot inflate)\n"
            f"- command: `{' '.join(['.venv/bin/python bench/scale_bench.py', *shown])}`; the restart "
            "is measured from the spawn of a new process (interpreter and imports included)\n"
            "- requests by operation: "
            + "; ".join(
                f"{r['P']}×{r['S']}: copy {r['copy_requests']}, restart "
                f"{r['restart_requests']}, --once with GC {r['once_gc_requests']}, --once "
                f"{r['once_requests']}, --once with GC again {r['once_gc_again_requests']}, "
                f"steady {r['steady_requests']}"
                for r in rows
            )
            + "\n\n"
            + text
        )
        record(SECTION, entry, intro=INTRO)
        print("recorded in BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
