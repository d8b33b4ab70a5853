"""The HTTP API of ``rlm run`` (docs/http-api.md), a FastAPI app; OpenAPI at ``/docs``.

Routes (contract)::

    GET  /v1/partitions                                    status of every partition
    GET  /v1/topics/{t}/partitions/{p}/offsets/{o}         lookup by offset
    GET  /v1/topics/{t}/partitions/{p}/timestamps/{ts}     lookup by timestamp (−1…−5 special)
    GET  /v1/topics/{t}/partitions/{p}/records?offset=&max_bytes=&format=raw|json&verify=
                                                   &isolation=read_uncommitted|read_committed
    GET  /v1/topics/{t}/partitions/{p}/records/stream?offset=&max_bytes=&verify=&isolation=
                                                           raw batches, chunked, up to the visible
                                                           end (docs/streaming.md)
    POST /v1/offsets-for-times                             {"timestamp", "topics"?, "minus_ms"?}
    GET  /metrics                                          Prometheus text format
    GET  /healthz                                          liveness (no auth)
    GET  /v1/history                                       totals over the last hour (status page)
    GET  /v1/store                                         the remote store's health (no store I/O)
    GET  /                                                 the status page (static; no auth — its
                                                           API calls send the token)

Errors are JSON ``{"error": {"field": ..., "reason": ...}}``: 400 bad input, 401 missing/wrong
token, 404 unknown partition, 413 request body above ``server.max_body_bytes`` (every route), 416
offset out of range for a fetch (:class:`OffsetOutOfRangeError`: below the log start or above the
high watermark; a fetch AT it answers 200 with no records), 504 request timeout (no response started
within ``server.request_timeout_ms``; a stream is bounded per chunk instead), 502 remote store
failure, 503 remote store unreachable (fails fast, ``Retry-After``; docs/operations.md). Topic
names are checked against Kafka's rules before any file access. Nothing at or above the high
watermark, nor below the log start, is ever returned (docs/visibility.md).
"""

from __future__ import annotations

import base64
import hmac
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from rlm import __version__
from rlm.config import ServerSettings
from rlm.config.server import bearer_token
from rlm.errors import (
    InvalidArgumentError,
    OffsetOutOfRangeError,
    ProtectionError,
    RlmError,
    StorageError,
    StoreUnavailableError,
    TamperedObjectError,
)
from rlm.http.limits import BodyLimitMiddleware, DeadlineMiddleware
from rlm.http.stream import (
    DEFAULT_STREAM_BYTES,
    MAX_STREAM_BYTES,
    BatchStream,
    StreamMetrics,
    first_chunk,
    stream_body,
    stream_headers,
)
from rlm.tiering import isolation as txn
from rlm.tiering.lookup import FetchResult
from rlm.tiering.readers import PartitionNotFoundError, TieredReaders, check_topic

StatusSource = Callable[[], list[dict[str, Any]]]
HistorySource = Callable[[], dict[str, Any]]
StoreSource = Callable[[], dict[str, Any]]
STATIC_DIR = Path(__file__).resolve().parent / "static"


class OffsetsForTimesRequest(BaseModel):
    timestamp: int = Field(description="ms since the epoch, or -1 latest / -2 earliest")
    topics: list[str] | None = Field(default=None, description="default: every topic")
    minus_ms: int = Field(default=0, ge=0, description="safety margin subtracted from timestamp")


def _error(status: int, field: str | None, reason: str) -> JSONResponse:
    return JSONResponse({"error": {"field": field, "reason": reason}}, status_code=status)


def _field_of(err: RlmError) -> str | None:
    text = err.reason.lower()
    for name in ("topic", "partition", "offset", "timestamp", "max_bytes", "minus"):
        if text.startswith(name) or f" {name} " in f" {text}":
            return name
    return None


