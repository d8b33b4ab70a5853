"""Scale benchmark: one log dir with P partitions × S tiny segments, everything already tiered to a
``local`` store; how pass time, memory and startup grow with P.

For each P (default 500, 1000, 2000): the log dir is written directly (one small v2 batch repeated,
``.index``/``.timeindex``, a ``replication-offset-checkpoint`` committing every rolled segment),
then measured:

* **first pass** — ``rlm run --once`` (subprocess) copying everything (P × S segments);
* **idle pass, fresh process** — a new process builds the manager and runs ``run_once`` with
  nothing to copy (this includes recovery of every partition: listing its manifests);
  **second idle pass** in the same process (steady state of the daemon); the process's RSS after
  them; **process start → first idle pass done**;
* **daemon** — ``rlm run`` (subprocess): process start → ``/healthz`` answers, → every partition's
  first pass done (``rlm_partition_task_seconds_count`` in ``/metrics``), and its RSS then.

The per-partition columns (ms per partition) show whether something grows faster than linearly.

    .venv/bin/python bench/scale_bench.py                         # 500, 1000, 2000
    .venv/bin/python bench/scale_bench.py --partitions 500 1000 2000 4000
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent))  # after PYTHONPATH: rlm may come from elsewhere

from bench.benchlib import OUT, free_port, machine, record, template_batch, write_checkpoint, write_segment
from rlm.formats import naming

SECTION = "## Scale"
TOPICS = 10
INTRO = (
    "`bench/scale_bench.py`: P partitions × 20 tiny segments in one log dir, everything tiered to a "
    "`local` store; a pass with nothing to copy in a fresh process (includes recovery: listing each "
    "partition's manifests) and again in the same process, RSS, and daemon startup (→ `/healthz`, → "
    "every partition's first pass), as P doubles. The ratio to watch is ms per partition: flat = "
    "linear growth.")


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


def child(cfg: str) -> None:
    """Fresh process: two idle passes, timings and RSS as one JSON line."""
    t0 = time.perf_counter()
    from rlm.cli.common import build_manager
    from rlm.config import load_settings

    manager = build_manager(load_settings(Path(cfg)))
    t1 = time.perf_counter()
    r1 = manager.run_once()
    t2 = time.perf_counter()
    rss1 = rss_kib(os.getpid())
    r2 = manager.run_once()
    t3 = time.perf_counter()
    copied = sum(len(r.copied) for r in r1 + r2)
    errors = [r.error for r in r1 + r2 if r.error]
    print(json.dumps({"setup": t1 - t0, "pass1": t2 - t1, "pass2": t3 - t2, "rss1_kib": rss1,
                      "rss2_kib": rss_kib(os.getpid()),
                      "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      "copied": copied, "errors": errors[:3], "partitions": len(r1)}))


def rlm_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RLM_")}


def write_cfg(path: Path, logs: Path, store: Path, port: int) -> Path:
    path.write_text(
        f'[log]\ndirs = ["{logs}"]\n[remote]\nbackend = "local"\n[remote.options]\nroot = "{store}"\n'
        f'fsync = false\n[tiering]\ntask_interval_ms = 3600000\ngc_grace_ms = 3600000\n'
        f'state_dir = "{store.parent / "state"}"\n[server]\nport = {port}\n')
    return path


def daemon(cfg: Path, port: int, partitions: int) -> dict[str, float]:
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "rlm", "run", "--config", str(cfg)], env=rlm_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cfg.parent)
    url = f"http://127.0.0.1:{port}"
    health = done = None
    pattern = re.compile(r'^rlm_partition_task_seconds_count\{[^}]*\} ([0-9.e+]+)$', re.M)
    try:
        while time.perf_counter() - start < 1800:
            try:
                if health is None:
                    with urllib.request.urlopen(url + "/healthz", timeout=5) as r:
                        if r.status == 200:
                            health = time.perf_counter() - start
                with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
                    text = r.read().decode()
                finished = sum(1 for v in pattern.findall(text) if float(v) >= 1)
                if finished >= partitions:
                    done = time.perf_counter() - start
                    break
            except OSError:
                pass
            time.sleep(0.5)
        rss = rss_kib(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {"healthz": health or float("nan"), "first_pass": done or float("nan"), "rss_kib": rss}


def measure(partitions: int, segments: int) -> dict[str, float]:
    work = OUT / "scale" / str(partitions)
    logs, store = work / "logs", work / "store"
    shutil.rmtree(work, ignore_errors=True)
    t = time.perf_counter()
    generate(logs, partitions, segments)
    gen_s = time.perf_counter() - t
    port = free_port()
    cfg = write_cfg(work / "scale.toml", logs, store, port)
    t = time.perf_counter()
    # cwd: not the repo, whose rlm/ would shadow a PYTHONPATH-selected one under `python -m`
    first = subprocess.run([sys.executable, "-m", "rlm", "run", "--config", str(cfg), "--once", "--quiet"],
                           env=rlm_env(), capture_output=True, text=True, check=False, cwd=work)
    first_s = time.perf_counter() - t
    assert first.returncode == 0, first.stderr[-2000:]
    assert json.loads(first.stdout)["segments_copied"] == partitions * segments, first.stdout
    t = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, "--child", str(cfg)], env=rlm_env(),
                         capture_output=True, text=True, check=False, cwd=work)
    fresh_total = time.perf_counter() - t
    assert out.returncode == 0, out.stderr[-2000:]
    c = json.loads(out.stdout.strip().splitlines()[-1])
    assert c["copied"] == 0 and not c["errors"] and c["partitions"] == partitions, c
    d = daemon(cfg, port, partitions)
    res = {"P": partitions, "gen": gen_s, "first": first_s, "pass1": c["pass1"], "pass2": c["pass2"],
           "start_to_pass1": fresh_total - c["pass2"], "rss_mib": c["rss2_kib"] / 1024,
           "d_health": d["healthz"], "d_first": d["first_pass"], "d_rss_mib": d["rss_kib"] / 1024}
    print(json.dumps(res), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return res


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", type=int, nargs="+", default=[500, 1000, 2000])
    ap.add_argument("--segments", type=int, default=20, help="rolled segments per partition (default 20)")
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument("--label", default="")
    args = ap.parse_args(argv)
    rows = [measure(p, args.segments) for p in args.partitions]

    def ms_per(v: float, p: int) -> str:
        return f"{v:.2f} s ({v / p * 1000:.2f})"

    table = ("| partitions × segments | first pass (copy all) | idle pass, fresh process | idle pass, same "
             "process | start → first idle pass | RSS after passes | daemon start → /healthz | daemon "
             "start → all partitions passed | daemon RSS |\n|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        p = int(r["P"])
        table += (f"| {p} × {args.segments} | {ms_per(r['first'], p)} | {ms_per(r['pass1'], p)} | "
                  f"{ms_per(r['pass2'], p)} | {ms_per(r['start_to_pass1'], p)} | {r['rss_mib']:.0f} MiB | "
                  f"{r['d_health']:.2f} s | {ms_per(r['d_first'], p)} | {r['d_rss_mib']:.0f} MiB |\n")
    print(table)
    if not args.no_record:
        given = argv if argv is not None else sys.argv[1:]
        shown = [a for i, a in enumerate(given)
                 if not a.startswith("--label") and not (i and given[i - 1] == "--label")]
        entry = (f"### {dt.date.today().isoformat()} — up to {max(args.partitions)} partitions × "
                 f"{args.segments} segments{' — ' + args.label if args.label else ''}\n\n"
                 f"- machine: {machine()}\n"
                 f"- command: `{' '.join(['.venv/bin/python bench/scale_bench.py', *shown])}`; local store "
                 "with `fsync = false`; times in s, (ms per partition) in parentheses\n\n" + table)
        record(SECTION, entry, intro=INTRO)
        print("recorded in BENCHMARKS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
