"""The error answers of the HTTP API come from the error's class and the data it was raised with
(rlm/errors.py, rlm/http/error_answers.py), never from its text: over a real socket (ApiServer),
routes raise each error class of rlm and the answer is checked against the class's attributes."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI

from rlm import errors
from rlm.errors import InvalidArgumentError, RlmError, StorageError
from rlm.http.error_answers import install_error_handlers
from rlm.http.server import ApiServer
from tests.ops.test_error_kinds import RLM_ERRORS, instance

BY_NAME = {cls.__name__: cls for cls in RLM_ERRORS}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/invalid")
    async def invalid(reason: str, field: str | None = None) -> None:
        raise InvalidArgumentError(reason, field=field)

    @app.get("/raise/{name}")
    async def raise_(name: str) -> None:
        raise instance(BY_NAME[name]).in_file("/data/orders-0/00000000000000000000.log", base_position=12)

    server = ApiServer(app, "127.0.0.1", 0).start()
    try:
        yield server.url
    finally:
        server.stop()


def test_the_field_is_the_one_the_raise_site_named(url: str) -> None:
    reason = "must be one of 1, 2 or 3"  # names no parameter: nothing to guess from
    resp = httpx.get(f"{url}/invalid", params={"reason": reason, "field": "zebra"})
    assert resp.status_code == 400
    assert resp.json() == {"error": {"field": "zebra", "reason": reason}}


def test_a_reason_that_names_a_parameter_blames_none_unless_the_raise_site_does(url: str) -> None:
    reason = "offset 5 is negative in the partition topic"  # the words the old text match looked for
    resp = httpx.get(f"{url}/invalid", params={"reason": reason})
    assert resp.status_code == 400
    assert resp.json() == {"error": {"field": None, "reason": reason}}


@pytest.mark.parametrize("cls", RLM_ERRORS, ids=lambda c: c.__name__)
def test_every_error_class_answers_its_status_field_and_headers(url: str, cls: type[RlmError]) -> None:
    resp = httpx.get(f"{url}/raise/{cls.__name__}")
    assert resp.status_code == cls.http_status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    err = instance(cls).in_file("/data/orders-0/00000000000000000000.log", base_position=12)
    if cls.http_status < 500:  # the request names the context: the reason alone
        reason = err.reason
    else:  # the server's side: file, byte position and offset as str() renders them
        reason = str(err)
        assert "/data/orders-0/00000000000000000000.log" in reason
    if issubclass(cls, StorageError):
        reason = f"remote store: {reason}"
    assert resp.json() == {"error": {"field": cls.default_field, "reason": reason}}
    for name, value in cls.http_headers.items():
        assert resp.headers[name] == value


def test_headers_only_where_the_class_asks_for_them(url: str) -> None:
    assert httpx.get(f"{url}/raise/StoreUnavailableError").headers["retry-after"] == "5"
    assert httpx.get(f"{url}/raise/UnauthorizedError").headers["www-authenticate"] == "Bearer"
    plain = httpx.get(f"{url}/raise/StorageError")
    assert plain.status_code == 502 and "retry-after" not in plain.headers
    assert errors.StoreUnavailableError.http_headers is not errors.StorageError.http_headers
