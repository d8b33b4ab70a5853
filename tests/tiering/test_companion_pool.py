"""A segment's companion objects upload on the process's companion threads
(``SharedResources.companion_pool``) beside its ``.log`` (``upload_together``): threads are kept
across segments instead of a pool started and ended per segment, and no companion upload
outlives the call — it returns or raises only once every one has finished or was cancelled.
A store without round trips (``Capabilities.local_io``: ``local``, ``memory``) has no pool: the
companions go on the ``.log``'s thread after it. Real threads, real log files and a real local
store (behind the ``faulty`` store's latency where a store across a network is meant)."""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rlm.errors import StorageError
from rlm.storage.api import Capabilities
from rlm.storage.faults import FaultyBackend
from rlm.storage.local import LocalBackend
from rlm.storage.memory import MemoryBackend
from rlm.tiering.copy.upload import upload_together
from rlm.tiering.local import COMPANION_THREADS, TieringMetrics
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.store import StoredObject
from tests.tiering.test_broker_files import TOPIC, _settings, _write

SLOW_S = 0.3


@pytest.fixture
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(COMPANION_THREADS) as executor:
        yield executor


def _stored(name: str) -> StoredObject:
    return StoredObject(name, 1, 0)


def _slow(finished: threading.Event) -> Callable[[], StoredObject]:
    """A companion upload that takes :data:`SLOW_S`, then sets ``finished``."""

    def upload() -> StoredObject:
        time.sleep(SLOW_S)
        finished.set()
        return _stored("slow")

    return upload


def _threads_started(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads started from now on."""
    started: list[str] = []
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        started.append(self.name)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    return started


def test_companion_threads_are_kept_across_segments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    logs, store = tmp_path / "logs", tmp_path / "store"
    _write(logs, TOPIC, 0, seed=41)
    started = _threads_started(monkeypatch)
    # 1 ms a request: a store across a network, which the companion threads are for
    backend = FaultyBackend(inner_backend=LocalBackend(root=str(store)), latency_ms=1.0)
    assert not backend.capabilities.local_io
    manager = RemoteLogManager(_settings(logs, store), backend, metrics=TieringMetrics())
    [result] = manager.run_once(gc=False)
    assert result.error is None and len(result.copied) > 4
    companions = [n for n in started if n.startswith("rlm-upload")]
    # At most the kept pool's threads, however many segments; a pool per segment started
    # min(companions, COMPANION_THREADS) = 4 threads for each of them (36 here).
    bound = COMPANION_THREADS * manager.shared.settings.max_concurrent_uploads
    assert 0 < len(companions) <= bound < COMPANION_THREADS * len(result.copied)


def test_a_local_store_puts_companions_on_the_copy_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs, store = tmp_path / "logs", tmp_path / "store"
    _write(logs, TOPIC, 0, seed=41)
    started = _threads_started(monkeypatch)
    backend = LocalBackend(root=str(store))
    assert backend.capabilities.local_io and MemoryBackend().capabilities.local_io
    manager = RemoteLogManager(_settings(logs, store), backend, metrics=TieringMetrics())
    [result] = manager.run_once(gc=False)
    assert manager.shared.companion_pool() is None
    assert result.error is None and len(result.copied) > 4
    assert not [n for n in started if n.startswith("rlm-upload")]
    data = [info.key.rsplit("/", 1) for info in backend.list("") if "/data/" in info.key]
    # every segment's companions and entries object were stored beside its .log
    names = {name for _, name in data}
    assert {"segment.log", "segment.index", "segment.timeindex", "segment.remotelogindex"} <= names
    per_attempt = collections.Counter(attempt for attempt, _ in data)
    assert len(per_attempt) == len(result.copied) and min(per_attempt.values()) >= 4


def test_without_a_pool_every_object_goes_on_this_thread_the_log_first() -> None:
    ran: list[tuple[str, int]] = []

    def upload(name: str) -> Callable[[], StoredObject]:
        def put() -> StoredObject:
            ran.append((name, threading.get_ident()))
            return _stored(name)

        return put

    rest = {"index": upload("index"), "entries": upload("entries")}
    head, more = upload_together(None, upload("log"), rest)
    assert head.key == "log"
    assert {n: o.key for n, o in more.items()} == {"index": "index", "entries": "entries"}
    assert [name for name, _ in ran] == ["log", "index", "entries"]
    assert {ident for _, ident in ran} == {threading.get_ident()}


def test_without_a_pool_a_failed_log_upload_puts_no_companion() -> None:
    put: list[str] = []

    def failing_log() -> StoredObject:
        raise StorageError("log upload failed (test)")

    with pytest.raises(StorageError, match="log upload failed"):
        upload_together(None, failing_log, {"index": lambda: put.append("index") or _stored("index")})
    assert put == []


def test_a_failed_log_upload_returns_only_once_its_companions_ended(
    pool: concurrent.futures.ThreadPoolExecutor,
) -> None:
    finished = threading.Event()

    def failing_log() -> StoredObject:
        time.sleep(0.05)  # the companion is running by now: it cannot be cancelled
        raise StorageError("log upload failed (test)")

    with pytest.raises(StorageError, match="log upload failed"):
        upload_together(pool, failing_log, {"slow": _slow(finished)})
    assert finished.is_set()


def test_a_failed_companion_is_raised_once_the_others_ended(
    pool: concurrent.futures.ThreadPoolExecutor,
) -> None:
    finished = threading.Event()

    def failing() -> StoredObject:
        raise StorageError("companion failed (test)")

    with pytest.raises(StorageError, match="companion failed"):
        upload_together(pool, lambda: _stored("log"), {"failing": failing, "slow": _slow(finished)})
    assert finished.is_set()


def test_every_object_is_returned_by_name(pool: concurrent.futures.ThreadPoolExecutor) -> None:
    rest = {f"c{i}": (lambda i=i: _stored(f"c{i}")) for i in range(COMPANION_THREADS + 3)}
    head, more = upload_together(pool, lambda: _stored("log"), rest)
    assert head.key == "log"
    assert {name: o.key for name, o in more.items()} == {name: name for name in rest}


def test_the_pool_is_decided_at_the_first_upload_not_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An s3 store's capabilities probe it (two conditional PUTs): a process that copies nothing
    # must not pay them, and a store that is down must not keep `rlm run` from starting.
    logs, store = tmp_path / "logs", tmp_path / "store"
    _write(logs, TOPIC, 0, seed=41)
    asked: list[int] = []
    real = LocalBackend.capabilities

    def capabilities(self: LocalBackend) -> Capabilities:
        asked.append(1)
        return real.fget(self)  # type: ignore[attr-defined,no-any-return]

    monkeypatch.setattr(LocalBackend, "capabilities", property(capabilities))
    backend = LocalBackend(root=str(store))
    manager = RemoteLogManager(_settings(logs, store), backend, metrics=TieringMetrics())
    assert asked == []
    [result] = manager.run_once(gc=False)
    assert result.error is None and result.copied
    assert asked  # asked by the copy
    before = len(asked)
    assert manager.shared.companion_pool() is None and manager.shared.companion_pool() is None
    assert len(asked) == before  # decided once
