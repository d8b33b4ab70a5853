"""The streaming read, ``GET .../records/stream`` (docs/streaming.md).

One response carries Kafka record batches back to back from the batch holding ``offset``: exactly
the bytes successive ``/records`` calls (each from the previous ``X-Rlm-Next-Offset``) return,
across index entries, segments and tiers, while the total fits ``max_bytes`` (at least one batch),
and it **stops at the visible end** (docs/visibility.md) as it was when each chunk was read.

How it is served:

* The first chunk is read before the response starts, so every error of ``/records`` (400, 404,
  416, 502, 503, 504) is answered as a status with the JSON error body.
* Later chunks are read in a worker thread while the previous one is written (one chunk of
  look-ahead: at most two chunks of memory per stream), through the same ``PartitionReader.fetch``
  as ``/records`` — one code path for what is visible.
* A failure after the response started cannot change the status: the connection is closed without
  the terminating chunk, so the client sees an incomplete body, never a silently short one. An
  offset that became out of range meanwhile (the log start moved past it) ends the body cleanly:
  the next request from there answers 416, as ``/records`` would.
* Progress, not age, bounds a stream: each chunk read must finish within ``request_timeout_ms``
  (here) and each write must be taken by the client within it (``DeadlineMiddleware``).
* A client that goes away stops the stream at once (Starlette's disconnect listener cancels it,
  :class:`BatchStream` closes the body): the look-ahead read is abandoned, the gauge drops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio.to_thread
from prometheus_client import CollectorRegistry, Counter, Gauge
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from rlm.errors import OffsetOutOfRangeError
from rlm.tiering.read import FetchResult

__all__ = [
    "CHUNK_BYTES",
    "DEFAULT_STREAM_BYTES",
    "MAX_STREAM_BYTES",
    "BatchStream",
    "Fetch",
    "StreamMetrics",
    "first_chunk",
    "stream_body",
    "stream_headers",
]

log = logging.getLogger(__name__)

Fetch = Callable[[int, int], FetchResult]

#: bytes asked of one ``fetch`` call; two may be held per stream (the one written, the one read)
CHUNK_BYTES = 4 << 20
#: default and upper bound of ``max_bytes`` for one stream (a client continues with a new request)
DEFAULT_STREAM_BYTES = 256 << 20
MAX_STREAM_BYTES = 1 << 40


class StreamMetrics:
    """Open streams and what they sent, on the app's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.active = Gauge(
            "rlm_http_streams_active", "Streaming reads (/records/stream) open now", registry=registry
        )
        self.bytes = Counter(
            "rlm_http_stream_bytes", "Record batch bytes written by streaming reads", registry=registry
        )
        self.aborted = Counter(
            "rlm_http_streams_aborted",
            "Streaming reads ended early: the client went away or stopped reading, or a read failed",
            registry=registry,
        )


class BatchStream(StreamingResponse):
    """A streamed body that is always closed when the response ends, however it ends: Starlette
    cancels the writer on disconnect but leaves an async generator suspended at ``yield`` to the
    garbage collector; closing it here releases its look-ahead read and gauge immediately."""

    body_iterator: AsyncIterator[bytes | memoryview]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


async def first_chunk(fetch: Fetch, offset: int, max_bytes: int) -> FetchResult:
    """The first chunk, read before the response starts (its errors become the status)."""
    return await anyio.to_thread.run_sync(fetch, offset, min(max_bytes, CHUNK_BYTES))


async def stream_body(
    first: FetchResult, fetch: Fetch, max_bytes: int, *, stall_s: float, metrics: StreamMetrics, where: str
) -> AsyncIterator[bytes | memoryview]:
    """Chunks from ``first`` on until ``max_bytes`` (whole batches, ≥ 1) or the visible end."""
    metrics.active.inc()
    pending: asyncio.Future[FetchResult] | None = None
    finished = False
    try:
        current: FetchResult | None = first
        sent = 0
        while current is not None and current.batches:
            data = current.data
            if sent and sent + len(data) > max_bytes:
                break  # a lone batch larger than what is left: not sent, as /records would not
            sent += len(data)
            remaining = max_bytes - sent
            if remaining > 0 and current.next_offset is not None:
                pending = _read_ahead(fetch, current.next_offset, remaining)
            yield data
            metrics.bytes.inc(len(data))
            current = await _next(pending, stall_s, where) if pending is not None else None
            pending = None
        finished = True
    finally:
        metrics.active.dec()
        if pending is not None:
            pending.cancel()
        if not finished:
            metrics.aborted.inc()


def _read_ahead(fetch: Fetch, offset: int, remaining: int) -> asyncio.Future[FetchResult]:
    # abandon_on_cancel: a client that leaves must not wait for the store; the thread's result
    # is dropped (the range it read may still warm the cache).
    call = anyio.to_thread.run_sync(fetch, offset, min(remaining, CHUNK_BYTES), abandon_on_cancel=True)
    return asyncio.ensure_future(call)


async def _next(pending: asyncio.Future[FetchResult], stall_s: float, where: str) -> FetchResult | None:
    """The look-ahead chunk; None when the offset fell out of range meanwhile (end cleanly)."""
    done, _ = await asyncio.wait({pending}, timeout=stall_s)
    if not done:
        log.warning(
            "%s: no chunk read within %.1f s (server.request_timeout_ms); closing the stream", where, stall_s
        )
        raise TimeoutError(f"{where}: stream read stalled for {stall_s} s")
    try:
        return pending.result()
    except OffsetOutOfRangeError as err:
        log.info("%s: stream ends: %s", where, err)
        return None
    except Exception as err:
        log.warning("%s: stream aborted (the client sees an incomplete body): %s", where, err)
        raise


def stream_headers(first: FetchResult, offset: int) -> dict[str, Any]:
    headers = {"X-Rlm-Offset": str(offset)}
    if first.high_watermark is not None:
        headers["X-Rlm-High-Watermark"] = str(first.high_watermark)
    return headers
