"""How every error becomes an HTTP answer: JSON ``{"error": {"field": ..., "reason": ...}}``
(docs/http-api.md §5), installed on the app once by :func:`install_error_handlers`.

The status, the blamed field and any extra headers come from the error's class and the data it
was raised with (``RlmError.http_status``, ``.field``, ``.http_headers`` in rlm/errors.py), never
from its text. A 4xx answer says the reason alone (the request already names partition and
offset); a 5xx names file, byte position and offset where known, and a store failure says it is
one (``remote store: …``).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from rlm.errors import RlmError, StorageError

__all__ = ["error_response", "install_error_handlers", "rlm_error_response"]


def error_response(status: int, field: str | None, reason: str) -> JSONResponse:
    """The one shape of an error answer."""
    return JSONResponse({"error": {"field": field, "reason": reason}}, status_code=status)


def rlm_error_response(err: RlmError) -> JSONResponse:
    """The answer for ``err``: its class's status and headers, the field it was raised with."""
    reason = err.reason if err.http_status < 500 else str(err)
    if isinstance(err, StorageError):
        reason = f"remote store: {reason}"
    response = error_response(err.http_status, err.field, reason)
    response.headers.update(err.http_headers)
    return response


async def _on_rlm_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RlmError)  # registered for RlmError only
    return rlm_error_response(exc)


async def _on_validation(_: Request, exc: Exception) -> JSONResponse:
    """A parameter or body FastAPI could not parse: 400 naming the parameter (``partition``,
    ``minus_ms``), with pydantic's message."""
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p not in ("path", "query", "body")]
    return error_response(400, ".".join(loc) or None, str(first.get("msg", "invalid request")))


async def _on_http(_: Request, exc: Exception) -> JSONResponse:
    """Starlette's own answers (an unknown route 404, a wrong method 405) in the same shape."""
    assert isinstance(exc, StarletteHTTPException)
    return error_response(exc.status_code, None, str(exc.detail))


def install_error_handlers(app: FastAPI) -> None:
    """Every error of every route answered as JSON: rlm's by class (one handler for the whole
    tree: Starlette picks the closest registered class of the exception's MRO), FastAPI's request
    validation and Starlette's routing errors in the same shape."""
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(StarletteHTTPException, _on_http)
    app.add_exception_handler(RlmError, _on_rlm_error)