def create_app(
    readers: TieredReaders,
    server: ServerSettings,
    *,
    status: StatusSource,
    registry: CollectorRegistry,
    history: HistorySource | None = None,
    store: StoreSource | None = None,
) -> FastAPI:
    # redirect_slashes off: a path that is not a route is a JSON 404, never a redirect to a guess
    # (".../offsets/0%2F" was redirected to ".../offsets/0": the fuzz test found it).
    app = FastAPI(
        title="rlm",
        version=__version__,
        redirect_slashes=False,
        description="Tiered-storage remote log manager: lookups across the local and "
        "remote tiers of Kafka-format logs.",
    )
    timeout_s = server.request_timeout_ms / 1000
    stream_metrics = StreamMetrics(registry)
    token = bearer_token(server).encode()  # token_file: read once, here (docs/security.md)

    async def require_token(request: Request) -> None:
        if not token:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        # compare_digest: the time taken does not depend on how much of the token matched.
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token):
            raise _Unauthorized()

    @app.exception_handler(RequestValidationError)
    async def on_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p not in ("path", "query", "body")]
        return _error(400, ".".join(loc) or None, str(first.get("msg", "invalid request")))

    @app.exception_handler(StarletteHTTPException)
    async def on_http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, None, str(exc.detail))

    @app.exception_handler(_Unauthorized)
    async def on_unauthorized(_: Request, __: _Unauthorized) -> JSONResponse:
        resp = _error(401, "authorization", "missing or wrong bearer token")
        resp.headers["WWW-Authenticate"] = "Bearer"
        return resp

    @app.exception_handler(PartitionNotFoundError)
    async def on_not_found(_: Request, exc: PartitionNotFoundError) -> JSONResponse:
        return _error(404, "partition", exc.reason)

    @app.exception_handler(OffsetOutOfRangeError)
    async def on_out_of_range(_: Request, exc: OffsetOutOfRangeError) -> JSONResponse:
        return _error(416, "offset", exc.reason)

    @app.exception_handler(InvalidArgumentError)
    async def on_invalid(_: Request, exc: InvalidArgumentError) -> JSONResponse:
        return _error(400, _field_of(exc), exc.reason)

    @app.exception_handler(StorageError)
    async def on_storage(_: Request, exc: StorageError) -> JSONResponse:
        return _error(502, None, f"remote store: {exc}")

    @app.exception_handler(StoreUnavailableError)
    async def on_unavailable(_: Request, exc: StoreUnavailableError) -> JSONResponse:
        resp = _error(503, None, f"remote store: {exc}")
        resp.headers["Retry-After"] = "5"
        return resp

    @app.exception_handler(ProtectionError)
    async def on_protection(_: Request, exc: ProtectionError) -> JSONResponse:
        # docs/protection.md: a missing or wrong key is this server's configuration (500); a tag
        # that fails means the store served bytes that are not what rlm wrote (502).
        status = 502 if isinstance(exc, TamperedObjectError) else 500
        return _error(status, "key" if status == 500 else None, str(exc))

    @app.exception_handler(RlmError)
    async def on_rlm(_: Request, exc: RlmError) -> JSONResponse:
        return _error(500, None, str(exc))

    app.add_middleware(DeadlineMiddleware, timeout_ms=server.request_timeout_ms)
    app.add_middleware(BodyLimitMiddleware, max_bytes=server.max_body_bytes)
    auth = [Depends(require_token)]

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    @app.get("/metrics", tags=["ops"], dependencies=auth, response_class=Response)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/partitions", tags=["status"], dependencies=auth)
    async def partitions() -> list[dict[str, Any]]:
        return await run_in_threadpool(status)

    @app.get("/v1/history", tags=["status"], dependencies=auth)
    async def history_() -> dict[str, Any]:
        """Totals sampled in-process (copied bytes and rate, copy lag, remote size) over the last
        hour; empty ``samples`` when the server runs without a sampler."""
        if history is None:
            return {"interval_s": None, "window_s": None, "samples": []}
        return history()

    @app.get("/v1/store", tags=["status"], dependencies=auth)
    async def store_() -> dict[str, Any]:
        """Whether the remote store answers: ``status`` up | unreachable | unknown, since when,
        the last error. Answered from memory: never waits for the store."""
        if store is None:
            return {"backend": None, "status": "unknown", "reachable": None}
        return store()

    # The status page: static files only, no build step; its API calls carry the token.
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/v1/topics/{topic}/partitions/{partition}/offsets/{offset}", tags=["lookup"], dependencies=auth)
    async def by_offset(topic: str, partition: int, offset: int) -> dict[str, Any]:
        check_topic(topic)
        reader = readers.reader(topic, partition)
        result = await run_in_threadpool(reader.lookup_offset, offset)
        return result.to_json()

    @app.get(
        "/v1/topics/{topic}/partitions/{partition}/timestamps/{timestamp}", tags=["lookup"], dependencies=auth
    )
    async def by_timestamp(topic: str, partition: int, timestamp: int) -> dict[str, Any]:
        reader = readers.reader(topic, partition)
        result = await run_in_threadpool(reader.lookup_timestamp, timestamp)
        return result.to_json()

    @app.get(
        "/v1/topics/{topic}/partitions/{partition}/records",
        tags=["fetch"],
        dependencies=auth,
        response_model=None,
    )
    async def records(
        request: Request,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int = 1_048_576,
        format: Literal["raw", "json"] = "raw",
        verify: bool = False,
        isolation: txn.Isolation = "read_uncommitted",
    ) -> Response | dict[str, Any]:
        """``verify``: CRC-check remote batches again (they were checked before upload).
        ``isolation``: Kafka's; read_committed answers only committed records (docs/transactions.md)."""
        reader = readers.reader(topic, partition)
        if max_bytes <= 0 or max_bytes > 64 << 20:
            raise InvalidArgumentError(f"max_bytes {max_bytes} must be in [1, 67108864]")
        fetched = await run_in_threadpool(
            txn.fetch, reader, offset, max_bytes, isolation, verify=verify, reader_key=reader_key(request)
        )
        if format == "json":
            return _fetch_json(fetched)
        headers = {
            "X-Rlm-Tier": fetched.tier,
            "X-Rlm-Next-Offset": str(fetched.next_offset),
            "X-Rlm-Batches": str(len(fetched.batches)),
            **_txn_headers(fetched),
        }
        if fetched.high_watermark is not None:
            headers["X-Rlm-High-Watermark"] = str(fetched.high_watermark)
        # The fetched bytes go to the socket as they are (no re-encoding, no join).
        return Response(fetched.data, media_type="application/octet-stream", headers=headers)

    @app.get(
        "/v1/topics/{topic}/partitions/{partition}/records/stream",
        tags=["fetch"],
        dependencies=auth,
        response_class=Response,
    )
    async def records_stream(
        request: Request,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int = DEFAULT_STREAM_BYTES,
        verify: bool = False,
        isolation: txn.Isolation = "read_uncommitted",
    ) -> Response:
        """Raw record batches back to back from the batch holding ``offset`` (chunked) while they
        fit ``max_bytes`` (≥ 1 batch), ending at the visible end; the same bytes as successive
        ``/records`` calls (docs/streaming.md). read_committed: only committed data batches, up to
        the last stable offset (docs/transactions.md)."""
        reader = readers.reader(topic, partition)
        if not 0 < max_bytes <= MAX_STREAM_BYTES:
            raise InvalidArgumentError(f"max_bytes {max_bytes} must be in [1, {MAX_STREAM_BYTES}]")
        fetch = txn.fetcher(reader, isolation, verify=verify, reader_key=reader_key(request))
        first = await first_chunk(fetch, offset, max_bytes)
        headers = stream_headers(first, offset)
        if not first.batches:  # at the visible end: as /records there, 200 and no records
            headers.update({"X-Rlm-Batches": "0", "X-Rlm-Next-Offset": str(first.next_offset)})
            return Response(b"", media_type="application/octet-stream", headers=headers)
        where = f"{topic}-{partition} stream from {offset}"
        body = stream_body(first, fetch, max_bytes, stall_s=timeout_s, metrics=stream_metrics, where=where)
        return BatchStream(body, media_type="application/octet-stream", headers=headers)

    @app.post("/v1/offsets-for-times", tags=["lookup"], dependencies=auth)
    async def offsets_for_times(body: OffsetsForTimesRequest) -> list[dict[str, Any]]:
        rows = await run_in_threadpool(readers.offsets_for_times, body.timestamp, body.topics, body.minus_ms)
        return [
            {
                "topic": r.topic,
                "partition": r.partition,
                "offset": r.offset,
                "timestamp": r.timestamp,
                "tier": r.tier,
            }
            for r in rows
        ]

    return app


