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
    POST /v1/topics/{t}/partitions/{p}/delete-records      {"before"}: raise the log start (needs
                                                           [server] token; 403 without one)
    GET  /metrics                                          Prometheus text format
    GET  /healthz                                          liveness (no auth)
    GET  /v1/history                                       totals over the last hour (status page)
    GET  /v1/store                                         the remote store's health (no store I/O)
    GET  /v1/pins                                          pinned bytes per log dir and their bound
    GET  /                                                 the status page (static; no auth — its
                                                           API calls send the token)

The routes live by concern in ``routes_status`` (ops and status), ``status_page`` (``/``),
``routes_lookup`` and ``routes_records``; :func:`create_app` only assembles them with the token
guard (``auth``), the request limits (``limits``) and the error answers (``error_answers``).

Errors are JSON ``{"error": {"field": ..., "reason": ...}}``, the status chosen by the error's
class (``RlmError.http_status``, rlm/errors.py): 400 bad input, 401 missing/wrong token, 404
unknown partition, 413 request body above ``server.max_body_bytes`` (every route), 416 offset out
of range for a fetch (:class:`OffsetOutOfRangeError`: below the log start or above the high
watermark; a fetch AT it answers 200 with no records), 504 request timeout (no response started
within ``server.request_timeout_ms``; a stream is bounded per chunk instead), 502 remote store
failure, 503 remote store unreachable (fails fast, ``Retry-After``; docs/operations.md). Topic
names are checked against Kafka's rules before any file access. Nothing at or above the high
watermark, nor below the log start, is ever returned (docs/visibility.md).
"""

from __future__ import annotations

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from rlm import __version__
from rlm.config import ServerSettings
from rlm.http.auth import token_guard
from rlm.http.error_answers import install_error_handlers
from rlm.http.limits import BodyLimitMiddleware, DeadlineMiddleware
from rlm.http.routes_admin import DeleteRecordsSource, install_admin_routes
from rlm.http.routes_lookup import install_lookup_routes
from rlm.http.routes_records import install_records_routes
from rlm.http.routes_status import (
    DeletedSource,
    HistorySource,
    PinsSource,
    StatusSource,
    StoreSource,
    install_status_routes,
)
from rlm.http.status_page import install_status_page
from rlm.http.stream import StreamMetrics
from rlm.tiering.read import TieredReaders

__all__ = ["create_app"]


def create_app(
    readers: TieredReaders,
    server: ServerSettings,
    *,
    status: StatusSource,
    registry: CollectorRegistry,
    history: HistorySource | None = None,
    store: StoreSource | None = None,
    pins: PinsSource | None = None,
    deleted: DeletedSource | None = None,
    delete_records: DeleteRecordsSource | None = None,
) -> FastAPI:
    """The API over ``readers`` as ``server`` configures it (token, body limit, request timeout);
    ``status``/``history``/``store``/``pins``/``deleted`` answer the status routes, ``delete_records``
    the delete-records route (not installed without it), ``registry`` is
    served at /metrics and holds the stream metrics."""
    # redirect_slashes off: a path that is not a route is a JSON 404, never a redirect to a guess
    # (".../offsets/0%2F" was redirected to ".../offsets/0": the fuzz test found it).
    app = FastAPI(
        title="rlm",
        version=__version__,
        redirect_slashes=False,
        description="Tiered-storage remote log manager: lookups across the local and "
        "remote tiers of Kafka-format logs.",
    )
    install_error_handlers(app)
    app.add_middleware(DeadlineMiddleware, timeout_ms=server.request_timeout_ms)
    app.add_middleware(
        BodyLimitMiddleware, max_bytes=server.max_body_bytes, drain_s=server.request_timeout_ms / 1000
    )
    auth = token_guard(server)
    install_status_routes(
        app,
        auth,
        status=status,
        registry=registry,
        history=history,
        store=store,
        pins=pins,
        deleted=deleted,
    )
    install_status_page(app)
    install_lookup_routes(app, readers, auth)
    stall_s = server.request_timeout_ms / 1000
    install_records_routes(
        app,
        readers,
        auth,
        stall_s=stall_s,
        metrics=StreamMetrics(registry),
        max_decoded_bytes=server.max_decoded_bytes,
    )
    install_admin_routes(app, server, auth, delete_records)
    return app
