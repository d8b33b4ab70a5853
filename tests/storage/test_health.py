"""StoreHealth / HealthTrackingBackend over a real in-memory store with a switchable outage.

The clock is injected (no sleeps, nothing timed): the rules under test are "every call failed for
unreachable_after → unreachable", "one call in flight that long → unreachable", "then fail fast
without touching the store, one probe per interval", "any answer → reachable again".
"""

from __future__ import annotations

import threading
from typing import ClassVar

import pytest
from prometheus_client import CollectorRegistry

from rlm.errors import ObjectNotFoundError, StoreUnavailableError, TransientStorageError
from rlm.storage.api import ListPage, ObjectInfo, StorageBackend
from rlm.storage.health import HealthTrackingBackend, StoreHealth
from rlm.storage.memory import MemoryBackend
from rlm.storage.retry import RetryPolicy
from rlm.storage.wrapper import WrappingBackend


class Switchable(WrappingBackend):
    """Fault injection for these tests: while ``down`` every call raises a transient error (as a
    refused connection does); ``gate`` (when set) blocks reads until released (a frozen store)."""

    name: ClassVar[str] = "switchable"

    def __init__(self, inner: StorageBackend) -> None:
        self.inner, self.options = inner, {}
        self.down = False
        self.calls = 0
        self.gate: threading.Event | None = None

    def _check(self) -> None:
        self.calls += 1
        if self.down:
            raise TransientStorageError("connection refused (injected)")

    def _read(self, key: str, start: int, end: int | None) -> bytes:
        if self.gate is not None:
            self.gate.wait(10)
        self._check()
        return super()._read(key, start, end)

    def _head(self, key: str) -> ObjectInfo:
        self._check()
        return super()._head(key)

    def _list_page(self, prefix: str, start_after: str | None, limit: int) -> ListPage:
        self._check()
        return super()._list_page(prefix, start_after, limit)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


Rig = tuple[HealthTrackingBackend, Switchable, Clock, CollectorRegistry]


@pytest.fixture
def rig() -> Rig:
    clock, registry = Clock(), CollectorRegistry()
    store = Switchable(MemoryBackend())
    store.put("k", b"value")
    health = StoreHealth(
        unreachable_after_ms=2000,
        probe_interval_ms=5000,
        registry=registry,
        clock=clock,
        wall=lambda: clock.t + 1.7e9,
    )
    return HealthTrackingBackend(store, health), store, clock, registry


