"""``hdfs``: HDFS through fsspec — WebHDFS (pure HTTP) or libhdfs (pyarrow).

Options (``[remote.options]``)::

    url = "webhdfs://namenode:9870"   # webhdfs:// | swebhdfs:// (HTTPS) | hdfs://namenode:8020 (libhdfs)
    root = "/rlm"                     # directory holding the objects
    user = "kafka"                    # HDFS user (simple auth); unset = the process user
    kerberos = false                  # webhdfs: SPNEGO via requests-kerberos (pip install '...[kerberos]')
    kerb_ticket = "/tmp/krb5cc_1000"  # hdfs://: Kerberos ticket cache for libhdfs
    replication = 3                   # hdfs://: replication of new files (unset = cluster default)
    connect_timeout = 10.0  read_timeout = 60.0   # seconds, per request (WebHDFS) / Hadoop client

HDFS renames never replace an existing file, so "create only if absent" (manifests) is atomic: write
a temp file, rename it to the key, and a failed rename onto an existing key is ObjectExistsError.
A plain overwrite deletes the old file first (a reader may briefly see no object — rlm never
overwrites keys a reader trusts: data keys are unique per copy attempt).

The file system is created on first use, so construction and option validation need no cluster.
"""

from __future__ import annotations

from typing import Any, ClassVar
from urllib.parse import urlsplit

from rlm.errors import ConfigError
from rlm.storage.fsspec_backend import FsspecBackend
from rlm.storage.options import Option, at_least

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

    def _publish_if_absent(self, tmp: str, final: str) -> None:
        """HDFS rename refuses an existing destination: atomic create-only-if-absent."""
        fs = self.fs
        if self.scheme in ("webhdfs", "swebhdfs"):
            out = fs._call("RENAME", method="put", path=tmp, destination=final)
            if not out.json().get("boolean", False):
                raise FileExistsError(final) if fs.exists(final) else OSError(f"RENAME {tmp} failed")
            return
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
