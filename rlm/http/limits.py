"""Limits every request is held to: bounded request bodies (``server.max_body_bytes``) and the
request deadline (``server.request_timeout_ms``); docs/operations.md, docs/streaming.md.

Both are pure ASGI middlewares (no per-request task group and body streams as Starlette's
``BaseHTTPMiddleware`` has), so they sit in front of routing, auth and FastAPI's body parsing.

* **Bodies**: a request whose ``Content-Length`` exceeds the limit is answered 413 before a byte of
  the body is read; a body without a length (chunked) is read up to the limit plus one byte —
  memory stays bounded by the limit — and refused the same way once it exceeds it, else replayed
  to the app unchanged. The 413 is sent at once; then, so that a client still sending its body
  reads that answer instead of a connection reset (closing a socket with unread data resets it),
  the rest of the body is read and discarded — never kept, at most :data:`DRAIN_MAX_BYTES` and
  within the request timeout — before the connection closes. A client that waits for
  ``100-continue`` never sends it, so nothing is drained.
* **Deadline**: until the response starts, the whole request must finish within the timeout (else
  504). Once it has started — a streamed body — each write of the body must be taken by the client
  within the timeout, so a stream lives as long as it makes progress and a client that stops
  reading is cut off (the connection is closed; the body is visibly incomplete).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = [
    "DRAIN_MAX_BYTES",
    "ASGIApp",
    "BodyLimitMiddleware",
    "DeadlineMiddleware",
    "Message",
    "Receive",
    "Scope",
    "Send",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger(__name__)

#: The most bytes of a refused body read and thrown away after its 413 (a body declared larger is
#: not drained: its connection closes at once): 64 MiB.
DRAIN_MAX_BYTES = 64 << 20


class BodyLimitMiddleware:
    """413 ``{"error": {"field": "body", "reason": ...}}`` for bodies above ``max_bytes``; the rest
    of a refused body is drained for at most ``drain_s`` seconds."""

    def __init__(self, app: ASGIApp, max_bytes: int, drain_s: float = 30.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.drain_s = drain_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                await self._refuse(send, 400, "Content-Length is not an integer")
                return
            if declared > self.max_bytes:
                drain = declared <= DRAIN_MAX_BYTES and headers.get(b"expect", b"").lower() != b"100-continue"
                await self._too_large(send, receive if drain else None)
                return
            await self.app(scope, receive, send)
            return
        if b"chunked" not in headers.get(b"transfer-encoding", b"").lower():
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await self._too_large(send, receive if message.get("more_body", False) else None)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _too_large(self, send: Send, drain: Receive | None) -> None:
        """The 413; with ``drain``, the rest of the body is discarded before the answer ends."""
        reason = f"request body larger than {self.max_bytes} bytes (server.max_body_bytes)"
        await self._refuse(send, 413, reason, more=drain is not None)
        if drain is None:
            return
        try:
            async with asyncio.timeout(self.drain_s):
                await _discard(drain, DRAIN_MAX_BYTES)
        except TimeoutError:
            pass  # the client keeps sending: the connection closes now
        await send({"type": "http.response.body", "body": b""})

    @staticmethod
    async def _refuse(send: Send, status: int, reason: str, *, more: bool = False) -> None:
        body = json.dumps({"error": {"field": "body", "reason": reason}}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": more})


async def _discard(receive: Receive, max_bytes: int) -> None:
    """Read the request body to its end (or the client's leaving, or ``max_bytes``), keeping none."""
    seen = 0
    while seen <= max_bytes:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        seen += len(message.get("body", b""))


class DeadlineMiddleware:
    """504 ``{"error": {"field": null, ...}}`` when no response started within ``timeout_s``;
    afterwards every body write must complete within ``timeout_s`` (else the connection closes)."""

    def __init__(self, app: ASGIApp, timeout_ms: int) -> None:
        self.app = app
        self.timeout_ms = timeout_ms
        self.timeout_s = timeout_ms / 1000

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False
        timeout_s = self.timeout_s

        async def timed_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                await send(message)
                return
            try:
                await asyncio.wait_for(send(message), timeout_s)
            except TimeoutError:
                log.warning(
                    "%s: the client took no bytes for %.1f s; closing the stream",
                    scope.get("path"),
                    timeout_s,
                )
                raise

        task = asyncio.ensure_future(self.app(scope, receive, timed_send))
        try:
            done, _ = await asyncio.wait({task}, timeout=timeout_s)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if done or started:
            await task  # finished, or streaming: the per-write bound above applies from here on
            return
        task.cancel()
        await asyncio.wait({task})  # let it unwind; its outcome no longer matters
        if not task.cancelled():
            task.exception()  # retrieved: no "exception was never retrieved" noise
        if started:  # it started while being cancelled: nothing more can be said to this client
            return
        body = json.dumps(
            {"error": {"field": None, "reason": (f"request took longer than {self.timeout_ms} ms")}}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 504,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields ``body`` once, then defers to the real one (disconnects)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