def reader_key(request: Request) -> tuple[str, str]:
    """Who reads, for read-ahead (docs/read-path.md): the client's ``X-Rlm-Reader`` header (one
    reader across connections) or else its connection (address and port)."""
    client = request.client
    host, port = (client.host, str(client.port)) if client is not None else ("", "")
    named = request.headers.get("x-rlm-reader")
    return (host, "reader:" + named) if named else (host, port)


class _Unauthorized(Exception):
    pass


def _txn_headers(fetched: FetchResult) -> dict[str, str]:
    """read_committed raw answers (docs/transactions.md): only committed data batches are in the
    body; these say the LSO applied and how many aborted transactions the range had."""
    if fetched.isolation != "read_committed":
        return {}
    out = {
        "X-Rlm-Isolation": fetched.isolation,
        "X-Rlm-Aborted-Transactions": str(len(fetched.aborted_transactions)),
    }
    if fetched.last_stable_offset is not None:
        out["X-Rlm-Last-Stable-Offset"] = str(fetched.last_stable_offset)
    return out


def _fetch_json(fetched: FetchResult) -> dict[str, Any]:
    def b64(v: bytes | None) -> str | None:
        return None if v is None else base64.b64encode(v).decode()

    return {
        "topic": fetched.topic,
        "partition": fetched.partition,
        "tier": fetched.tier,
        "next_offset": fetched.next_offset,
        "high_watermark": fetched.high_watermark,
        "log_start_offset": fetched.log_start_offset,
        **(
            {
                "isolation": fetched.isolation,
                "last_stable_offset": fetched.last_stable_offset,
                "aborted_transactions": [a.to_json() for a in fetched.aborted_transactions],
                "scanned_segments": len(fetched.txn_scanned),
            }
            if fetched.isolation == "read_committed"
            else {}
        ),
        "batches": [
            {
                "base_offset": b.base_offset,
                "last_offset": b.last_offset,
                "is_control": b.is_control,
                "records": [
                    {
                        "offset": r.offset,
                        "timestamp": r.timestamp,
                        "key": b64(r.key),
                        "value": b64(r.value),
                        "headers": [{"key": h.key, "value": b64(h.value)} for h in r.headers],
                    }
                    for r in fetched.records(b)
                ],
            }
            for b in fetched.batches
        ],
    }
