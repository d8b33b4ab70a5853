"""The generic fsspec backend (the HDFS plugin's base) and the ``hdfs`` plugin.

The HDFS conformance suite runs against a live HDFS: the session's MiniDFSCluster
(tests/hdfsservers.py), or the cluster ``RLM_TEST_HDFS_URL`` names.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from rlm_storage_hdfs import HdfsBackend  # the repo's plugin, installed by `make install`

from rlm.errors import ConfigError, StorageError
from rlm.storage import create_backend
from rlm.storage.api import StorageBackend
from rlm.storage.fsspec_backend import FsspecBackend
from rlm.testing.backend_suite import BackendSuite, TransientFault, call_fault
from rlm.testing.faultproxy import FaultProxy
from tests.hdfsservers import HdfsTarget


class TestFsspecMemory(BackendSuite):
    @pytest.fixture
    def backend(self) -> Iterator[StorageBackend]:
        with FsspecBackend(protocol="memory", root=f"/suite-{uuid.uuid4().hex}") as b:
            yield b

    @pytest.fixture
    def transient_fault(
        self, backend: StorageBackend, monkeypatch: pytest.MonkeyPatch
    ) -> Iterator[TransientFault | None]:
        """The file system's read timing out (a type, not a text, makes it transient)."""
        assert isinstance(backend, FsspecBackend)
        fs = backend.fs
        monkeypatch.setattr(fs, "cat_file", fs.cat_file)  # restored afterwards
        yield call_fault(backend, fs, "cat_file", lambda: TimeoutError("read timed out"))


class TestFsspecLocal(BackendSuite):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[StorageBackend]:
        with FsspecBackend(protocol="file", root=str(tmp_path / "store")) as b:
            yield b


@pytest.mark.hdfs
class TestHdfsCluster(BackendSuite):
    large_size = 9 * 1024 * 1024

    @pytest.fixture
    def backend(self, hdfs_target: HdfsTarget) -> Iterator[StorageBackend]:
        with create_backend("hdfs", hdfs_target.options()) as b:
            yield b

    @pytest.fixture
    def transient_fault(self, hdfs_target: HdfsTarget) -> Iterator[TransientFault | None]:
        """The NameNode answering 503 (as in safe mode or a failover) through a fault proxy in
        front of WebHDFS; the DataNodes it redirects to are reached directly."""
        with FaultProxy(hdfs_target.url.replace("webhdfs://", "http://")) as proxy:
            url = proxy.endpoint.replace("http://", "webhdfs://")
            with HdfsBackend(**hdfs_target.options(url=url)) as view:
                yield TransientFault(view, lambda n: proxy.fail("get", "503", n), lambda: proxy.seen["get"])


@pytest.mark.hdfs
def test_hdfs_options_and_construction_need_no_cluster() -> None:
    b = create_backend("hdfs", {"url": "webhdfs://namenode.example:9870", "root": "/tiered", "user": "kafka"})
    assert isinstance(b, HdfsBackend)
    assert (b.scheme, b.host, b.port) == ("webhdfs", "namenode.example", 9870)
    assert b.capabilities.conditional_create is True
    assert b.describe() == {
        "backend": "hdfs",
        "options": {
            "url": "webhdfs://namenode.example:9870",
            "root": "/tiered",
            "user": "kafka",
            "kerberos": False,
            "kerb_ticket": None,
            "replication": None,
            "connect_timeout": 10.0,
            "read_timeout": 60.0,
        },
    }
    assert HdfsBackend(url="hdfs://nn").port == 8020
    assert HdfsBackend(url="swebhdfs://nn").port == 9871
    for opts, message in [
        ({}, "url is required"),
        ({"url": "s3://bucket"}, "expected webhdfs://"),
        ({"url": "webhdfs://nn", "root": "relative"}, "absolute"),
        ({"url": "webhdfs://nn", "replication": 2}, "libhdfs"),
        ({"url": "webhdfs://nn", "kerberos": "maybe"}, "true or false"),
        ({"url": "webhdfs://nn", "namenode": "x"}, "unknown option"),
    ]:
        with pytest.raises(ConfigError, match=message):
            HdfsBackend.from_options(opts)


@pytest.mark.hdfs
def test_hdfs_unreachable_namenode_is_a_storage_error() -> None:
    b = HdfsBackend(url="webhdfs://127.0.0.1:9", root="/x")
    with pytest.raises(StorageError):
        b.exists("k")


@pytest.mark.timeout(60)
def test_webhdfs_requests_time_out_on_a_namenode_that_never_answers() -> None:
    """A real listening socket nobody serves (a frozen namenode: the kernel completes the TCP
    handshake, no byte ever comes back): read_timeout bounds the call, a transient error."""
    import socket

    from rlm.errors import TransientStorageError

    with socket.socket() as frozen:
        frozen.bind(("127.0.0.1", 0))
        frozen.listen(16)
        port = frozen.getsockname()[1]
        b = HdfsBackend(url=f"webhdfs://127.0.0.1:{port}", root="/x", connect_timeout=0.5, read_timeout=0.5)
        # Without a read timeout, requests would wait forever (the test's own timeout would fire).
        with pytest.raises(TransientStorageError, match="timed out"):
            b.read("k")
