"""Run the API with uvicorn in a background thread of ``rlm run`` (or of a test).

uvicorn picks httptools (HTTP parsing in C; a response body is written to the transport as it is,
where h11 joins it into a new buffer) and uvloop when they are installed (the ``http`` extra
installs both); ``http``/``loop`` name one explicitly (bench/catchup_bench.py compares them). With a TLS
context (rlm.http.tls, ``[server] tls_cert``/``tls_key``) the socket speaks HTTPS only: a plain-HTTP
request fails its handshake and gets no answer (docs/security.md).
"""

from __future__ import annotations

import socket
import ssl
import threading
import time

import uvicorn
from fastapi import FastAPI

from rlm.errors import RlmError

__all__ = ["ApiServer"]


class _Config(uvicorn.Config):
    """uvicorn's config serving with an SSL context built by rlm.http.tls (one context whose
    errors were already reported as config errors) instead of one it builds from file names."""

    def __init__(self, *args: object, tls: ssl.SSLContext | None, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._tls = tls

    def load(self) -> None:
        super().load()
        if self._tls is not None:
            self.ssl = self._tls


class ApiServer:
    """uvicorn on ``host:port`` (port 0 = any free port, see :attr:`port`) in a daemon thread;
    HTTPS when ``tls`` is given."""

    def __init__(
        self,
        app: FastAPI,
        host: str,
        port: int,
        *,
        http: str = "auto",
        loop: str = "auto",
        tls: ssl.SSLContext | None = None,
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
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name="rlm-http", daemon=True
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
