"""``hdfs``: HDFS through fsspec — WebHDFS (pure HTTP) or libhdfs (pyarrow).

Options (``[remote.options]``)::

    url = "webhdfs://namenode:9870"   # webhdfs:// | swebhdfs:// (HTTPS) | hdfs://namenode:8020 (libhdfs)
    root = "/rlm"                     # directory holding the objects
    user = "kafka"                    # HDFS user (simple auth); unset = the process user
    kerberos = false                  # webhdfs: SPNEGO via requests-kerberos (pip install '...[kerberos]')
    kerb_ticket = "/tmp/krb5cc_1000"  # hdfs://: Kerberos ticket cache for libhdfs
    replication = 3                   # hdfs://: replication of new files (unset = cluster default)
    connect_timeout = 10.0  read_timeout = 60.0   # seconds, per request (WebHDFS) / Hadoop client

Every object is written to a temp file and renamed to its key, so a reader never sees a partial
object. Over WebHDFS (``rlm_storage_hdfs.webhdfs``) a write is one CREATE streamed to a DataNode,
and the rename is HDFS ``rename2``: "create only if absent" (manifests) refuses an existing key
atomically (ObjectExistsError), an overwrite replaces it in one step; a read is one OPEN of the
range. Over libhdfs a rename never replaces: an overwrite deletes the old file first (a reader may
briefly see no object — rlm never overwrites keys a reader trusts: data keys are unique per copy
attempt).

The file system is created on first use, so construction and option validation need no cluster.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any, BinaryIO, ClassVar
from urllib.parse import urlsplit

from rlm.errors import ConfigError, StorageError
from rlm.storage.api import ObjectInfo
from rlm.storage.fsspec_backend import TMP_DIR, FsspecBackend
from rlm.storage.options import Option, at_least
from rlm_storage_hdfs.webhdfs import WebHdfsRest

__all__ = ["DEFAULT_PORTS", "HdfsBackend"]

DEFAULT_PORTS = {"webhdfs": 9870, "swebhdfs": 9871, "hdfs": 8020}


class HdfsBackend(FsspecBackend):
    """HDFS via fsspec; see module doc."""

    name: ClassVar[str] = "hdfs"
    OPTIONS: ClassVar[tuple[Option, ...]] = (
        Option("url", "str", required=True, help="webhdfs://namenode:9870 or hdfs://namenode:8020"),
        Option("root", "str", default="/rlm"),
        Option("user", "str"),
        Option("kerberos", "bool", default=False),
        Option("kerb_ticket", "str"),
        Option("replication", "int", check=at_least(1)),
        # The same names and defaults as the s3 backend's: one concept (docs/operations.md).
        Option("connect_timeout", "float", default=10.0, check=at_least(0)),
        Option("read_timeout", "float", default=60.0, check=at_least(0)),
    )
    atomic_conditional_create: ClassVar[bool] = True

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        url = urlsplit(self.options["url"])
        if url.scheme not in DEFAULT_PORTS or not url.hostname:
            raise ConfigError(
                f"remote.options.url = {self.options['url']!r} is invalid for backend 'hdfs': "
                "expected webhdfs://host[:port], swebhdfs://host[:port] or hdfs://host[:port]"
            )
        if not self.options["root"].startswith("/"):
            raise ConfigError(f"remote.options.root = {self.options['root']!r} must be an absolute HDFS path")
        self.scheme = url.scheme
        self.host = url.hostname
        self.port = url.port or DEFAULT_PORTS[url.scheme]
        if self.scheme != "hdfs" and (self.options["kerb_ticket"] or self.options["replication"]):
            raise ConfigError("remote.options.kerb_ticket/replication apply to hdfs:// (libhdfs) only")

    def _make_fs(self) -> Any:
        o = self.options
        if self.scheme in ("webhdfs", "swebhdfs"):
            from fsspec.implementations.webhdfs import WebHDFS

            fs = WebHDFS(
                host=self.host,
                port=self.port,
                user=o["user"],
                kerberos=o["kerberos"],
                use_https=self.scheme == "swebhdfs",
            )
            _bound_requests(fs.session, (o["connect_timeout"], o["read_timeout"]))
            return fs
        from fsspec.implementations.arrow import HadoopFileSystem

        kwargs: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "user": o["user"],
            "kerb_ticket": o["kerb_ticket"],
        }
        if o["replication"]:
            kwargs["replication"] = o["replication"]
        # libhdfs takes Hadoop client settings (milliseconds) instead of per-call timeouts.
        kwargs["extra_conf"] = {
            "ipc.client.connect.timeout": str(int(o["connect_timeout"] * 1000)),
            "dfs.client.socket-timeout": str(int(o["read_timeout"] * 1000)),
        }
        return HadoopFileSystem(**kwargs)

    def _is_transient(self, e: BaseException) -> bool:
        """WebHDFS runs on requests, whose timeouts and connection errors are not the OS's
        types; an HTTP 429 or 5xx answer (a namenode in safe mode or failing over) is transient
        too. libhdfs (pyarrow) raises OSError subclasses, which the base class classifies."""
        import requests

        if isinstance(e, requests.Timeout | requests.ConnectionError):
            return True
        if isinstance(e, requests.HTTPError) and e.response is not None:
            status = e.response.status_code
            return status == 429 or status >= 500
        return super()._is_transient(e)

    @property
    def _webhdfs(self) -> bool:
        return self.scheme in ("webhdfs", "swebhdfs")

    def _put(self, key: str, stream: BinaryIO, if_absent: bool) -> ObjectInfo:
        if not self._webhdfs:
            return super()._put(key, stream, if_absent)
        rest = WebHdfsRest(self.fs)
        final = self._path(key)
        tmp = f"{self.root.rstrip('/')}/{TMP_DIR}/{uuid.uuid4().hex}"
        try:
            rest.create(tmp, stream)
            try:
                rest.rename(tmp, final, overwrite=not if_absent)
            except FileNotFoundError:  # the key's directory does not exist yet
                self.fs.makedirs(final.rsplit("/", 1)[0], exist_ok=True)
                rest.rename(tmp, final, overwrite=not if_absent)
            return self._info(key, self.fs.info(final))
        except Exception as e:
            with contextlib.suppress(Exception):  # a stray temp file is garbage, never an object
                self.fs.rm_file(tmp)
            raise self._translate("put", key, e) from e

    def _info(self, key: str, info: dict[str, Any]) -> ObjectInfo:
        """WebHDFS's ``modificationTime`` is in milliseconds; ObjectInfo's ``last_modified`` in
        seconds (garbage collection's grace compares it with the clock)."""
        found = super()._info(key, info)
        if self._webhdfs and found.last_modified is not None and "modificationTime" in info:
            return ObjectInfo(found.key, found.size, found.etag, found.last_modified / 1000)
        return found

    def _read(self, key: str, start: int, end: int | None) -> bytes:
        if not self._webhdfs or (end is not None and end <= start):
            return super()._read(key, start, end)
        try:
            return WebHdfsRest(self.fs).open(self._path(key), start, None if end is None else end - start)
        except Exception as e:
            error = self._translate("read", key, e)
            # HDFS refuses an offset at or past the end (the NameNode's IOException "out of the
            # range", the DataNode's EOFException for an empty file): the range is empty if the
            # object exists, which only a GETFILESTATUS tells
            if type(error) is StorageError and start >= self._head(key).size:
                return b""
            raise error from e

    def _publish_if_absent(self, tmp: str, final: str) -> None:
        """libhdfs: HDFS rename refuses an existing destination: atomic create-only-if-absent."""
        fs = self.fs
        try:
            fs.mv(tmp, final)
        except OSError:
            if fs.exists(final):
                raise FileExistsError(final) from None
            raise

    def _publish(self, tmp: str, final: str) -> None:
        fs = self.fs
        if fs.exists(final):
            fs.rm_file(final)
        self._publish_if_absent(tmp, final)


def _bound_requests(session: Any, timeout: tuple[float, float]) -> None:
    """Give every request of fsspec's WebHDFS session ``(connect, read)`` timeouts: fsspec passes
    none, and requests without one waits forever on a namenode that accepts and never answers."""
    request = session.request
    if getattr(request, "_rlm_bounded", False):  # fsspec caches file system instances
        return

    def bounded(method: str, url: str, **kwargs: Any) -> Any:
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = timeout
        return request(method, url, **kwargs)

    bounded._rlm_bounded = True  # type: ignore[attr-defined]
    session.request = bounded
