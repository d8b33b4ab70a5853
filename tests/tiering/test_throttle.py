"""The upload token bucket with a fake clock and sleep: rate honoured across streams, big takes split."""

from __future__ import annotations

import threading

import pytest

from rlm.tiering.local.throttle import TokenBucket


class FakeTime:
    """A clock that only moves when someone sleeps (thread-safe)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []
        self._lock = threading.Lock()

    def clock(self) -> float:
        with self._lock:
            return self.now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.sleeps.append(seconds)
            self.now += seconds


def _bucket(rate: float, burst: float | None = None) -> tuple[TokenBucket, FakeTime]:
    t = FakeTime()
    return TokenBucket(rate, burst, clock=t.clock, sleep=t.sleep), t


def test_unlimited_never_sleeps() -> None:
    bucket, t = _bucket(-1)
    bucket.take(10**9)
    assert t.sleeps == [] and bucket.unlimited


def test_burst_is_free_then_the_rate_applies() -> None:
    bucket, t = _bucket(1000, burst=500)
    bucket.take(500)
    assert t.sleeps == []
    bucket.take(250)
    assert t.sleeps == [pytest.approx(0.25)]


def test_large_take_is_split_into_burst_sized_pieces() -> None:
    bucket, t = _bucket(1000, burst=100)
    bucket.take(1000)
    # 10 pieces of 100: the first is covered by the initial burst, each later one waits 0.1 s.
    assert len(t.sleeps) == 9
    assert all(s == pytest.approx(0.1) for s in t.sleeps)
    assert t.now - 1000.0 == pytest.approx(0.9)


def test_rate_is_shared_by_interleaved_streams() -> None:
    """Two streams taking alternately get the rate together, not each."""
    bucket, t = _bucket(1000, burst=100)
    taken = 0
    for i in range(40):
        bucket.take(50)  # stream A and B alternate (i even / odd)
        taken += 50
        assert taken <= 100 + 1000 * (t.now - 1000.0) + 1e-6, i
    assert t.now - 1000.0 == pytest.approx((40 * 50 - 100) / 1000)


def test_rate_is_honoured_across_concurrent_threads() -> None:
    bucket, t = _bucket(10_000, burst=1_000)
    done: list[float] = []
    lock = threading.Lock()

    def stream() -> None:
        for _ in range(20):
            bucket.take(700)
            with lock:
                done.append(t.clock())

    threads = [threading.Thread(target=stream) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert len(done) == 80
    # However the threads interleave, by the time n takes have returned, n*700 bytes needed
    # at least (n*700 - burst) / rate seconds.
    for n, when in enumerate(sorted(done), start=1):
        assert n * 700 <= 1_000 + 10_000 * (when - 1000.0) + 1e-6
