"""Routes of the daemon's state (docs/http-api.md §2): liveness, Prometheus metrics, the status
rows, the status page's history and the store's health. None of them touches the store."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.params import Depends as DependsParam
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.concurrency import run_in_threadpool

from rlm import __version__

__all__ = [
    "DeletedSource",
    "HistorySource",
    "PinsSource",
    "StatusSource",
    "StoreSource",
    "install_status_routes",
]

StatusSource = Callable[[], list[dict[str, Any]]]
HistorySource = Callable[[], dict[str, Any]]
StoreSource = Callable[[], dict[str, Any]]
PinsSource = Callable[[], list[dict[str, Any]]]
DeletedSource = Callable[[], list[dict[str, Any]]]


def install_status_routes(
    app: FastAPI,
    auth: list[DependsParam],
    *,
    status: StatusSource,
    registry: CollectorRegistry,
    history: HistorySource | None,
    store: StoreSource | None,
    pins: PinsSource | None = None,
    deleted: DeletedSource | None = None,
) -> None:
    """``/healthz`` (no auth), ``/metrics``, ``/v1/partitions``, ``/v1/history``, ``/v1/store``,
    ``/v1/pins``, ``/v1/deleted-topics``."""

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

    @app.get("/v1/pins", tags=["status"], dependencies=auth)
    async def pins_() -> list[dict[str, Any]]:
        """Per log dir, what rlm holds of the broker's files and its bound
        (``tiering.max_pinned_bytes``): answered from memory; ``[]`` without a manager."""
        return [] if pins is None else pins()

    @app.get("/v1/deleted-topics", tags=["status"], dependencies=auth)
    async def deleted_topics() -> list[dict[str, Any]]:
        """Deleted topics' partitions whose remote data waits for ``tiering.deleted_topic_grace_ms``
        (``delete_after_ms``, epoch ms), as the last GC found them (docs/topic-identity.md)."""
        return deleted() if deleted is not None else []
