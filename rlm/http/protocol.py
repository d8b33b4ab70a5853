"""Bounds on the request head, added to uvicorn's HTTP protocols (docs/http-api.md §8).

uvicorn bounds an idle keep-alive connection (``timeout_keep_alive``) but not a request head that
is still arriving: a client sending a header byte now and then (slowloris) held its connection —
and a slot of ``server.max_connections`` — for ever, and httptools buffers a head of any size.
:func:`bounded_protocol` wraps the protocol class uvicorn chose (httptools or h11) so that

* the request line and headers must arrive within ``head_timeout_s`` (``server.request_timeout_ms``)
  from the connection's start, or from the end of the previous response on a kept-alive
  connection; else the connection is closed;
* they may take at most :data:`MAX_HEAD_BYTES`; a larger head closes the connection.

The state uvicorn keeps tells where a connection is: ``cycle`` is replaced when a request's
headers are complete, so "the same cycle as when the timer was armed, and no response running"
means "still waiting for a head".
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

__all__ = ["MAX_HEAD_BYTES", "bounded_protocol"]

log = logging.getLogger(__name__)

#: The bytes of one request head (request line and headers) a client may send: 64 KiB, four times
#: what nginx's ``large_client_header_buffers`` allow by default; no rlm route needs more.
MAX_HEAD_BYTES = 64 << 10


def bounded_protocol(base: type[asyncio.Protocol], head_timeout_s: float) -> type[asyncio.Protocol]:
    """``base`` (uvicorn's httptools or h11 protocol) with the head bounds above; a protocol
    without uvicorn's per-request hooks is returned unchanged."""
    if not hasattr(base, "on_response_complete"):
        return base

    class Bounded(base):  # type: ignore[valid-type, misc]
        _head_timer: asyncio.TimerHandle | None = None
        _head_cycle: Any = None
        _head_bytes = 0

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_head()

        def data_received(self, data: bytes) -> None:
            # Counted only while the head is still incomplete after the parser took ``data``: the
            # body bytes that follow a head in the same read are not the head's.
            in_head = self._in_head()
            super().data_received(data)
            if in_head and self._in_head():
                self._head_bytes += len(data)
                if self._head_bytes > MAX_HEAD_BYTES:
                    self._close(f"request head larger than {MAX_HEAD_BYTES} bytes")

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_head()  # a kept-alive connection: the next head is timed afresh

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            super().connection_lost(exc)

        def _in_head(self) -> bool:
            cycle = self.cycle
            return cycle is self._head_cycle and (cycle is None or cycle.response_complete)

        def _arm_head(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._head_cycle, self._head_bytes = self.cycle, 0
            self._head_timer = self.loop.call_later(head_timeout_s, self._head_timeout)

        def _head_timeout(self) -> None:
            self._head_timer = None
            if self._in_head():
                self._close(
                    f"no complete request head within {head_timeout_s:.1f} s (server.request_timeout_ms)"
                )

        def _close(self, why: str) -> None:
            if not self.transport.is_closing():
                log.info("HTTP connection from %s closed: %s", self.client, why)
                self.transport.close()

    Bounded.__name__ = Bounded.__qualname__ = f"Bounded{base.__name__}"
    return Bounded
