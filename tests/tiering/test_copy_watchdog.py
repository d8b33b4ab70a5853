"""The copy watchdog (rlm/tiering/copy/watchdog.py): a copy past its budget is flagged once (a
warning, ``rlm_copy_watchdog_slow_total``), one within it never; one thread watches every copy, and
a copy whose budget ends before the one the thread sleeps for is still flagged in time. Real
partition contexts of a generated log dir; budgets of a fraction of a second."""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from pathlib import Path

from rlm.cli.generate import generate_log_dir
from rlm.config import load_settings
from rlm.logdir.discovery import list_segments
from rlm.storage.local import LocalBackend
from rlm.testing.configs import write_config
from rlm.tiering.copy.watchdog import CopyWatchdog
from rlm.tiering.local import PartitionContext
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.manager import RemoteLogManager


def _context(tmp_path: Path) -> PartitionContext:
    logs = tmp_path / "logs"
    generate_log_dir(logs, [("t", 1)], seed=3, records=200, segment_bytes=8 * 1024)
    cfg = write_config(tmp_path / "c.toml", [logs], root=tmp_path / "store")
    manager = RemoteLogManager(
        load_settings(cfg), LocalBackend(root=str(tmp_path / "store")), metrics=TieringMetrics()
    )
    return manager.context(manager.discover()[0])


def _slow_count(ctx: PartitionContext) -> float:
    got = ctx.shared.metrics.registry.get_sample_value(
        "rlm_copy_watchdog_slow_total", {"topic": "t", "partition": "0"}
    )
    return got or 0.0


def _until(check: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not within the timeout"
        time.sleep(0.01)


def _watchers() -> int:
    return sum(t.name == "rlm-copy-watchdog" for t in threading.enumerate())


def test_a_copy_past_its_budget_is_flagged_once_and_one_within_it_never(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    seg = list_segments(ctx.part)[0]
    dog = CopyWatchdog(ctx.shared.metrics, factor=0.0, slack_s=0.2)
    with dog.watch(ctx, seg):
        _until(lambda: dog.flagged)
        time.sleep(0.3)  # longer still: not flagged twice
    assert len(dog.flagged) == 1 and f"segment {seg.base_offset}" in dog.flagged[0]
    assert _slow_count(ctx) == 1
    dog.slack_s = 0.5
    with dog.watch(ctx, seg):
        pass  # done at once
    time.sleep(0.8)  # past the budget it had
    assert len(dog.flagged) == 1 and _slow_count(ctx) == 1


def test_one_thread_watches_every_copy(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    segs = list_segments(ctx.part)
    before = _watchers()
    dog = CopyWatchdog(ctx.shared.metrics)
    for _ in range(5):
        for seg in segs:
            with dog.watch(ctx, seg):
                pass
    assert _watchers() - before == 1 and not dog.flagged


def test_a_budget_ending_before_the_one_the_thread_sleeps_for_is_flagged_in_time(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    first, second = list_segments(ctx.part)[:2]
    dog = CopyWatchdog(ctx.shared.metrics, factor=0.0, slack_s=600.0)
    with ExitStack() as open_copies:
        open_copies.enter_context(dog.watch(ctx, first))  # the thread sleeps for 10 minutes
        time.sleep(0.1)
        dog.slack_s = 0.2
        open_copies.enter_context(dog.watch(ctx, second))
        _until(lambda: dog.flagged, timeout=5.0)
        assert len(dog.flagged) == 1 and f"segment {second.base_offset}" in dog.flagged[0]
