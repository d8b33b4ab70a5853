"""One asyncio connection from rlm's Kafka listener to a broker of the live cluster, for the group
requests rlm relays to the cluster's coordinator (docs/kafka-listener.md §6).

PLAINTEXT only: with a ``[cluster]`` that needs TLS or SASL, groups stay refused
(rlm/config/brokers.py ``coordinator_servers``). Requests on one connection are answered in
order, one at a time: the caller (one client connection) never sends the next before the last
answer came back, so a response's correlation id is always the request's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Any

from rlm.errors import KafkaProtocolError

__all__ = ["Upstream", "split_server"]

_MAX_RESPONSE = 100 << 20  # a group answer is kilobytes; more is not a Kafka broker speaking


def split_server(server: str) -> tuple[str, int]:
    """``"host:port"`` (``[v6]:port``) → ``(host, port)``; the config validated the shape."""
    host, _, port = server.rpartition(":")
    return host.strip("[]"), int(port)


class Upstream:
    """A connection to ``host:port``; :meth:`roundtrip` forwards one raw request frame."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, where: str) -> None:
        self._reader = reader
        self._writer = writer
        self.where = where
        self._ids = itertools.count(1)

    @classmethod
    async def open(cls, host: str, port: int, timeout_s: float) -> Upstream:
        """Connect within ``timeout_s`` seconds (OSError or TimeoutError when the broker is not there)."""
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
        return cls(reader, writer, f"{host}:{port}")

    async def roundtrip(self, frame: bytes, timeout_s: float) -> bytes:
        """Send ``frame`` (a request without its size prefix) and return the response frame
        (without its size prefix), within ``timeout_s`` seconds for the whole exchange.
        KafkaProtocolError when the answer's correlation id is not the request's."""
        return await asyncio.wait_for(self._exchange(frame), timeout_s)

    async def _exchange(self, frame: bytes) -> bytes:
        self._writer.write(len(frame).to_bytes(4, "big") + frame)
        await self._writer.drain()
        size = int.from_bytes(await self._reader.readexactly(4), "big", signed=True)
        if not 4 <= size <= _MAX_RESPONSE:
            raise KafkaProtocolError(f"{self.where} answered a frame of {size} bytes")
        answer = await self._reader.readexactly(size)
        if answer[:4] != frame[4:8]:  # the request header's correlation id (after key and version)
            raise KafkaProtocolError(f"{self.where} answered another correlation id")
        return answer

    async def request(self, body: Any, version: int, response: Any, timeout_s: float) -> Any:
        """rlm's own request (ApiVersions, FindCoordinator) with a correlation id of its own: the
        decoded response body."""
        body.with_header(correlation_id=next(self._ids), client_id="rlm")
        frame = bytes(body.encode(version=version, header=True, framed=False))
        answer = await self.roundtrip(frame, timeout_s)
        return response.decode(answer, version=version, header=True)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # already broken: nothing to release but the socket
            self._writer.close()
