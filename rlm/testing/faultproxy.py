"""An HTTP proxy in front of a real S3 server that fails chosen requests, as real stores do.

Rules pick requests by S3 operation (:func:`s3_operation` names them from method + query: ``put``,
``create_multipart_upload``, ``upload_part``, ``complete_multipart_upload``, ``get``, ``list``,
``head``, ``delete``, ``delete_objects``) and say what happens to the next ``times`` of them:

* ``"500"`` / ``"503"`` — answer ``InternalError`` / ``SlowDown`` without forwarding;
* ``"lost_ack"`` — forward (the store does the work), then close the connection unanswered: the
  client sees a dropped connection although the write happened.

:meth:`FaultProxy.fail_every` instead fails every n-th request of any operation, alternating 503
SlowDown and 500 InternalError (steady throttling). Everything else is forwarded unchanged.
:attr:`FaultProxy.seen` counts forwarded + failed requests by operation, so tests can prove which
requests were re-sent; :attr:`FaultProxy.total_injected` counts every injected fault.
"""

from __future__ import annotations

import collections
import http.client
import http.server
import threading
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

__all__ = ["Action", "FaultProxy", "Rule", "s3_operation"]

Action = Literal["500", "503", "lost_ack"]
_ERRORS = {"500": (500, "InternalError"), "503": (503, "SlowDown")}


def s3_operation(method: str, target: str) -> str:
    """The S3 API operation of one request (path-style addressing)."""
    query = parse_qs(urlsplit(target).query, keep_blank_values=True)
    if method == "PUT":
        return "upload_part" if "partNumber" in query else "put"
    if method == "POST":
        if "uploads" in query:
            return "create_multipart_upload"
        if "uploadId" in query:
            return "complete_multipart_upload"
        return "delete_objects" if "delete" in query else "post"
    if method == "GET":
        return "list" if "list-type" in query or urlsplit(target).path.count("/") <= 1 else "get"
    if method == "DELETE":
        return "abort_multipart_upload" if "uploadId" in query else "delete"
    return method.lower()


@dataclass
class Rule:
    """Fail the next ``times`` requests of ``operation`` (``times < 0``: all of them) with ``action``."""

    operation: str
    action: Action
    times: int = 1


class FaultProxy(http.server.ThreadingHTTPServer):
    """Listens on a free loopback port and forwards to ``upstream`` (``http://host:port``)."""

    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.removeprefix("http://").rstrip("/")
        self.rules: list[Rule] = []
        self.seen: collections.Counter[str] = collections.Counter()
        self.injected: collections.Counter[str] = collections.Counter()
        self.every = 0  # fail_every: 0 = off
        self.requests = 0
        self.lock = threading.Lock()
        self._thread: threading.Thread | None = None
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def fail(self, operation: str, action: Action, times: int = 1) -> None:
        with self.lock:
            self.rules.append(Rule(operation, action, times))

    def fail_every(self, n: int) -> None:
        """Fail every ``n``-th request (any operation), alternating 503 and 500; 0 turns it off."""
        with self.lock:
            self.every = n

    @property
    def total_injected(self) -> int:
        with self.lock:
            return sum(self.injected.values())

    def clear(self) -> None:
        with self.lock:
            self.rules.clear()
            self.every = 0

    def decide(self, operation: str) -> Action | None:
        """Count the request and return the fault to inject, if a rule matches."""
        with self.lock:
            self.seen[operation] += 1
            self.requests += 1
            if self.every and self.requests % self.every == 0:
                action: Action = "503" if sum(self.injected.values()) % 2 == 0 else "500"
                self.injected[f"{operation}:{action}"] += 1
                return action
            for rule in self.rules:
                if rule.operation == operation and rule.times != 0:
                    rule.times -= 1 if rule.times > 0 else 0
                    self.injected[f"{operation}:{rule.action}"] += 1
                    return rule.action
        return None

    def __enter__(self) -> FaultProxy:
        self._thread = threading.Thread(target=self.serve_forever, daemon=True, name="fault-proxy")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: FaultProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        action = self.server.decide(s3_operation(self.command, self.path))
        if action in _ERRORS:
            status, code = _ERRORS[action]
            self._answer(
                status,
                f"<Error><Code>{code}</Code><Message>injected</Message></Error>".encode(),
                [("Content-Type", "application/xml")],
            )
            return
        status, headers, data = self._forward(body)
        if action == "lost_ack":
            self.close_connection = True  # the store did the work; the client never hears of it
            return
        self._answer(status, data, headers)

    def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(self.server.upstream, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            dropped = {"transfer-encoding", "connection", "server", "date"}
            if self.command != "HEAD":  # a HEAD's Content-Length is the object's size: keep it
                dropped.add("content-length")
            kept = [(k, v) for k, v in resp.getheaders() if k.lower() not in dropped]
            return resp.status, kept, data
        finally:
            conn.close()

    def _answer(self, status: int, data: bytes, headers: list[tuple[str, str]]) -> None:
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        if not any(k.lower() == "content-length" for k, _ in headers):
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle
