"""A segment's companion objects upload on the process's companion threads
(``SharedResources.companions``) beside its ``.log`` (``upload_together``): threads are kept
across segments instead of a pool started and ended per segment, and no companion upload
outlives the call — it returns or raises only once every one has finished or was cancelled.
Real threads, real log files and a real local store."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rlm.errors import StorageError
from rlm.tiering.copy.upload import upload_together
from rlm.tiering.local import COMPANION_THREADS
from rlm.tiering.store import StoredObject
from tests.tiering.test_broker_files import TOPIC, _manager, _write

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


def test_companion_threads_are_kept_across_segments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    logs, store = tmp_path / "logs", tmp_path / "store"
    _write(logs, TOPIC, 0, seed=41)
    started: list[str] = []
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        started.append(self.name)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    manager = _manager(logs, store)
    [result] = manager.run_once(gc=False)
    assert result.error is None and len(result.copied) > 4
    companions = [n for n in started if n.startswith("rlm-upload")]
    # At most the kept pool's threads, however many segments; a pool per segment started
    # min(companions, COMPANION_THREADS) = 4 threads for each of them (36 here).
    bound = COMPANION_THREADS * manager.shared.settings.max_concurrent_uploads
    assert 0 < len(companions) <= bound < COMPANION_THREADS * len(result.copied)


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
