"""Bounded request bodies on every route (``server.max_body_bytes``; docs/operations.md).

A pure ASGI middleware, so it sits in front of routing, auth and FastAPI's body parsing: a request
whose ``Content-Length`` exceeds the limit is answered 413 before a byte of the body is read; a body
without a length (chunked) is read up to the limit plus one byte — memory stays bounded by the
limit — and refused the same way once it exceeds it, else replayed to the app unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyLimitMiddleware:
    """413 ``{"error": {"field": "body", "reason": ...}}`` for bodies above ``max_bytes``."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

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
                await self._too_large(send)
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
                await self._too_large(send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _too_large(self, send: Send) -> None:
        await self._refuse(send, 413, f"request body larger than {self.max_bytes} bytes "
                                      "(server.max_body_bytes)")

    @staticmethod
    async def _refuse(send: Send, status: int, reason: str) -> None:
        body = json.dumps({"error": {"field": "body", "reason": reason}}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
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
