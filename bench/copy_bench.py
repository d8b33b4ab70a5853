"""Copy benchmark: rlm tiering (``RemoteLogManager.run_once`` with the s3 backend) vs boto3
``upload_file`` of the same files to the same S3 endpoint, in the same run.

The endpoint is a real S3 server, SeaweedFS (``weed server``; ``--server moto`` for moto's
``python -m moto.server``), in its own process, so the client side (rlm, or boto3) does not share
a GIL with the server. The partition is N rolled segments of
``--segment-mib`` MiB (plus the empty active segment), written fast: one ~16 KiB v2 batch repeated
with rewritten base offsets (not covered by the CRC), with sparse ``.index`` / ``.timeindex`` files
and a ``replication-offset-checkpoint`` committing everything.

* **rlm**: one full pass — pin, scan (every batch CRC-32C verified), upload ``.log`` (multipart),
  ``.index``, ``.timeindex``, leader-epoch checkpoint and the entries object, manifest, local index
  append; fresh local state and a fresh key prefix per run;
* **boto3**: ``client.upload_file`` of each segment's ``.log``, ``.index`` and ``.timeindex``, one
  file at a time, with a ``TransferConfig`` of the same part size / threshold / concurrency as the
  s3 backend's options.

The contenders alternate (``--repeat`` rounds); the table shows the best and the median of each
side and both ratios — the target is on the median (#35: one lucky run does not meet it). Objects
are deleted after every run (moto keeps them in memory, SeaweedFS on disk). MB/s = ``.log`` bytes
/ seconds. Target: rlm ≥ 0.95 × boto3 (median).

The s3 plugin is imported from this tree (``plugins/rlm-storage-s3``), not from wherever the
venv's editable install points, so the bench measures the checkout it is run from.

    .venv/bin/python bench/copy_bench.py                       # 4 × 256 MiB
    .venv/bin/python bench/copy_bench.py --segments 2 --segment-mib 64 --no-record
    .venv/bin/python bench/copy_bench.py --profile             # cProfile of one rlm pass
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import os
import pstats
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "plugins" / "rlm-storage-s3"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.benchlib import (
    FAKE_AWS,
    OUT,
    S3_SERVERS,
    command_line,
    empty_prefix,
    machine,
    record,
    rolled_segments,
    s3_server,
)
from rlm.config import load_settings
from rlm.formats import naming
from rlm.storage.registry import open_backend
from rlm.testing.configs import write_config
from rlm.tiering.local import TieringMetrics
from rlm.tiering.manager import RemoteLogManager

SECTION = "## Copy throughput"
TARGET = 0.95
BUCKET = "bench"
TOPIC = "copy"
INTRO = (
    "`bench/copy_bench.py`: one `rlm run --once`-equivalent pass (`RemoteLogManager.run_once`, s3 "
    "backend: pin, CRC-verifying scan, multipart upload, index objects, manifest, local index) vs "
    "boto3 `upload_file` of the same `.log`/`.index`/`.timeindex` files with the same part size and "
    "concurrency, to the same S3 server (SeaweedFS unless `--server moto`) in its own process; "
    "alternating, best and median of each. Target: rlm ≥ 0.95 × boto3 (median of the alternated runs)."
)


SERVER: list[int] = []  # the S3 server's pid


def cpu() -> tuple[float, float]:
    """CPU seconds (user + system) so far of this process (all threads) and of the S3 server."""
    t = os.times()
    server = 0.0
    if SERVER:
        fields = Path(f"/proc/{SERVER[0]}/stat").read_text().rsplit(")", 1)[1].split()
        server = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return t.user + t.system, server


class Timed:
    """Wall and CPU (client, server) seconds of a block."""

    def __enter__(self) -> Timed:
        self.start, (self.c0, self.s0) = time.perf_counter(), cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        c1, s1 = cpu()
        self.wall, self.client, self.server = time.perf_counter() - self.start, c1 - self.c0, s1 - self.s0


def s3_options(endpoint: str, prefix: str, part_mib: int, concurrency: int) -> dict[str, Any]:
    return {
        "bucket": BUCKET,
        "prefix": prefix,
        "endpoint_url": endpoint,
        "region": "us-east-1",
        "path_style": True,
        "part_size": f"{part_mib}MiB",
        "max_concurrency": concurrency,
        "conditional_create": "native",
    }


def reset_local(logs: Path, state: Path) -> None:
    for f in (logs / f"{TOPIC}-0").glob("*.remote*"):
        f.unlink()
    shutil.rmtree(state, ignore_errors=True)


def run_rlm(
    work: Path, logs: Path, backend: Any, args: argparse.Namespace, profile: cProfile.Profile | None = None
) -> Timed:
    """One pass with fresh local state; ``backend`` is long-lived, as in the daemon (and as the
    boto3 client of the baseline), so client start-up is not part of the timing."""
    state = work / "state"
    reset_local(logs, state)
    cfg = write_config(
        work / "rlm.toml", [logs], backend="s3", options={"bucket": BUCKET}, state_dir=str(state)
    )
    manager = RemoteLogManager(load_settings(cfg), backend, metrics=TieringMetrics())
    with Timed() as timed:
        if profile is not None:
            profile.enable()
        results = manager.run_once(gc=False)
        if profile is not None:
            profile.disable()
    copied = sum(len(r.copied) for r in results)
    errors = [r.error for r in results if r.error]
    assert copied == args.segments and not errors, (copied, errors)
    return timed


def boto_client(endpoint: str, concurrency: int) -> Any:
    import boto3
    import botocore.config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=botocore.config.Config(
            s3={"addressing_style": "path"},
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=max(10, 2 * concurrency),
            request_checksum_calculation="when_supported",
            response_checksum_validation="when_supported",
        ),
    )


def run_boto(client: Any, files: list[Path], prefix: str, args: argparse.Namespace) -> Timed:
    from boto3.s3.transfer import TransferConfig

    part = args.part_mib << 20
    tc = TransferConfig(multipart_threshold=part, multipart_chunksize=part, max_concurrency=args.concurrency)
    with Timed() as timed:
        for log in files:
            for f in (log, log.with_suffix(naming.INDEX), log.with_suffix(naming.TIME_INDEX)):
                client.upload_file(str(f), BUCKET, f"{prefix}{f.name}", Config=tc)
    return timed


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--segments", type=int, default=4)
    ap.add_argument("--segment-mib", type=int, default=256)
    ap.add_argument("--part-mib", type=int, default=8, help="multipart part size, both sides (default 8)")
    ap.add_argument("--concurrency", type=int, default=8, help="parallel parts, both sides (default 8)")
    ap.add_argument(
        "--repeat", type=int, default=3, help="alternating rounds; best and median of each are reported"
    )
    ap.add_argument("--profile", action="store_true", help="cProfile one rlm pass and print the top")
    ap.add_argument("--no-record", action="store_true", help="do not write BENCHMARKS.md")
    ap.add_argument("--label", default="", help="a note for the BENCHMARKS.md entry")
    ap.add_argument(
        "--server",
        choices=S3_SERVERS,
        default="seaweedfs",
        help="the S3 server, in its own process (default seaweedfs: a real one)",
    )
    return ap.parse_args(argv)


def profile_rlm(work: Path, logs: Path, backend: Any, client: Any, args: argparse.Namespace) -> None:
    """cProfile one rlm pass; print the top functions by own and by cumulative time."""
    prof = cProfile.Profile()
    run_rlm(work, logs, backend, args, prof)
    empty_prefix(client, BUCKET, "rlm/")
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(18)
    stats.sort_stats("cumulative").print_stats(25)


def measure(
    work: Path, logs: Path, files: list[Path], endpoint: str, args: argparse.Namespace
) -> tuple[list[Timed], list[Timed]] | None:
    """Warm both clients up, then ``--repeat`` alternating rounds of an rlm pass and boto3's
    upload_file of the same files: (rlm runs, boto3 runs); None after ``--profile``."""
    client = boto_client(endpoint, args.concurrency)
    backend = open_backend("s3", s3_options(endpoint, "rlm/", args.part_mib, args.concurrency))
    try:
        if args.profile:
            profile_rlm(work, logs, backend, client, args)
            return None
        # Warm-up of both clients (page cache, connections, the server's code paths), not timed.
        run_boto(client, files[:1], "boto/", args)
        backend.upload_file("warm/" + files[0].name, files[0])
        empty_prefix(client, BUCKET, "")
        size = sum(f.stat().st_size for f in files)
        runs: dict[str, list[Timed]] = {"rlm": [], "boto": []}
        for i in range(args.repeat):
            for who in ("rlm", "boto") if i % 2 == 0 else ("boto", "rlm"):
                if who == "rlm":
                    t = run_rlm(work, logs, backend, args)
                else:
                    t = run_boto(client, files, "boto/", args)
                runs[who].append(t)
                empty_prefix(client, BUCKET, "")
                print(
                    f"  round {i} {who}: {size / t.wall / 1e6:.0f} MB/s, CPU s client {t.client:.2f} "
                    f"server {t.server:.2f}",
                    flush=True,
                )
        return runs["rlm"], runs["boto"]
    finally:
        backend.close()
        client.close()


def _cpu_cols(ts: list[Timed]) -> str:
    best = min(ts, key=lambda t: t.wall)
    return f"{best.client:.2f} | {best.server:.2f}"


def table(size: int, rlm_t: list[Timed], boto_t: list[Timed]) -> str:
    """The Markdown result: best and median wall time of each side, MB/s of each (``size``
    bytes), and the rlm / boto3 ratios of the best and of the median runs (the target's)."""
    rlm_s = [t.wall for t in rlm_t]
    boto_s = [t.wall for t in boto_t]
    rlm_med, boto_med = statistics.median(rlm_s), statistics.median(boto_s)

    def row(name: str, runs: list[float], med: float, ts: list[Timed]) -> str:
        return (
            f"| {name} | {min(runs):.2f} | {med:.2f} | {size / min(runs) / 1e6:,.0f} | "
            f"{size / med / 1e6:,.0f} | {', '.join(f'{s:.2f}' for s in runs)} | {_cpu_cols(ts)} |\n"
        )

    return (
        "| measurement | best s | median s | MB/s (best) | MB/s (median) | all runs (s) | "
        "client CPU s (best run) | S3 server CPU s |\n"
        "|---|---|---|---|---|---|---|---|\n"
        + row("boto3 `upload_file` (.log/.index/.timeindex)", boto_s, boto_med, boto_t)
        + row("rlm pass (scan + upload + index + manifest)", rlm_s, rlm_med, rlm_t)
        + f"| **ratio** (rlm / boto3, target ≥ {TARGET} on the median) | | | "
        f"{min(boto_s) / min(rlm_s):.2f} | **{boto_med / rlm_med:.2f}** | | | |\n"
    )


def report(args: argparse.Namespace, argv: list[str] | None, result: str) -> None:
    """Append the run to BENCHMARKS.md (the command shown without its ``--label``)."""
    given = list(argv if argv is not None else sys.argv[1:])
    shown = [
        a
        for i, a in enumerate(given)
        if not a.startswith("--label") and not (i and given[i - 1] == "--label")
    ]
    cmd = command_line(shown)
    entry = (
        f"### {dt.date.today().isoformat()} — {args.segments} × {args.segment_mib} MiB segments, "
        f"part size {args.part_mib} MiB, concurrency {args.concurrency}"
        f"{' — ' + args.label if args.label else ''}\n\n"
        f"- machine: {machine()}\n"
        f"- command: `{cmd}` ({args.server} server in its own process; "
        f"alternating, {args.repeat} rounds: best and median)\n\n" + result
    )
    record(SECTION, entry, intro=INTRO)
    print("recorded in BENCHMARKS.md")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.update(FAKE_AWS)
    work = OUT / "copy"
    logs = work / "logs"
    t = time.perf_counter()
    files = rolled_segments(logs, TOPIC, args.segments, args.segment_mib)
    size = sum(f.stat().st_size for f in files)
    print(f"{len(files)} segments, {size / 2**20:.0f} MiB ({time.perf_counter() - t:.1f} s to prepare)")
    with s3_server(args.server, work, BUCKET) as (endpoint, pid):
        SERVER[:] = [pid]
        runs = measure(work, logs, files, endpoint, args)
    if runs is None:
        return 0
    result = table(size, *runs)
    print(result)
    if not args.no_record:
        report(args, argv, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
