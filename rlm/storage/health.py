"""Store health: the one place that knows whether the remote store answers (docs/operations.md).

:class:`HealthTrackingBackend` wraps the backend where the manager is built, so every store call of
the process — tiering passes, GC, lookups and fetches — goes through one :class:`StoreHealth`:

* A call that fails with :class:`~rlm.errors.TransientStorageError` (connection refused, timeouts,
  5xx, after the retries below it: rlm.storage.retry) starts or extends a failure *streak*; any answer of the
  store (success, not-found, exists, a refusal) ends it. When a streak has lasted
  ``unreachable_after_ms`` — measured from the start of its first failed call, so one call that
  hung until its read timeout counts in full — the store is **unreachable**.
* A call still in flight after ``unreachable_after_ms`` (a frozen store: the TCP connect succeeds,
  no answer comes) makes the store unreachable as well, without waiting for its timeout. Uploads
  are excluded: a large segment legitimately takes long.
* The daemon calls :meth:`HealthTrackingBackend.probe` every ``probe_interval_ms``: a cheap
  listing when no other call finished within that interval, so an idle daemon notices an outage.
* While unreachable, calls fail at once with :class:`~rlm.errors.StoreUnavailableError` (no
  network I/O, not retried by :class:`~rlm.storage.retry.RetryPolicy`), except one *probe* call
  at a time, at most every ``probe_interval_ms``. With :attr:`StoreHealth.timer_probes` (the
  daemon) only :meth:`HealthTrackingBackend.probe` probes, so an API request never waits on a
  frozen store; without it (a one-shot process) the first call after the interval is the probe.
  A probe that gets an answer makes the store reachable again; nothing is lost, callers simply
  retry on their next pass.

Times: ``*_ms`` fields of :meth:`StoreHealth.snapshot` are epoch milliseconds; durations are ms.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, BinaryIO, ClassVar, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge

from rlm.errors import StorageError, StoreUnavailableError, TransientStorageError
from rlm.storage.api import ListPage, ObjectInfo, StorageBackend
from rlm.storage.wrapper import WrappingBackend

__all__ = [
    "DEFAULT_PROBE_INTERVAL_MS",
    "DEFAULT_UNREACHABLE_AFTER_MS",
    "HealthTrackingBackend",
    "StoreHealth",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_UNREACHABLE_AFTER_MS = 5_000
DEFAULT_PROBE_INTERVAL_MS = 5_000


def _iso(epoch_ms: float) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="seconds")


class StoreHealth:
    """Reachability of one store, fed by :class:`HealthTrackingBackend`; thread-safe.

    ``clock`` is monotonic seconds (durations), ``wall`` epoch seconds (what is reported); both
    injectable for tests. ``registry`` gets the ``rlm_remote_store_*`` metrics.
    """

    def __init__(
        self,
        *,
        unreachable_after_ms: int = DEFAULT_UNREACHABLE_AFTER_MS,
        probe_interval_ms: int = DEFAULT_PROBE_INTERVAL_MS,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if unreachable_after_ms < 0 or probe_interval_ms < 0:
            raise ValueError("unreachable_after_ms and probe_interval_ms must be >= 0")
        self.unreachable_after = unreachable_after_ms / 1000
        self.probe_interval = probe_interval_ms / 1000
        self._clock, self._wall = clock, wall
        self._lock = threading.Lock()
        self._down = False
        self._streak: tuple[float, float] | None = None  # (monotonic, wall) start of the first failure
        self._failures = 0  # consecutive failed calls
        self._last_error: str | None = None
        self._last_error_wall: float | None = None
        self._last_success_wall: float | None = None
        self._in_flight: dict[int, tuple[float, float]] = {}  # non-upload calls: id → (monotonic, wall)
        self._ids = itertools.count()
        self._probing = False
        self._last_probe = float("-inf")
        self._last_done = float("-inf")  # monotonic end of the last answered/failed call
        self.timer_probes = False  # True: only probe() probes (daemon timer)
        self._metrics(registry or CollectorRegistry())

    def _metrics(self, registry: CollectorRegistry) -> None:
        up = Gauge(
            "rlm_remote_store_up",
            "1 while the remote store answers, 0 while it is unreachable "
            "(every call failed or one hangs for remote.unreachable_after_ms)",
            registry=registry,
        )
        up.set_function(lambda: 0.0 if self.unreachable_since() is not None else 1.0)
        down_for = Gauge(
            "rlm_remote_store_unreachable_seconds",
            "Seconds since the remote store became unreachable; 0 while it answers",
            registry=registry,
        )
        down_for.set_function(self._unreachable_seconds)
        self.errors = Counter(
            "rlm_remote_store_errors",
            "Store calls that failed with a transient "
            "error (connection, timeout, 5xx) after the backend's own retries",
            registry=registry,
        )
        self.fast_failures = Counter(
            "rlm_remote_store_fast_failures",
            "Store calls refused without network I/O because the store is unreachable",
            registry=registry,
        )

    # -- state ----------------------------------------------------------------------------------

    def _stalled_locked(self, now: float) -> tuple[float, float] | None:
        """The oldest in-flight call if it has run longer than ``unreachable_after``."""
        if not self._in_flight:
            return None
        oldest = min(self._in_flight.values())
        return oldest if now - oldest[0] >= self.unreachable_after else None

    def _since_locked(self, now: float) -> tuple[float, float] | None:
        if self._down and self._streak is not None:
            return self._streak
        return self._stalled_locked(now)

    def unreachable_since(self) -> float | None:
        """Epoch seconds since which the store is unreachable, None while it answers."""
        with self._lock:
            since = self._since_locked(self._clock())
        return None if since is None else since[1]

    def _unreachable_seconds(self) -> float:
        with self._lock:
            now = self._clock()
            since = self._since_locked(now)
        return 0.0 if since is None else max(0.0, now - since[0])

    def snapshot(self) -> dict[str, Any]:
        """What ``GET /v1/store`` answers: status ``up`` | ``unreachable`` | ``unknown`` (no call yet)."""
        with self._lock:
            now, wall = self._clock(), self._wall()
            since = self._since_locked(now)
            stalled = self._stalled_locked(now)
            error = self._last_error
            if since is not None and stalled is not None and not self._down:
                error = f"a store call has not answered for {now - stalled[0]:.1f} s"
            known = self._last_success_wall is not None or self._last_error_wall is not None
            next_probe = (
                None
                if since is None
                else (wall + max(0.0, self._last_probe + self.probe_interval - now)) * 1000
            )
            return {
                "status": "unreachable" if since is not None else ("up" if known else "unknown"),
                "reachable": since is None,
                "unreachable_since_ms": None if since is None else int(since[1] * 1000),
                "unreachable_for_ms": None if since is None else int((now - since[0]) * 1000),
                "last_error": error,
                "last_error_ms": None if self._last_error_wall is None else int(self._last_error_wall * 1000),
                "last_success_ms": (
                    None if self._last_success_wall is None else int(self._last_success_wall * 1000)
                ),
                "consecutive_failures": self._failures,
                "next_probe_ms": None if next_probe is None else int(next_probe),
                "unreachable_after_ms": int(self.unreachable_after * 1000),
                "probe_interval_ms": int(self.probe_interval * 1000),
            }

    # -- the gate and the outcome of each call ----------------------------------------------------

    def admit(self, probing: bool = False) -> bool:
        """Before a call: True = go (the call is the probe), False = go (normal call);
        raises :class:`StoreUnavailableError` while unreachable and no probe is due.
        ``probing``: the call comes from :meth:`HealthTrackingBackend.probe`."""
        with self._lock:
            now = self._clock()
            since = self._since_locked(now)
            if since is None:
                return False
            stalled = self._stalled_locked(now) is not None
            may_probe = probing or not self.timer_probes
            if (
                may_probe
                and not stalled
                and not self._probing
                and now - self._last_probe >= self.probe_interval
            ):
                self._probing, self._last_probe = True, now
                return True
            error = self._last_error or "a store call has not answered"
            wait = max(0.0, self._last_probe + self.probe_interval - now)
        self.fast_failures.inc()
        raise StoreUnavailableError(
            f"remote store unreachable since {_iso(since[1] * 1000)} ({now - since[0]:.0f} s); "
            f"next probe in {wait:.1f} s; last error: {error}"
        )

    def succeeded(self, probe: bool) -> None:
        with self._lock:
            was_down = self._down
            if probe:
                self._probing = False
            self._down, self._streak, self._failures = False, None, 0
            self._last_success_wall, self._last_done = self._wall(), self._clock()
        if was_down:
            log.warning("remote store reachable again")

    def failed(self, started: tuple[float, float], err: BaseException, probe: bool) -> bool:
        """Record a transient failure of a call started at ``started``; True once unreachable."""
        with self._lock:
            now = self._clock()
            self._last_done = now
            if probe:
                self._probing, self._last_probe = False, now
            if self._streak is None:
                self._streak = started
            self._failures += 1
            self._last_error, self._last_error_wall = " ".join(str(err).split()), self._wall()
            newly = not self._down and now - self._streak[0] >= self.unreachable_after
            if newly:
                self._down, self._last_probe = True, now
            down = self._down
        self.errors.inc()
        if newly:
            log.error(
                "remote store unreachable since %s: %s (calls fail fast; probing every %.1f s)",
                _iso(self._streak_wall() * 1000),
                err,
                self.probe_interval,
            )
        return down

    def _streak_wall(self) -> float:
        with self._lock:
            return self._streak[1] if self._streak is not None else self._wall()

    def probe_due(self) -> bool:
        """True when the daemon's timer should call the store: it is unreachable, or no call has
        finished within ``probe_interval`` (an idle daemon still notices an outage)."""
        with self._lock:
            now = self._clock()
            if self._since_locked(now) is not None:
                return True
            return not self._in_flight and now - self._last_done >= self.probe_interval

    def released(self, probe: bool) -> None:
        """A call ended neither in an answer nor a transient failure (e.g. a bad key): free the probe."""
        if probe:
            with self._lock:
                self._probing = False

    @contextmanager
    def tracked(self, *, upload: bool = False, probing: bool = False) -> Iterator[None]:
        """Run one store call under the gate; see the module doc for what counts as what."""
        probe = self.admit(probing)
        started = (self._clock(), self._wall())
        call_id = None
        if not upload:
            call_id = next(self._ids)
            with self._lock:
                self._in_flight[call_id] = started
        try:
            yield
        except TransientStorageError as err:
            self._untrack(call_id)
            if self.failed(started, err, probe):
                raise StoreUnavailableError(f"remote store unreachable: {err}") from err
            raise
        except StorageError:
            self._untrack(call_id)
            self.succeeded(probe)  # the store answered (not found, exists, denied, ...)
            raise
        except BaseException:
            self._untrack(call_id)
            self.released(probe)
            raise
        self._untrack(call_id)
        self.succeeded(probe)

    def _untrack(self, call_id: int | None) -> None:
        if call_id is not None:
            with self._lock:
                self._in_flight.pop(call_id, None)


class HealthTrackingBackend(WrappingBackend):
    """Every call of ``inner`` goes through ``health`` (gate, outcome, hang detection).

    Pickles as the inner backend alone: health is per process (Spark executors build their own).
    """

    name: ClassVar[str] = "health"
    PROBE_PREFIX = "rlm-health-probe/"

    def __init__(self, inner: StorageBackend, health: StoreHealth) -> None:
        self.inner = inner
        self.health = health
        self.options = {}

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()

    def __repr__(self) -> str:
        return f"HealthTrackingBackend({self.inner!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return self.inner.__reduce__()

    def probe(self) -> bool:
        """One cheap listing when :meth:`StoreHealth.probe_due` (daemon timer); True if the store
        answered or no probe was due. While unreachable the gate still admits one probe per
        interval, so this never adds load beyond that."""
        if not self.health.probe_due():
            return True
        try:
            with self.health.tracked(probing=True):
                self.inner.list_page(self.PROBE_PREFIX, limit=1)
        except StoreUnavailableError:
            return False
        except StorageError:
            return self.health.unreachable_since() is None
        return True

    def _put(self, key: str, stream: BinaryIO, if_absent: bool) -> ObjectInfo:
        with self.health.tracked(upload=True):
            return self.inner.put(key, stream, if_absent=if_absent)

    def _read(self, key: str, start: int, end: int | None) -> bytes:
        with self.health.tracked():
            return self.inner.read(key, start, end)

    def _head(self, key: str) -> ObjectInfo:
        with self.health.tracked():
            return self.inner.head(key)

    def _list_page(self, prefix: str, start_after: str | None, limit: int) -> ListPage:
        with self.health.tracked():
            return self.inner.list_page(prefix, token=start_after, limit=limit)

    def _delete(self, key: str) -> None:
        with self.health.tracked():
            self.inner.delete(key)
