"""The one conformance suite every storage backend must pass (in the spirit of zarr.testing).

Subclass :class:`BackendSuite` in a test module and override the ``backend`` fixture::

    class TestMyBackend(BackendSuite):
        large_size = 11 * 1024 * 1024   # > the backend's part size, to exercise multipart

        @pytest.fixture
        def backend(self, tmp_path):
            with MyBackend.from_options({...}) as b:
                yield b

Backends report transient errors and never retry them (docs/storage.md): every suite checks that
the backend runs no retry policy of its own, and suites that can make their store fail a request
(override the ``transient_fault`` fixture with a :class:`TransientFault`: a fault proxy in front
of S3, a file system call timing out) check that one injected failure costs exactly one request
and surfaces as :class:`~rlm.errors.TransientStorageError`, and that the retry layer recovers.

Every test writes under a fresh random prefix (the ``ns`` fixture) and removes it afterwards, so the
suite can run against a shared real bucket. Tests that need a capability the backend does not claim
(e.g. an atomic conditional create) are skipped with that reason, never silently weakened.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

import crc32c
import pytest

from rlm.errors import ObjectExistsError, ObjectNotFoundError, StorageError, TransientStorageError
from rlm.storage.api import StorageBackend
from rlm.storage.filestream import FileStream
from rlm.storage.retry import RetryingBackend, RetryPolicy

__all__ = [
    "BackendSuite",
    "ChunkedStream",
    "TransientFault",
    "call_fault",
    "chunked",
    "payload",
]


def call_fault(
    backend: StorageBackend, owner: Any, name: str, make: Callable[[], BaseException]
) -> TransientFault:
    """A :class:`TransientFault` at a backend's own I/O call ``owner.name`` (e.g. a file system's
    ``cat_file``, a module's ``open``): armed, its next calls raise ``make()``; every call counts.
    The caller restores ``owner.name`` (monkeypatch)."""
    real = getattr(owner, name)
    state = {"fail": 0, "calls": 0}

    def faulty(*args: Any, **kwargs: Any) -> Any:
        state["calls"] += 1
        if state["fail"] > 0:
            state["fail"] -= 1
            raise make()
        return real(*args, **kwargs)

    setattr(owner, name, faulty)
    return TransientFault(backend, lambda n: state.update(fail=n), lambda: state["calls"])


@dataclass
class TransientFault:
    """A way to make the store behind a backend fail reads transiently, for the suite's check
    that the backend does not retry on its own. ``backend`` is the backend under test as the
    fault sees it (the same options, e.g. routed through a fault proxy); ``arm(n)`` makes the
    next ``n`` read requests fail transiently (503 SlowDown, a timeout); ``requests()`` counts
    the read requests that reached the fault point so far, failed or not."""

    backend: StorageBackend
    arm: Callable[[int], None]
    requests: Callable[[], int]


class ChunkedStream(io.RawIOBase):
    """A non-seekable stream of unknown length, yielding ``data`` in ``chunk``-sized reads."""

    def __init__(self, data: bytes, chunk: int = 65_537) -> None:
        self._data = memoryview(data)
        self._pos = 0
        self._chunk = chunk

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        n = min(len(buf), self._chunk, len(self._data) - self._pos)
        buf[:n] = self._data[self._pos : self._pos + n]
        self._pos += n
        return n


def chunked(data: bytes, chunk: int = 65_537) -> BinaryIO:
    """:class:`ChunkedStream` typed as a binary stream."""
    return cast(BinaryIO, ChunkedStream(data, chunk))


def payload(size: int, seed: int = 0) -> bytes:
    """Deterministic pseudo-random bytes."""
    return random.Random(seed).randbytes(size)


class BackendSuite:
    """Conformance tests; override the ``backend`` fixture (and ``large_size`` if needed)."""

    #: Size of the "large" object: make it exceed the backend's multipart part size.
    large_size: int = 3 * 1024 * 1024 + 17
    #: Threads racing in the concurrency tests.
    threads: int = 8
    #: Whether the backend pickles to an equivalent backend (Spark executors rebuild it).
    picklable: bool = True

    @pytest.fixture
    def backend(self) -> Iterator[StorageBackend]:
        raise NotImplementedError("override the 'backend' fixture in your BackendSuite subclass")

    @pytest.fixture
    def ns(self, backend: StorageBackend) -> Iterator[str]:
        prefix = f"suite-{uuid.uuid4().hex[:12]}/"
        yield prefix
        with contextlib.suppress(Exception):  # cleanup is best effort (e.g. under injected faults)
            backend.delete_many([o.key for o in backend.list(prefix)])

    # -- round trips ----------------------------------------------------------------------------

    def test_round_trip_bytes(self, backend: StorageBackend, ns: str) -> None:
        data = payload(1000)
        info = backend.put(ns + "a.log", data)
        assert info.key == ns + "a.log"
        assert info.size == 1000
        assert backend.read(ns + "a.log") == data
        assert backend.head(ns + "a.log").size == 1000

    def test_last_modified_is_epoch_seconds(self, backend: StorageBackend, ns: str) -> None:
        """When a store tells an object's age, in seconds since the epoch (garbage collection's
        grace compares it with the clock; a store's milliseconds would make every object young)."""
        put = backend.put(ns + "dated", b"x")
        for info in (put, backend.head(ns + "dated"), *backend.list(ns + "dated")):
            if info.last_modified is not None:
                assert abs(info.last_modified - time.time()) < 24 * 3600, info

    def test_empty_object(self, backend: StorageBackend, ns: str) -> None:
        backend.put(ns + "empty", b"")
        assert backend.exists(ns + "empty")
        assert backend.head(ns + "empty").size == 0
        assert backend.read(ns + "empty") == b""
        assert backend.read(ns + "empty", 0, 10) == b""
        assert backend.read(ns + "empty", 5) == b""

    def test_overwrite_replaces_whole_object(self, backend: StorageBackend, ns: str) -> None:
        backend.put(ns + "k", payload(5000, 1))
        backend.put(ns + "k", b"short")
        assert backend.read(ns + "k") == b"short"
        assert backend.head(ns + "k").size == 5

    def test_upload_file(self, backend: StorageBackend, ns: str, tmp_path: Path) -> None:
        data = payload(70_000, 2)
        f = tmp_path / "seg.log"
        f.write_bytes(data)
        assert backend.upload_file(ns + "seg.log", f).size == len(data)
        assert backend.read(ns + "seg.log") == data

    def test_stream_upload_unknown_length(self, backend: StorageBackend, ns: str) -> None:
        data = payload(300_001, 3)
        backend.put(ns + "stream", chunked(data))
        assert backend.read(ns + "stream") == data

    def test_unicode_and_space_keys(self, backend: StorageBackend, ns: str) -> None:
        key = ns + "topic with space/ünïcødé-0.log"
        backend.put(key, b"x")
        assert backend.read(key) == b"x"
        assert [o.key for o in backend.list(ns)] == [key]

    # -- ranges ---------------------------------------------------------------------------------

    def test_ranged_reads_are_half_open(self, backend: StorageBackend, ns: str) -> None:
        data = bytes(range(256)) * 4
        backend.put(ns + "r", data)
        cases = [
            (0, None),
            (0, 1),
            (10, 20),
            (0, 1024),
            (1023, 1024),
            (100, None),
            (1000, 1024),
            (1000, 5000),
            (5, 5),
            (1024, 1024),
            (1024, None),
            (2000, 3000),
            (2000, None),
            (0, 0),
        ]
        for start, end in cases:
            assert backend.read(ns + "r", start, end) == data[start:end], (start, end)

    def test_invalid_ranges_rejected(self, backend: StorageBackend, ns: str) -> None:
        backend.put(ns + "r", b"abc")
        for start, end in [(-1, None), (2, 1), (0, -1)]:
            with pytest.raises(ValueError):
                backend.read(ns + "r", start, end)

    def test_range_of_missing_object_is_not_found(self, backend: StorageBackend, ns: str) -> None:
        for start, end in [(0, None), (0, 0), (5, 10), (100, None)]:
            with pytest.raises(ObjectNotFoundError):
                backend.read(ns + "missing", start, end)

    # -- existence, not found, delete -----------------------------------------------------------

    def test_not_found_errors(self, backend: StorageBackend, ns: str) -> None:
        assert not backend.exists(ns + "nope")
        with pytest.raises(ObjectNotFoundError):
            backend.head(ns + "nope")
        with pytest.raises(ObjectNotFoundError):
            backend.read(ns + "nope")
        backend.put(ns + "dir/child", b"1")
        assert not backend.exists(ns + "dir")  # a "directory" is not an object
        with pytest.raises(ObjectNotFoundError):
            backend.read(ns + "dir")

    def test_delete_is_idempotent(self, backend: StorageBackend, ns: str) -> None:
        backend.put(ns + "d", b"1")
        backend.delete(ns + "d")
        assert not backend.exists(ns + "d")
        backend.delete(ns + "d")
        backend.delete(ns + "never/existed")
        with pytest.raises(ObjectNotFoundError):
            backend.read(ns + "d")

    def test_delete_many_and_recreate(self, backend: StorageBackend, ns: str) -> None:
        keys = [f"{ns}p/{i:03d}" for i in range(12)]
        for k in keys:
            backend.put(k, b"x")
        backend.delete_many([*keys[:6], ns + "p/missing"])
        assert [o.key for o in backend.list(ns)] == keys[6:]
        backend.put(keys[0], b"again")
        assert backend.read(keys[0]) == b"again"

    def test_invalid_keys_rejected(self, backend: StorageBackend) -> None:
        for key in ["", "/abs", "a//b", "a/../b", "./a", "trailing/", "back\\slash", "nul\x00", ".rlm-tmp/x"]:
            with pytest.raises(ValueError):
                backend.put(key, b"x")

    # -- listing --------------------------------------------------------------------------------

    def test_listing_is_in_key_order(self, backend: StorageBackend, ns: str) -> None:
        names = [
            "b",
            "a/b",
            "a-c",
            "a0",
            "a/a/z",
            "a/b0",
            "A",
            "a.b/c",
            "z",
            "00000000000000000100.log",
            "00000000000000000020.log",
        ]
        for i, n in enumerate(names):
            backend.put(ns + n, bytes([i]) * (i + 1))
        listed = list(backend.list(ns))
        assert [o.key for o in listed] == sorted(ns + n for n in names)
        assert {o.key: o.size for o in listed} == {ns + n: i + 1 for i, n in enumerate(names)}

    def test_prefix_is_a_string_prefix(self, backend: StorageBackend, ns: str) -> None:
        for n in ["a/b", "a-c", "a0", "ab/c", "b/a"]:
            backend.put(ns + n, b"x")
        assert [o.key for o in backend.list(ns + "a")] == sorted(ns + n for n in ["a/b", "a-c", "a0", "ab/c"])
        assert [o.key for o in backend.list(ns + "a/")] == [ns + "a/b"]
        assert [o.key for o in backend.list(ns + "ab")] == [ns + "ab/c"]
        assert list(backend.list(ns + "zzz")) == []
        page = backend.list_page(ns + "nothing/")
        assert page.objects == () and page.next_token is None

    def test_pagination(self, backend: StorageBackend, ns: str) -> None:
        keys = sorted(f"{ns}{d}/{i:05d}" for d in ("x", "y", "x-1") for i in range(9))
        for k in keys:
            backend.put(k, b"p")
        seen: list[str] = []
        token = None
        pages = 0
        while True:
            page = backend.list_page(ns, token=token, limit=5)
            assert len(page.objects) <= 5
            seen += page.keys
            pages += 1
            if page.next_token is None:
                break
            token = page.next_token
        assert seen == keys
        assert pages in (6, 7)  # 27 keys / 5; a store may end with an empty last page
        assert [o.key for o in backend.list(ns, page_size=4)] == keys
        # the token is the last key returned: resuming after any key works
        resumed = backend.list_page(ns, token=keys[10], limit=3)
        assert resumed.keys == keys[11:14]
        with pytest.raises(ValueError):
            backend.list_page(ns, limit=0)

    # -- conditional create ---------------------------------------------------------------------

    def test_conditional_create(self, backend: StorageBackend, ns: str) -> None:
        backend.put(ns + "manifest", b"first", if_absent=True)
        with pytest.raises(ObjectExistsError):
            backend.put(ns + "manifest", b"second", if_absent=True)
        assert backend.read(ns + "manifest") == b"first"
        backend.delete(ns + "manifest")
        backend.put(ns + "manifest", b"third", if_absent=True)
        assert backend.read(ns + "manifest") == b"third"

    def test_conditional_create_race(self, backend: StorageBackend, ns: str) -> None:
        if not backend.capabilities.conditional_create:
            pytest.skip(f"{backend.name}: capabilities.conditional_create is false (not atomic)")
        winners: list[int] = []
        losers: list[int] = []
        errors: list[BaseException] = []
        barrier = threading.Barrier(self.threads)

        def create(i: int) -> None:
            barrier.wait()
            try:
                backend.put(ns + "race", f"writer-{i}".encode(), if_absent=True)
                winners.append(i)
            except ObjectExistsError:
                losers.append(i)
            except BaseException as e:
                errors.append(e)

        ts = [threading.Thread(target=create, args=(i,)) for i in range(self.threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not errors, errors
        assert len(winners) == 1, (winners, losers)
        assert backend.read(ns + "race") == f"writer-{winners[0]}".encode()
        assert [o.key for o in backend.list(ns)] == [ns + "race"]

    # -- large objects and concurrency -----------------------------------------------------------

    def test_large_object_multipart(self, backend: StorageBackend, ns: str, tmp_path: Path) -> None:
        data = payload(self.large_size, 4)
        f = tmp_path / "big.log"
        f.write_bytes(data)
        assert backend.upload_file(ns + "big-file", f).size == len(data)
        backend.put(ns + "big-stream", chunked(data, chunk=1 << 20))
        for key in (ns + "big-file", ns + "big-stream"):
            assert backend.head(key).size == len(data)
            mid = len(data) // 2
            assert backend.read(key, mid - 100, mid + 100) == data[mid - 100 : mid + 100]
            assert backend.read(key, len(data) - 10, len(data) + 10) == data[-10:]
        assert backend.read(ns + "big-file") == data

    def test_file_stream(self, backend: StorageBackend, ns: str, tmp_path: Path) -> None:
        """A :class:`~rlm.storage.filestream.FileStream` is stored like any stream (a backend
        uploading parts may read it by regions): every byte paid to ``on_chunk`` once, its CRC-32C
        that of the file. A file that shrinks while it uploads fails with StorageError naming it,
        and nothing is published under the key."""
        data = payload(self.large_size, 5)
        f = tmp_path / "seg.log"
        f.write_bytes(data)
        paid: list[int] = []
        with FileStream(f, on_chunk=paid.append) as stream:
            assert backend.put(ns + "file", cast(BinaryIO, stream)).size == len(data)
            assert stream.crc32c() == crc32c.crc32c(data)
        assert sum(paid) == len(data)
        assert backend.read(ns + "file") == data

        def shrink(n: int) -> None:
            os.truncate(f, 1000)  # a broker truncating the log in place

        with FileStream(f, on_chunk=shrink) as stream, pytest.raises(StorageError, match="shrank") as err:
            backend.put(ns + "cut", cast(BinaryIO, stream))
        assert str(f) in str(err.value)
        assert not backend.exists(ns + "cut")

    def test_concurrent_writers(self, backend: StorageBackend, ns: str) -> None:
        blobs = [payload(50_000 + i, 10 + i) for i in range(self.threads)]
        errors: list[BaseException] = []
        barrier = threading.Barrier(self.threads)

        def write(i: int) -> None:
            barrier.wait()
            try:
                backend.put(f"{ns}own/{i:02d}", blobs[i])
                backend.put(ns + "shared", blobs[i])
            except BaseException as e:
                errors.append(e)

        ts = [threading.Thread(target=write, args=(i,)) for i in range(self.threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not errors, errors
        for i in range(self.threads):
            assert backend.read(f"{ns}own/{i:02d}") == blobs[i]
        assert backend.read(ns + "shared") in blobs  # one whole write won: never a torn mix

    # -- retries: reported, never performed (docs/storage.md) ------------------------------------

    @pytest.fixture
    def transient_fault(self, backend: StorageBackend) -> Iterator[TransientFault | None]:
        """Override where the store can be made to fail (see :class:`TransientFault`); None =
        only the check that no retry policy runs inside the backend (e.g. memory: no I/O)."""
        yield None

    def test_reports_transient_errors_without_retrying(
        self,
        backend: StorageBackend,
        ns: str,
        transient_fault: TransientFault | None,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        def own_retry(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"{backend.name}: the backend ran a retry policy of its own")

        key = ns + "retry/k"
        backend.put(key, b"v")
        if not isinstance(backend, RetryingBackend):  # that one is the retry layer itself
            with monkeypatch.context() as m:  # every operation: no retry policy inside the backend
                m.setattr(RetryPolicy, "call", own_retry)
                backend.put(key, b"v")
                assert backend.read(key) == b"v" and backend.head(key).size == 1
                assert [o.key for o in backend.list(ns + "retry/")] == [key]
        if transient_fault is None:
            return
        fault = transient_fault
        fault.arm(1)
        before = fault.requests()
        with pytest.raises(TransientStorageError):
            fault.backend.read(key)
        assert fault.requests() - before == 1, "one injected failure must cost exactly one request"
        fault.arm(1)
        before = fault.requests()
        policy = RetryPolicy(**fault.backend.retry_options())
        policy.sleep = lambda s: None
        assert RetryingBackend(fault.backend, policy).read(key) == b"v"  # the one retry layer
        assert fault.requests() - before == 2

    # -- construction ---------------------------------------------------------------------------

    def test_describe_and_pickle(self, backend: StorageBackend) -> None:
        d = backend.describe()
        assert d["backend"] == backend.name
        assert isinstance(repr(backend), str)
        if self.picklable:
            clone = pickle.loads(pickle.dumps(backend))
            try:
                assert type(clone) is type(backend)
                assert clone.describe() == d
            finally:
                clone.close()
