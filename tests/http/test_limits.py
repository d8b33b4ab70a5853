"""Bounded request bodies on every route (server.max_body_bytes) and the store-health route, over a
real socket (ApiServer/uvicorn) on a tiered partition."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from fastapi.routing import APIRoute

from rlm.cli.wiring import build_api
from rlm.http.server import ApiServer
from rlm.storage.local import LocalBackend
from rlm.tiering.manager import RemoteLogManager
from tests.lookup.helpers import settings_for, write_generated

LIMIT = 2048
PATH_VALUES = {"topic": "orders", "partition": "0", "offset": "0", "timestamp": "-1"}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    tmp = tmp_path_factory.mktemp("limits")
    logs, store = tmp / "logs", tmp / "store"
    write_generated(logs, "orders", 0, batches=40, seed=5)
    settings = settings_for(
        [logs], options={"root": str(store)}, server={"host": "127.0.0.1", "port": 0, "max_body_bytes": LIMIT}
    )
    manager = RemoteLogManager(settings, LocalBackend(root=str(store)))
    assert all(r.error is None for r in manager.run_once())
    app = build_api(settings, manager).app  # wired as `rlm run` wires it
    routes = []
    for route in app.routes:
        if isinstance(route, APIRoute) and not route.path.startswith(("/docs", "/openapi", "/redoc")):
            path = route.path
            for name, value in PATH_VALUES.items():
                path = path.replace("{" + name + "}", value)
            routes += [(method, path) for method in sorted(route.methods or ())]
    server = ApiServer(app, "127.0.0.1", 0).start()
    try:
        yield server.url, routes
    finally:
        server.stop()


def _assert_413(resp: httpx.Response) -> None:
    assert resp.status_code == 413, resp.text
    err = resp.json()["error"]
    assert err["field"] == "body" and str(LIMIT) in err["reason"]


def test_every_route_refuses_a_declared_oversized_body(served: tuple[str, list[tuple[str, str]]]) -> None:
    url, routes = served
    methods = {m for m, _ in routes}
    assert "POST" in methods and any(p == "/v1/offsets-for-times" for _, p in routes)
    with httpx.Client(base_url=url, timeout=10) as http:
        for method, path in routes:
            _assert_413(
                http.request(
                    method,
                    path,
                    content=b"{" + b" " * LIMIT + b"}",
                    headers={"content-type": "application/json"},
                )
            )


def test_every_route_refuses_a_streamed_oversized_body(served: tuple[str, list[tuple[str, str]]]) -> None:
    url, routes = served

    def chunks() -> Iterator[bytes]:
        for _ in range(64):  # 64 KiB in total, no Content-Length: chunked
            yield b" " * 1024

    with httpx.Client(base_url=url, timeout=10) as http:
        for method, path in routes:
            _assert_413(
                http.request(method, path, content=chunks(), headers={"content-type": "application/json"})
            )


def test_bodies_within_the_limit_still_work(served: tuple[str, list[tuple[str, str]]]) -> None:
    url, _ = served
    body = json.dumps({"timestamp": -1, "topics": ["orders"]}).encode()
    with httpx.Client(base_url=url, timeout=10) as http:
        declared = http.post(
            "/v1/offsets-for-times", content=body, headers={"content-type": "application/json"}
        )
        streamed = http.post(
            "/v1/offsets-for-times",
            content=iter([body[:5], body[5:]]),
            headers={"content-type": "application/json"},
        )
        assert declared.status_code == streamed.status_code == 200, (declared.text, streamed.text)
        assert declared.json() == streamed.json() and declared.json()[0]["topic"] == "orders"


def test_store_route_reports_health_from_memory(served: tuple[str, list[tuple[str, str]]]) -> None:
    url, _ = served
    with httpx.Client(base_url=url, timeout=10) as http:
        doc = http.get("/v1/store").json()
    assert doc["backend"] == "local" and doc["status"] == "up" and doc["reachable"] is True
    assert doc["unreachable_since_ms"] is None and doc["last_success_ms"] > 0
