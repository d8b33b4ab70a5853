"""``rlm run``: APScheduler 3 interval jobs per partition, graceful shutdown on SIGTERM/SIGINT.

* one interval job per partition (``task_interval_ms``), ``max_instances=1`` + ``coalesce`` so a
  slow partition never runs twice at once or piles up missed runs; the manager's per-partition
  lock backs that up;
* a discovery job adds jobs for partitions that appear (new topics) and removes vanished ones;
* a GC job runs every ``max(task_interval, gc_grace / 4)``;
* while the store is unreachable, a probe job checks every ``remote.probe_interval_ms`` whether it
  is back (docs/operations.md), so status turns green without waiting for a partition pass;
* a bounded thread pool (``max_concurrent_uploads`` + 2 workers) runs them; uploads additionally
  share the manager's global cap and token bucket.

Shutdown: the first SIGTERM/SIGINT stops scheduling and tells in-flight uploads to abandon at
their next chunk (an abandoned attempt is invisible and cleaned by recovery/GC); running jobs are
awaited; the process exits 0.
"""

from __future__ import annotations

import faulthandler
import logging
import signal
import threading
import time
from datetime import UTC, datetime
from types import FrameType

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from rlm.formats.records.choice import active_decoder
from rlm.formats.records.scan import SCAN_IMPL
from rlm.logdir.scan import PartitionDir
from rlm.tiering.manager import RemoteLogManager

log = logging.getLogger(__name__)


class TieringDaemon:
    def __init__(self, manager: RemoteLogManager) -> None:
        self.manager = manager
        t = manager.settings.tiering
        self.interval_s = t.task_interval_ms / 1000
        self.scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(max_workers=t.max_concurrent_uploads + 2)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )
        self.stopped = threading.Event()
        self._partitions: dict[str, PartitionDir] = {}
        # name -> (passes started, passes finished, monotonic start of the last): for the SIGUSR1 dump
        self._runs: dict[str, tuple[int, int, float]] = {}

    def _partition_job(self, part: PartitionDir) -> None:
        started, finished, _ = self._runs.get(part.name, (0, 0, 0.0))
        self._runs[part.name] = (started + 1, finished, time.monotonic())
        try:
            result = self.manager.run_partition(part)
        finally:
            s, f, at = self._runs[part.name]
            self._runs[part.name] = (s, f + 1, at)
        if result.copied or result.deleted:
            log.info("%s: copied %s, deleted %s", part.name, result.copied, result.deleted)

    def discover(self) -> None:
        found = {p.name: p for p in self.manager.discover()}
        for name, part in found.items():
            if name not in self._partitions:
                self.scheduler.add_job(self._partition_job, "interval", args=(part,), id=f"partition:{name}",
                                       seconds=self.interval_s, next_run_time=_now(), replace_existing=True)
        for name in set(self._partitions) - set(found):
            self.scheduler.remove_job(f"partition:{name}")
        self._partitions = found

    def _gc(self) -> None:
        orphans = self.manager.collect_garbage()
        if orphans:
            log.info("gc deleted %d abandoned attempts", len(orphans))

    def start(self) -> None:
        # Which segment walk serves this daemon: compiled, or the Python fallback (docs/scan.md).
        log.info("record scan: %s", SCAN_IMPL)
        active_decoder()  # logs "record decoder: native (...)" or "python (why)" once (docs/decoder.md)
        self.scheduler.start()
        self.scheduler.add_job(self.discover, "interval", id="discover", seconds=self.interval_s,
                               next_run_time=_now())
        gc_every = max(self.interval_s, self.manager.settings.tiering.gc_grace_ms / 4000)
        self.scheduler.add_job(self._gc, "interval", id="gc", seconds=gc_every)
        # From now on only this timer probes an unreachable store: API requests fail fast.
        self.manager.health.timer_probes = True
        probe_every = max(0.1, self.manager.settings.remote.probe_interval_ms / 1000)
        self.scheduler.add_job(self.manager.store.probe, "interval", id="store-probe", seconds=probe_every)

    def request_stop(self, signum: int | None = None, _frame: FrameType | None = None) -> None:
        if not self.stopped.is_set():
            log.info("shutting down (%s): finishing or abandoning in-flight copies",
                     signal.Signals(signum).name if signum else "requested")
        self.stopped.set()

    def _dump_state(self, _signum: int | None = None, _frame: FrameType | None = None) -> None:
        faulthandler.dump_traceback(all_threads=True)
        for job in self.scheduler.get_jobs():
            log.warning("job %s: next run %s", job.id, job.next_run_time)
        for name, held in self.manager.pass_locks_held().items():
            log.warning("partition %s: pass lock %s", name, "held" if held else "free")
        now = time.monotonic()
        for name, (started, finished, at) in self._runs.items():
            log.warning("partition %s: %d passes started, %d finished, last started %.1f s ago",
                        name, started, finished, now - at)
        executor = self.scheduler._lookup_executor("default")
        log.warning("running job instances: %s", getattr(executor, "_instances", "?"))

    def run_forever(self) -> None:
        """Run until SIGTERM/SIGINT (or :meth:`request_stop`)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.request_stop)
        # `kill -USR1 <pid>`: every thread's stack, each job's next run and each partition's pass
        # lock on stderr — what is a stuck partition waiting on?
        signal.signal(signal.SIGUSR1, self._dump_state)
        self.start()
        self.stopped.wait()
        self.scheduler.pause()
        self.manager.stop()
        self.scheduler.shutdown(wait=True)
        log.info("stopped")


def _now() -> datetime:
    return datetime.now(UTC)
