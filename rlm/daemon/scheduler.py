"""``rlm run``: APScheduler 3 interval jobs, one sweep over the partitions, graceful shutdown on
SIGTERM/SIGINT.

* a sweep job every ``task_interval_ms`` checks on its own thread which partitions are idle
  (rlm/tiering/idle.py: a few ``stat`` calls) and submits a pass of every other partition whose
  previous pass has finished to a bounded pass pool (``max_concurrent_uploads`` + 2 threads): a slow partition
  never runs twice at once, never piles up missed runs (a pass still queued or running is not
  submitted again) and never holds up the others; the manager's per-partition lock backs that up.
  One job instead of one per partition: at 4 000 partitions adding the jobs alone took 0.9-2 s and
  each run cost the scheduler ~35 µs, more than an idle pass (docs/operations.md);
* a discovery job tracks partitions that appear (new topics; their first pass is submitted at once)
  and forgets vanished ones;
* a GC job runs every ``max(task_interval, min(gc_grace, old_incarnation_grace, deleted_topic_grace) / 4)``;
* while the store is unreachable, a probe job checks every ``remote.probe_interval_ms`` whether it
  is back (docs/operations.md), so status turns green without waiting for a partition pass;
* uploads additionally share the manager's global cap and token bucket.

Shutdown: the first SIGTERM/SIGINT stops scheduling, drops queued passes and tells in-flight
uploads to abandon at their next chunk (an abandoned attempt is invisible and cleaned by
recovery/GC); running passes and jobs are awaited; the process exits 0.
"""

from __future__ import annotations

import concurrent.futures
import faulthandler
import gc
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
from rlm.logdir.discovery import PartitionDir
from rlm.tiering.manager import RemoteLogManager

__all__ = ["TieringDaemon", "tune_gc"]

log = logging.getLogger(__name__)


