"""In-process history of the tiering totals for the status page: a ring buffer of samples.

Every ``interval_s`` a sampler thread (or a caller of :meth:`TieringHistory.sample`) reads the
totals from the manager's Prometheus metrics — no file or store access, so sampling is cheap —
and appends one sample; the buffer keeps ``window_s`` worth (default: one hour of 10 s samples).
Served as ``GET /v1/history``. The history lives in memory only: it starts empty with the process.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from prometheus_client.metrics import MetricWrapperBase

from rlm.tiering.local.metrics import TieringMetrics

__all__ = ["TieringHistory"]


def _total(metric: MetricWrapperBase) -> float:
    """Sum of a labelled counter/gauge over every label set (``_total`` samples of counters)."""
    total = 0.0
    for family in metric.collect():
        for sample in family.samples:
            if family.type == "counter" and not sample.name.endswith("_total"):
                continue  # skip _created
            total += sample.value
    return total


class TieringHistory:
    """Totals over time: copied bytes (cumulative and per second), copy lag, remote size, errors."""

    def __init__(
        self,
        metrics: TieringMetrics,
        *,
        interval_s: float = 10.0,
        window_s: float = 3600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if interval_s <= 0 or window_s < interval_s:
            raise ValueError("interval_s must be > 0 and window_s >= interval_s")
        self.metrics = metrics
        self.interval_s = interval_s
        self.window_s = window_s
        self._clock = clock
        self._samples: deque[dict[str, Any]] = deque(maxlen=int(window_s // interval_s) + 1)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: tuple[int, dict[str, int]] | None = None  # the version before the last walk, totals
        self._steady = False

    def _totals(self) -> dict[str, int]:
        """The totals over every partition; walked again only when a series of them may have been
        updated since (``TieringMetrics.totals_version``). Kept only once two walks in a row saw the
        same version: the update a version names lands just after the version moves."""
        m = self.metrics
        version = m.totals_version
        if self._steady and self._last is not None and self._last[0] == version:
            return self._last[1]
        totals = {
            "copied_bytes": int(_total(m.copy_bytes)),
            "copied_segments": int(_total(m.copy_requests)),
            "copy_errors": int(_total(m.copy_errors)),
            "lag_bytes": int(_total(m.copy_lag_bytes)),
            "lag_segments": int(_total(m.copy_lag_segments)),
            "remote_bytes": int(_total(m.remote_log_size)),
        }
        self._steady = self._last is not None and self._last[0] == version  # two walks agree
        self._last = (version, totals)
        return totals

    def sample(self) -> dict[str, Any]:
        """Record the current totals now; returns the sample."""
        now_ms = int(self._clock() * 1000)
        with self._lock:
            totals = self._totals()
            prev = self._samples[-1] if self._samples else None
            rate: float | None = None
            if prev is not None and now_ms > prev["t"]:
                rate = max(0.0, totals["copied_bytes"] - prev["copied_bytes"]) * 1000 / (now_ms - prev["t"])
            doc = {"t": now_ms, "copy_bytes_per_sec": rate, **totals}
            self._samples.append(doc)
            return doc

    def snapshot(self) -> dict[str, Any]:
        """``{"interval_s", "window_s", "samples": [...]}``, oldest sample first."""
        with self._lock:
            samples = list(self._samples)
        return {"interval_s": self.interval_s, "window_s": self.window_s, "samples": samples}

    def start(self) -> TieringHistory:
        """Sample now and then every ``interval_s`` in a daemon thread until :meth:`stop`."""

        def loop() -> None:
            while True:
                self.sample()
                if self._stop.wait(self.interval_s):
                    return

        self._thread = threading.Thread(target=loop, name="rlm-history", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
