"""The API's TLS context from ``[server] tls_cert``/``tls_key`` (docs/security.md); the context
builders themselves are rlm/config/tls.py, shared with the Kafka listener."""

from __future__ import annotations

import ssl

from rlm.config import ServerSettings
from rlm.config.tls import server_context

__all__ = ["serving_context"]


def serving_context(server: ServerSettings) -> ssl.SSLContext | None:
    """The API's context when ``[server] tls_cert``/``tls_key`` are set (config checks made them
    come together), else None: plain HTTP."""
    if server.tls_cert is None or server.tls_key is None:
        return None
    return server_context(server.tls_cert, server.tls_key)
