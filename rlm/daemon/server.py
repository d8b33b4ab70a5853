"""The daemon's HTTP endpoint for Prometheus (``/metrics``) on ``[server] host:port``."""

from __future__ import annotations

import logging

from prometheus_client import start_http_server

from rlm.config import ServerSettings
from rlm.tiering.manager import RemoteLogManager

log = logging.getLogger(__name__)


def serve_metrics(manager: RemoteLogManager, server: ServerSettings) -> None:
    start_http_server(server.port, addr=server.host, registry=manager.shared.metrics.registry)
    log.info("metrics on http://%s:%d/metrics", server.host, server.port)
