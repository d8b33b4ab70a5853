"""Flags copies that take far longer than their size warrants (a stuck upload, a dying disk).

The budget for a copy is ``slack_s + factor × size / throughput``, where throughput is a moving
average of completed copies (floored, so the first copies are judged generously). Exceeding it
logs a warning and counts ``rlm_copy_watchdog_slow_total`` once per copy; it does not cancel
anything — a slow copy is still a correct one.

One thread watches every copy, started with the first and kept: it sleeps until the earliest
budget runs out, and a copy that starts is only announced to it when its budget ends before the
time it sleeps until (rare: budgets are ≥ ``slack_s``). A timer thread per copy cost a thread
start and a wake-up per segment (#35).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rlm.logdir.discovery import SegmentFiles
from rlm.tiering.local import TieringMetrics

if TYPE_CHECKING:
    from rlm.tiering.local import PartitionContext

__all__ = ["CopyWatchdog"]

log = logging.getLogger(__name__)


class CopyWatchdog:
    def __init__(
        self,
        metrics: TieringMetrics,
        *,
        factor: float = 10.0,
        slack_s: float = 60.0,
        floor_bytes_per_s: float = 1 << 20,
    ) -> None:
        self.metrics = metrics
        self.factor = factor
        self.slack_s = slack_s
        self.floor = floor_bytes_per_s
        self._throughput = floor_bytes_per_s
        self._lock = threading.Lock()
        self.flagged: list[str] = []
        self._watched = threading.Condition(threading.Lock())
        self._due: dict[int, tuple[float, PartitionContext, SegmentFiles, float]] = {}  # monotonic s
        self._tokens = itertools.count()
        self._wakes_at: float | None = None  # when the watching thread wakes; None: not before told
        self._thread: threading.Thread | None = None

    def budget_s(self, size: int) -> float:
        with self._lock:
            rate = max(self._throughput, self.floor)
        return self.slack_s + self.factor * size / rate

    def _flag(self, ctx: PartitionContext, seg: SegmentFiles, budget: float) -> None:
        msg = (
            f"{ctx.part.name}: copy of segment {seg.base_offset} ({seg.size} bytes) is taking "
            f"longer than {budget:.0f}s"
        )
        log.warning(msg)
        self.flagged.append(msg)
        ctx.series(self.metrics.slow_copies).inc()

    @contextmanager
    def watch(self, ctx: PartitionContext, seg: SegmentFiles) -> Iterator[None]:
        budget = self.budget_s(seg.size)
        started = time.monotonic()
        token = self._arm(started + budget, ctx, seg, budget)
        try:
            yield
        finally:
            with self._watched:
                self._due.pop(token, None)  # the thread finds nothing due when it wakes: no wake-up now
        elapsed = max(time.monotonic() - started, 1e-3)
        if seg.size >= 1 << 20:  # tiny segments say nothing about throughput
            with self._lock:
                self._throughput = 0.8 * self._throughput + 0.2 * (seg.size / elapsed)

    def _arm(self, deadline: float, ctx: PartitionContext, seg: SegmentFiles, budget: float) -> int:
        with self._watched:
            token = next(self._tokens)
            self._due[token] = (deadline, ctx, seg, budget)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rlm-copy-watchdog", daemon=True)
                self._thread.start()
            elif self._wakes_at is None or deadline < self._wakes_at:
                self._watched.notify()
        return token

    def _run(self) -> None:
        """Flag each copy whose deadline passed, then sleep until the next one (or until told)."""
        while True:
            with self._watched:
                now = time.monotonic()
                late = [token for token, (deadline, *_) in self._due.items() if deadline <= now]
                flags = [self._due.pop(token) for token in late]
                self._wakes_at = min((deadline for deadline, *_ in self._due.values()), default=None)
                if not flags:
                    self._watched.wait(None if self._wakes_at is None else self._wakes_at - now)
                    continue
            for _, ctx, seg, budget in flags:  # outside the lock: a log line, a metric
                self._flag(ctx, seg, budget)
