"""Run the API with uvicorn in a background thread of ``rlm run`` (or of a test).

uvicorn picks httptools (HTTP parsing in C; a response body is written to the transport as it is,
where h11 joins it into a new buffer) and uvloop when they are installed (the ``http`` extra
installs both); ``http``/``loop`` name one explicitly (bench/catchup_bench.py compares them). With a TLS
context (rlm.http.tls, ``[server] tls_cert``/``tls_key``) the socket speaks HTTPS only: a plain-HTTP
request fails its handshake and gets no answer (docs/security.md). Every connection is bounded
(docs/http-api.md §8): its request head by rlm.http.protocol, the number of connections by
uvicorn's ``limit_concurrency`` (``[server] max_connections``: past it a request answers 503).
"""

from __future__ import annotations

import socket
import ssl
import threading
import time

import uvicorn
from fastapi import FastAPI

from rlm.config import ServerSettings
from rlm.errors import RlmError
from rlm.http.protocol import bounded_protocol

__all__ = ["ApiServer"]


class _Config(uvicorn.Config):
    """uvicorn's config serving with an SSL context built by rlm.http.tls (one context whose
    errors were already reported as config errors) instead of one it builds from file names, and
    with the request-head bounds of rlm.http.protocol around the HTTP protocol it picks."""

    def __init__(
        self, *args: object, tls: ssl.SSLContext | None, head_timeout_s: float, **kwargs: object
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._tls = tls
        self._head_timeout_s = head_timeout_s

    def load(self) -> None:
        super().load()
        if self._tls is not None:
            self.ssl = self._tls
        self.http_protocol_class = bounded_protocol(self.http_protocol_class, self._head_timeout_s)


class ApiServer:
    """uvicorn on ``host:port`` (port 0 = any free port, see :attr:`port`) in a daemon thread;
    HTTPS when ``tls`` is given. ``max_connections``: open connections (or requests in progress)
    past which a request answers 503; ``head_timeout_s``: the time a request head may take."""

    def __init__(
        self,
        app: FastAPI,
        host: str,
        port: int,
        *,
        http: str = "auto",
        loop: str = "auto",
        tls: ssl.SSLContext | None = None,
        max_connections: int | None = None,
        head_timeout_s: float = 30.0,
    ) -> None:
        # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted connections only when the
        # socket says it is TCP (proto 0 does not), and without it every response whose headers and
        # body are written separately waits out the client's delayed ACK (~40 ms per request).
        self._sock = socket.socket(
            socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
        )
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as err:
            raise RlmError(f"server: cannot listen on {host}:{port}: {err.strerror}") from err
        self.host = host
        self.port: int = self._sock.getsockname()[1]
        self.scheme = "https" if tls is not None else "http"
        config = _Config(
            app,
            log_level="warning",
            access_log=False,
            timeout_keep_alive=5,
            lifespan="off",
            http=http,
            loop=loop,
            tls=tls,
            limit_concurrency=max_connections,
            head_timeout_s=head_timeout_s,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name="rlm-http", daemon=True
        )

    @classmethod
    def for_settings(
        cls, app: FastAPI, server: ServerSettings, tls: ssl.SSLContext | None = None
    ) -> ApiServer:
        """The server ``rlm run`` starts: ``[server] host``/``port``, ``max_connections``, the
        request head within ``request_timeout_ms`` (docs/http-api.md §8)."""
        return cls(
            app,
            server.host,
            server.port,
            tls=tls,
            max_connections=server.max_connections,
            head_timeout_s=server.request_timeout_ms / 1000,
        )

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def start(self, wait_s: float = 10.0) -> ApiServer:
        self._thread.start()
        deadline = time.monotonic() + wait_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RlmError(f"server: uvicorn did not start on {self.url}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()
