"""The bearer-token guard of the HTTP API (docs/security.md): a FastAPI dependency every route
but ``/healthz`` and the status page's static files carries."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from fastapi import Depends, Request
from fastapi.params import Depends as DependsParam

from rlm.config import ServerSettings
from rlm.config.server import bearer_token
from rlm.errors import UnauthorizedError

__all__ = ["token_guard"]


def token_guard(server: ServerSettings) -> list[DependsParam]:
    """The dependencies of a guarded route: a check of ``Authorization: Bearer <token>`` raising
    :class:`UnauthorizedError` (401), passing every request when ``server`` has no token.
    ``token_file`` is read here, once."""
    token = bearer_token(server).encode()

    async def require_token(request: Request) -> None:
        if not token:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        # compare_digest: the time taken does not depend on how much of the token matched.
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token):
            raise UnauthorizedError("missing or wrong bearer token")

    guard: Callable[[Request], Awaitable[None]] = require_token
    return [Depends(guard)]
