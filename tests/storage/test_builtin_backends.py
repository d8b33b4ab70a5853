"""The conformance suite against the core backends: memory, local, faulty (fault-free and with faults)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlm.errors import StorageError
from rlm.storage.api import StorageBackend
from rlm.storage.faults import FaultyBackend
from rlm.storage.local import TMP_DIR, LocalBackend
from rlm.storage.memory import MemoryBackend
from rlm.storage.retry import RetryingBackend, RetryPolicy
from rlm.testing.backend_suite import BackendSuite, TransientFault, call_fault


class TestMemoryBackend(BackendSuite):
    picklable = False  # a private memory store is empty after unpickling; see the namespace test

    @pytest.fixture
    def backend(self) -> Iterator[StorageBackend]:
        with MemoryBackend.from_options({}) as b:
            yield b


class TestLocalBackend(BackendSuite):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[StorageBackend]:
        with LocalBackend.from_options({"root": str(tmp_path / "store")}) as b:
            yield b

    @pytest.fixture
    def transient_fault(
        self, backend: StorageBackend, monkeypatch: pytest.MonkeyPatch
    ) -> Iterator[TransientFault | None]:
        """The file system timing out (NFS, FUSE) when the backend opens an object to read it."""
        import builtins

        from rlm.storage import local

        monkeypatch.setattr(local, "open", builtins.open, raising=False)  # restored afterwards
        yield call_fault(backend, local, "open", lambda: TimeoutError(110, "Connection timed out"))


class TestFaultyBackendWithoutFaults(BackendSuite):
    @pytest.fixture
    def backend(self) -> Iterator[StorageBackend]:
        opts = {"inner": "memory", "inner_options": {"namespace": "suite-faulty"}}
        with FaultyBackend.from_options(opts) as b:
            yield b


class TestRetriesOverFaultyMemory(BackendSuite):
    """Every suite operation goes through ~20% injected faults; retries make the contract hold.

    (That faults really fire and are recovered from is asserted in test_faults.py.)
    """

    picklable = False  # the policy's no-op sleep is a lambda

    @pytest.fixture
    def backend(self) -> Iterator[StorageBackend]:
        faulty = FaultyBackend.wrap(
            MemoryBackend(),
            seed=7,
            throttle_rate=0.05,
            error_rate=0.05,
            timeout_rate=0.02,
            lost_ack_rate=0.05,
            partial_upload_rate=0.03,
        )
        with RetryingBackend(faulty, RetryPolicy(max_attempts=30, sleep=lambda s: None)) as b:
            yield b


class TestRetriesOverFaultyLocal(TestRetriesOverFaultyMemory):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[StorageBackend]:
        faulty = FaultyBackend.wrap(
            LocalBackend(root=str(tmp_path)),
            seed=11,
            throttle_rate=0.05,
            error_rate=0.05,
            lost_ack_rate=0.05,
            partial_upload_rate=0.05,
        )
        with RetryingBackend(faulty, RetryPolicy(max_attempts=30, sleep=lambda s: None)) as b:
            yield b


# -- backend-specific behaviour ------------------------------------------------------------------


def test_memory_namespace_is_shared_and_pickles() -> None:
    import pickle

    a = MemoryBackend(namespace="shared-ns-test")
    a.put("k", b"v")
    b = pickle.loads(pickle.dumps(a))
    assert b.read("k") == b"v"
    MemoryBackend.drop_namespace("shared-ns-test")


def test_local_publishes_atomically_and_hides_temp_files(tmp_path: Path) -> None:
    b = LocalBackend(root=str(tmp_path))
    b.put("t/0.log", b"abc")
    (tmp_path / TMP_DIR / "leftover").write_bytes(b"half a segment")  # a crash mid-upload
    assert [o.key for o in b.list()] == ["t/0.log"]
    assert os.listdir(tmp_path / TMP_DIR) == ["leftover"]  # the successful put left no temp file


def test_local_delete_prunes_empty_directories(tmp_path: Path) -> None:
    b = LocalBackend(root=str(tmp_path))
    b.put("a/b/c", b"1")
    b.delete("a/b/c")
    assert not (tmp_path / "a").exists()
    b.put("a/b/c", b"2")
    assert b.read("a/b/c") == b"2"


def test_local_key_conflicting_with_prefix(tmp_path: Path) -> None:
    b = LocalBackend(root=str(tmp_path))
    b.put("a/b", b"1")
    with pytest.raises(StorageError, match="conflicts"):
        b.put("a", b"2")


def test_local_root_must_be_a_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(StorageError, match="not a directory"):
        LocalBackend(root=str(tmp_path / "file"))


def test_local_relative_root_resolves_against_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    b = LocalBackend.from_options({"root": "demo/tiered"})
    assert b.root == tmp_path / "demo" / "tiered"
    assert b.root.is_dir()


def test_local_root_prefix_listing_sees_every_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefix ending inside a root entry's name (every topic-id root of a partition) is answered
    from a kept listing of the root: it must still see roots added or removed since. The root is
    made to look settled at once, so a listing kept past a change would show."""
    import rlm.fsutil as fsutil

    b = LocalBackend(root=str(tmp_path))
    for key in ("t-1=a/m/0", "t-10=b/m/0", "t-2=c/m/0", "t-1=file"):
        b.put(key, b"x")
    monkeypatch.setattr(fsutil, "settled", lambda sigs, started_ns: True)

    def keys(prefix: str, start_after: str | None = None) -> list[str]:
        return [o.key for o in b.list_page(prefix, token=start_after, limit=100).objects]

    assert keys("t-1=") == ["t-1=a/m/0", "t-1=file"]
    assert keys("t-1") == ["t-10=b/m/0", "t-1=a/m/0", "t-1=file"]  # "0" sorts before "="
    assert keys("t-1=", start_after="t-1=a/m/0") == ["t-1=file"]
    b.put("t-1=d/m/0", b"y")  # a new root: the root's signature moved
    assert keys("t-1=") == ["t-1=a/m/0", "t-1=d/m/0", "t-1=file"]
    b.delete("t-1=a/m/0")  # its directories pruned: the root changed again
    b.delete("t-1=file")
    assert keys("t-1=") == ["t-1=d/m/0"]
    assert keys("t-3=") == [] and keys("u") == []
    assert [o.key for o in b.list("")][:1] == ["t-10=b/m/0"]  # the whole store is walked as before


def test_local_root_listing_is_kept_at_most_its_max_age(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root whose signature looks unchanged (a share's client caching attributes) is listed
    again once the kept listing is ROOT_LISTING_MAX_AGE_S old."""
    import rlm.fsutil as fsutil
    from rlm.storage.local import ROOT_LISTING_MAX_AGE_S

    b = LocalBackend(root=str(tmp_path))
    b.put("t-1=a/x", b"x")
    monkeypatch.setattr(fsutil, "settled", lambda sigs, started_ns: True)
    clock = [100.0]
    monkeypatch.setattr(fsutil.time, "monotonic", lambda: clock[0])
    assert [o.key for o in b.list("t-1=")] == ["t-1=a/x"]
    frozen = fsutil.stat_signature(tmp_path)
    monkeypatch.setattr(fsutil, "stat_signature", lambda path: frozen)  # the signature never moves
    (tmp_path / "t-1=b").mkdir()
    (tmp_path / "t-1=b" / "y").write_bytes(b"y")
    assert [o.key for o in b.list("t-1=")] == ["t-1=a/x"]  # within the age: the kept listing
    clock[0] += ROOT_LISTING_MAX_AGE_S
    assert [o.key for o in b.list("t-1=")] == ["t-1=a/x", "t-1=b/y"]