def _sample(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(name)


def test_short_failures_pass_through_and_an_answer_resets(rig: Rig) -> None:
    backend, store, clock, registry = rig
    assert backend.health.snapshot()["status"] == "unknown"
    store.down = True
    with pytest.raises(TransientStorageError):
        backend.read("k")
    clock.t += 1.0  # streak 1 s < 2 s: still reachable, still retryable
    with pytest.raises(TransientStorageError) as info:
        backend.read("k")
    assert not isinstance(info.value, StoreUnavailableError)
    assert backend.health.snapshot()["reachable"] is True
    store.down = False
    assert backend.read("k") == b"value"
    snap = backend.health.snapshot()
    assert snap["status"] == "up" and snap["consecutive_failures"] == 0
    store.down = True
    clock.t += 1.5  # a new streak starts from scratch: 1.5 s is not enough
    with pytest.raises(TransientStorageError):
        backend.read("k")
    assert backend.health.snapshot()["reachable"] is True
    assert _sample(registry, "rlm_remote_store_errors_total") == 3


def test_unreachable_fails_fast_until_a_probe_answers(rig: Rig) -> None:
    backend, store, clock, registry = rig
    store.down = True
    with pytest.raises(TransientStorageError):
        backend.read("k")
    clock.t += 2.5
    with pytest.raises(StoreUnavailableError):  # the streak reached 2 s: this failure trips it
        backend.read("k")
    snap = backend.health.snapshot()
    assert snap["status"] == "unreachable" and snap["reachable"] is False
    assert snap["unreachable_since_ms"] == int((1000.0 + 1.7e9) * 1000)
    assert snap["unreachable_for_ms"] == 2500
    assert "connection refused" in snap["last_error"]
    assert _sample(registry, "rlm_remote_store_up") == 0
    assert _sample(registry, "rlm_remote_store_unreachable_seconds") == 2.5
    calls = store.calls
    for _ in range(5):  # no network I/O while unreachable and no probe is due
        with pytest.raises(StoreUnavailableError, match="unreachable since"):
            backend.head("k")
    assert store.calls == calls
    assert _sample(registry, "rlm_remote_store_fast_failures_total") == 5
    clock.t += 5.0  # a probe is due: exactly one call goes through; it fails, so still down
    with pytest.raises(StoreUnavailableError):
        backend.read("k")
    assert store.calls == calls + 1
    with pytest.raises(StoreUnavailableError):
        backend.read("k")
    assert store.calls == calls + 1
    store.down = False
    clock.t += 5.0
    assert backend.read("k") == b"value"  # the probe answers: reachable again
    assert backend.read("k") == b"value"
    snap = backend.health.snapshot()
    assert snap["status"] == "up" and snap["unreachable_since_ms"] is None
    assert _sample(registry, "rlm_remote_store_up") == 1
    assert _sample(registry, "rlm_remote_store_unreachable_seconds") == 0


def test_retry_policy_stops_at_the_first_fast_failure(rig: Rig) -> None:
    backend, store, clock, _ = rig
    store.down = True

    def sleep(s: float) -> None:
        clock.t += 1.0  # each retry waits 1 s of the injected clock

    policy = RetryPolicy(max_attempts=50, sleep=sleep)
    with pytest.raises(StoreUnavailableError):
        policy.call(backend.read, "k")
    assert store.calls == 3  # 0 s, 1 s, 2 s: tripped; never 50 attempts against a dead store


def test_a_hanging_call_makes_the_store_unreachable_and_others_fail_fast(rig: Rig) -> None:
    backend, store, clock, _ = rig
    store.gate = threading.Event()
    result: dict[str, object] = {}
    t = threading.Thread(target=lambda: result.setdefault("v", backend.read("k")))
    t.start()
    try:
        while not backend.health._in_flight:  # the read is inside the store now
            threading.Event().wait(0.01)
        assert backend.health.snapshot()["reachable"] is True
        clock.t += 2.0
        snap = backend.health.snapshot()
        assert snap["status"] == "unreachable"
        assert "has not answered for 2.0 s" in snap["last_error"]
        with pytest.raises(StoreUnavailableError):
            backend.head("k")  # fails fast: no probe while the hanging call is still out
        assert backend.health.probe_due()
    finally:
        store.gate.set()
        t.join(10)
    assert result["v"] == b"value"  # it answered after all: reachable again
    assert backend.health.snapshot()["status"] == "up"
    assert backend.head("k").size == 5


def test_uploads_are_not_hangs_and_not_found_is_an_answer(rig: Rig) -> None:
    backend, store, clock, _ = rig
    store.down = True
    with pytest.raises(TransientStorageError):
        backend.read("k")
    store.down = False
    clock.t += 10
    with pytest.raises(ObjectNotFoundError):
        backend.read("missing")  # the store answered: the streak is over
    assert backend.health.snapshot()["status"] == "up"
    backend.put("big", b"x" * 10)  # uploads are tracked for errors but never count as a hang
    assert not backend.health._in_flight


def test_idle_probe_notices_an_outage(rig: Rig) -> None:
    backend, store, clock, _ = rig
    assert backend.health.probe_due()  # nothing happened yet
    assert backend.probe() is True
    assert not backend.health.probe_due()  # a call just answered
    store.down = True
    clock.t += 5.0
    assert backend.health.probe_due()
    assert backend.probe() is True  # one failure is not an outage yet
    assert backend.health.snapshot()["consecutive_failures"] == 1
    clock.t += 5.0
    assert backend.probe() is False
    assert backend.health.snapshot()["status"] == "unreachable"
    store.down = False
    clock.t += 5.0
    assert backend.probe() is True
    assert backend.health.snapshot()["status"] == "up"


def test_pickles_as_the_inner_backend(rig: Rig) -> None:
    import pickle

    backend = HealthTrackingBackend(MemoryBackend(namespace="pickle-health"), StoreHealth())
    clone = pickle.loads(pickle.dumps(backend))
    assert type(clone) is MemoryBackend


def test_with_a_probe_timer_only_the_timer_probes(rig: Rig) -> None:
    backend, store, clock, _ = rig
    backend.health.timer_probes = True  # the daemon: API requests must never be the probe
    store.down = True
    with pytest.raises(TransientStorageError):
        backend.read("k")
    clock.t += 3.0
    with pytest.raises(StoreUnavailableError):
        backend.read("k")
    clock.t += 60.0
    calls = store.calls
    with pytest.raises(StoreUnavailableError):
        backend.read("k")  # long past the interval, but not the timer: fails fast
    assert store.calls == calls
    store.down = False
    assert backend.probe() is True and store.calls == calls + 1
    assert backend.read("k") == b"value"