class TieringDaemon:
    def __init__(self, manager: RemoteLogManager) -> None:
        self.manager = manager
        t = manager.settings.tiering
        self.interval_s = t.task_interval_ms / 1000
        self.scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(max_workers=4)},  # discover, sweep, gc, probe
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )
        self.passes = concurrent.futures.ThreadPoolExecutor(
            t.max_concurrent_uploads + 2, thread_name_prefix="rlm-pass"
        )
        self.stopped = threading.Event()
        self._partitions: dict[str, PartitionDir] = {}
        # name -> its latest pass, until a sweep sees it over
        self._submitted: dict[str, concurrent.futures.Future[None]] = {}
        self._submit_lock = threading.Lock()
        # name -> (passes started, passes finished, monotonic start of the last): for the SIGUSR1 dump
        self._runs: dict[str, tuple[int, int, float]] = {}
        # The partitions of the first discovery whose first pass has not finished: when it empties,
        # the restart is over (logged once with its duration; docs/operations.md).
        self._first_round: set[str] | None = None
        self._started = time.monotonic()

    def _partition_job(self, part: PartitionDir) -> None:
        if self.stopped.is_set():
            return
        started, finished, _ = self._runs.get(part.name, (0, 0, 0.0))
        self._runs[part.name] = (started + 1, finished, time.monotonic())
        try:
            result = self.manager.run_partition(part)
        except Exception:  # run_partition reports its own errors; never let one kill the pool thread
            log.exception("%s: pass failed", part.name)
            return
        finally:
            s, f, at = self._runs[part.name]
            self._runs[part.name] = (s, f + 1, at)
            self._first_pass_done(part.name)
        if result.copied or result.deleted:
            log.info("%s: copied %s, deleted %s", part.name, result.copied, result.deleted)

    def _submit(self, names: list[str]) -> None:
        """Queue a pass of each partition of ``names`` whose previous pass is over, unless it is
        idle (docs/operations.md "What an idle pass costs"): that check is a few ``stat`` calls,
        made here, because handing each of 10 000 idle partitions to a pass thread every sweep
        (a future, a wake-up, the GIL passed back and forth) cost more than the check itself."""
        with self._submit_lock:
            for name in names:
                part = self._partitions.get(name)
                running = self._submitted.get(name)
                if part is None or self.stopped.is_set():
                    continue
                if running is not None:
                    if not running.done():
                        continue
                    del self._submitted[name]  # over: the next sweep need not ask its future again
                if self._idle(part):
                    continue
                try:
                    self._submitted[name] = self.passes.submit(self._partition_job, part)
                except RuntimeError:  # the pool shut down: stopping
                    return

    def _idle(self, part: PartitionDir) -> bool:
        try:
            return self.manager.idle_check(part)[0]
        except Exception:  # never lose the sweep over one partition: its pass reports the error
            log.exception("%s: idle check failed", part.name)
            return False

    def _first_pass_done(self, name: str) -> None:
        with self._submit_lock:
            if self._first_round is None or name not in self._first_round:
                return
            self._first_round.discard(name)
            if self._first_round:
                return
            self._first_round = None
        log.info(
            "startup: every partition passed once (%d partitions) %.2f s after the daemon started",
            len(self._partitions),
            time.monotonic() - self._started,
        )

    def sweep(self) -> None:
        """Every task interval: a pass of every known partition not still in one, those nearest the
        broker's deletion of an untiered segment first (docs/topic-policy.md §8): with more
        partitions waiting than pass threads, they get the threads and upload slots first."""
        self._submit([p.name for p in self.manager.copy_order(list(self._partitions.values()))])

    def discover(self) -> None:
        found = {p.name: p for p in self.manager.discover()}
        new = [name for name in found if name not in self._partitions]
        with self._submit_lock:
            for name in set(self._submitted) - set(found):
                del self._submitted[name]
            self._partitions = found
            if self._first_round is None and not self._runs and found:  # the first discovery
                self._first_round = set(found)
            elif self._first_round is not None:
                self._first_round &= set(found)  # a vanished partition never passes
        self._submit(new)  # a new partition's first pass does not wait for the next sweep

    def _gc(self) -> None:
        orphans = self.manager.collect_garbage(save_stamps=True)  # the daemon holds the state-dir lock
        if orphans:
            log.info("gc deleted %d abandoned attempts", len(orphans))

    def start(self) -> None:
        # Which segment walk serves this daemon: compiled, or the Python fallback (docs/scan.md).
        log.info("record scan: %s", SCAN_IMPL)
        active_decoder()  # logs "record decoder: native (...)" or "python (why)" once (docs/decoder.md)
        self.scheduler.start()
        self.scheduler.add_job(
            self.discover, "interval", id="discover", seconds=self.interval_s, next_run_time=_now()
        )
        self.scheduler.add_job(self.sweep, "interval", id="sweep", seconds=self.interval_s)
        gc_every = self.manager.gc_schedule.interval_s  # rlm run --once keeps to it too
        self.scheduler.add_job(self._gc, "interval", id="gc", seconds=gc_every)
        # From now on only this timer probes an unreachable store: API requests fail fast.
        self.manager.health.timer_probes = True
        probe_every = max(0.1, self.manager.settings.remote.probe_interval_ms / 1000)
        self.scheduler.add_job(self.manager.store.probe, "interval", id="store-probe", seconds=probe_every)

    def request_stop(self, signum: int | None = None, _frame: FrameType | None = None) -> None:
        if not self.stopped.is_set():
            log.info(
                "shutting down (%s): finishing or abandoning in-flight copies",
                signal.Signals(signum).name if signum else "requested",
            )
        self.stopped.set()

    def _dump_state(self, _signum: int | None = None, _frame: FrameType | None = None) -> None:
        faulthandler.dump_traceback(all_threads=True)
        for job in self.scheduler.get_jobs():
            log.warning("job %s: next run %s", job.id, job.next_run_time)
        for name, held in self.manager.pass_locks_held().items():
            log.warning("partition %s: pass lock %s", name, "held" if held else "free")
        now = time.monotonic()
        for name, (started, finished, at) in self._runs.items():
            log.warning(
                "partition %s: %d passes started, %d finished, last started %.1f s ago",
                name,
                started,
                finished,
                now - at,
            )
        executor = self.scheduler._lookup_executor("default")
        log.warning("running job instances: %s", getattr(executor, "_instances", "?"))
        with self._submit_lock:
            busy = sum(1 for f in self._submitted.values() if not f.done())
        log.warning("partition passes queued or running: %d of %d partitions", busy, len(self._partitions))

    def handle_signals(self) -> None:
        """Take SIGTERM/SIGINT (a graceful stop) and SIGUSR1 (a state dump) from now on. Called
        before anything listens: a supervisor that stops the daemon as soon as its API answers must
        get the graceful stop (exit 0), not the default action (killed by the signal)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.request_stop)
        # `kill -USR1 <pid>`: every thread's stack, each job's next run and each partition's pass
        # lock on stderr — what is a stuck partition waiting on?
        signal.signal(signal.SIGUSR1, self._dump_state)

    def run_forever(self) -> None:
        """Run until SIGTERM/SIGINT (or :meth:`request_stop`); at once when one came already."""
        self.handle_signals()
        if self.stopped.is_set():  # stopped while the API was starting: nothing was scheduled
            self.manager.stop()
            self.passes.shutdown(wait=True, cancel_futures=True)
            log.info("stopped")
            return
        self.start()
        # Wait in short slices, never in one blocking wait: the kernel may deliver SIGTERM to any
        # of the daemon's threads, and Python runs the handler only when the main thread next runs
        # bytecode — a main thread blocked in one untimed wait would not wake until some other
        # signal reached it (seen as a shutdown hanging until SIGKILL, 1 run in 7 on a busy host).
        while not self.stopped.wait(0.2):
            pass
        self.scheduler.pause()
        self.manager.stop()
        self.scheduler.shutdown(wait=True)
        self.passes.shutdown(wait=True, cancel_futures=True)  # queued passes dropped, running awaited
        log.info("stopped")


def tune_gc() -> None:
    """Make the cyclic garbage collector cheap for a daemon holding state for thousands of
    partitions (docs/operations.md): what exists at start (imported modules, the app, settings)
    is frozen out of every collection, and the youngest generation is collected every 20 000 net
    allocations instead of 700. Measured at 4 000 partitions: a restart's first pass spent ~0.3 s of
    its ~1.7 s in 720 collections, ~0.1 s with this. rlm's own objects rarely form cycles, so
    the larger young generation delays little memory; a cycle that would hold a store read's bytes
    is cut where it forms (rlm/tiering/read/readahead.py), since the collector's count of objects
    does not see how many bytes wait for it."""
    gc.freeze()
    gc.set_threshold(20_000, 20, 10)


def _now() -> datetime:
    return datetime.now(UTC)
