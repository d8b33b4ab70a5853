"""Flags copies that take far longer than their size warrants (a stuck upload, a dying disk).

The budget for a copy is ``slack_s + factor × size / throughput``, where throughput is a moving
average of completed copies (floored, so the first copies are judged generously). Exceeding it
logs a warning and counts ``rlm_copy_watchdog_slow_total`` once per copy; it does not cancel
anything — a slow copy is still a correct one.
"""

from __future__ import annotations

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
        timer = threading.Timer(budget, self._flag, args=(ctx, seg, budget))
        timer.daemon = True
        started = time.monotonic()
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
        elapsed = max(time.monotonic() - started, 1e-3)
        if seg.size >= 1 << 20:  # tiny segments say nothing about throughput
            with self._lock:
                self._throughput = 0.8 * self._throughput + 0.2 * (seg.size / elapsed)
