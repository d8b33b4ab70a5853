"""One asyncio connection from rlm's Kafka listener to a broker of the live cluster, for the group
requests rlm relays to the cluster's coordinator (docs/kafka-listener.md §6).

The connection speaks the ``[cluster]`` ``security_protocol`` (:class:`UpstreamSecurity`): TLS
verified against ``ssl_cafile`` (or the system's CAs) and the broker's advertised host name, then
SASL (PLAIN, SCRAM-SHA-256/512: SaslHandshake v1 and SaslAuthenticate v1, KIP-152) before the
first relayed request. The SASL mechanisms' steps are kafka-python's (``kafka.net.sasl``); SCRAM
checks the broker's signature, so a server that does not know the password cannot pass itself off
as the cluster. A refusal is a :class:`ConfigError` naming the keys to fix (configuration, not a
fault that retrying heals).

Requests on one connection are answered in order, one at a time: the caller (one client
connection) never sends the next before the last answer came back, so a response's correlation
id is always the request's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import ssl
from dataclasses import dataclass, field
from typing import Any

from kafka.net.sasl import get_sasl_mechanism
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from rlm.config.brokers import ClusterSettings, sasl_password
from rlm.config.tls import client_context
from rlm.errors import ConfigError, KafkaProtocolError

__all__ = ["Upstream", "UpstreamSecurity", "split_server"]

_MAX_RESPONSE = 100 << 20  # a group answer is kilobytes; more is not a Kafka broker speaking
_MAX_SASL_ROUNDS = 4  # PLAIN takes one SaslAuthenticate, SCRAM two; a broker asking more is not Kafka
_CREDENTIALS = "cluster.sasl_username, cluster.sasl_password_file"


def split_server(server: str) -> tuple[str, int]:
    """``"host:port"`` (``[v6]:port``) → ``(host, port)``; the config validated the shape."""
    host, _, port = server.rpartition(":")
    return host.strip("[]"), int(port)


@dataclass(frozen=True, slots=True)
class UpstreamSecurity:
    """How rlm connects to the cluster's brokers: ``tls`` (None: plaintext) and, when
    ``mechanism`` is set, SASL as ``username``/``password``."""

    tls: ssl.SSLContext | None = None
    mechanism: str = ""
    username: str = ""
    password: str = field(default="", repr=False)

    @classmethod
    def of_cluster(cls, c: ClusterSettings) -> UpstreamSecurity:
        """From ``[cluster]``: reads the password file and the CA bundle now, so a missing or bad
        one is one ConfigError naming its key before anything listens."""
        tls = (
            client_context(c.ssl_cafile, key="cluster.ssl_cafile")
            if c.security_protocol.endswith("SSL")
            else None
        )
        if not c.security_protocol.startswith("SASL_"):
            return cls(tls)
        if not c.sasl_username:
            raise ConfigError(
                f"config key cluster.sasl_username is empty: security_protocol = "
                f"{c.security_protocol!r} needs a user name and a password file"
            )
        return cls(tls, c.sasl_mechanism, c.sasl_username, sasl_password(c))


PLAINTEXT = UpstreamSecurity()


class Upstream:
    """A connection to ``host:port``; :meth:`roundtrip` forwards one raw request frame."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, where: str) -> None:
        self._reader = reader
        self._writer = writer
        self.where = where
        self._ids = itertools.count(1)

    @classmethod
    async def open(
        cls, host: str, port: int, timeout_s: float, security: UpstreamSecurity = PLAINTEXT
    ) -> Upstream:
        """Connect, and authenticate as ``security`` says, within ``timeout_s`` seconds. OSError or
        TimeoutError when the broker is not there; ConfigError when it refuses rlm's
        credentials or its certificate does not verify; KafkaProtocolError when it answers
        something that is not Kafka's SASL exchange."""
        return await asyncio.wait_for(cls._open(host, port, security, timeout_s), timeout_s)

    @classmethod
    async def _open(cls, host: str, port: int, security: UpstreamSecurity, timeout_s: float) -> Upstream:
        where = f"{host}:{port}"
        try:
            reader, writer = await asyncio.open_connection(
                host, port, ssl=security.tls, server_hostname=host if security.tls else None
            )
        except ssl.SSLCertVerificationError as err:
            raise ConfigError(
                f"the broker at {where} has a TLS certificate that does not verify against "
                f"cluster.ssl_cafile (or the system's CAs): {err.verify_message}"
            ) from None
        up = cls(reader, writer, where)
        if security.mechanism:
            try:
                await up._authenticate(security, timeout_s)
            except BaseException:
                up.close()
                raise
        return up

    async def _authenticate(self, security: UpstreamSecurity, timeout_s: float) -> None:
        mech = security.mechanism
        shake = await self.request(SaslHandshakeRequest(mechanism=mech), 1, SaslHandshakeResponse, timeout_s)
        if shake.error_code:
            offered = ", ".join(shake.mechanisms) or "none"
            raise ConfigError(
                f"the broker at {self.where} does not accept SASL mechanism {mech} "
                f"(cluster.sasl_mechanism); it offers: {offered}"
            )
        steps = get_sasl_mechanism(mech)(
            sasl_mechanism=mech, sasl_plain_username=security.username, sasl_plain_password=security.password
        )
        for _ in range(_MAX_SASL_ROUNDS):
            if steps.is_done():
                break
            req = SaslAuthenticateRequest(auth_bytes=steps.auth_bytes())
            resp = await self.request(req, 1, SaslAuthenticateResponse, timeout_s)
            if resp.error_code:
                raise ConfigError(
                    f"the broker at {self.where} refused rlm's SASL {mech} authentication as "
                    f"{security.username!r} ({_CREDENTIALS}): {resp.error_message or resp.error_code}"
                )
            try:
                steps.receive(bytes(resp.auth_bytes))
            except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
                # SCRAM: a wrong server signature or a malformed step: not the cluster we know
                raise ConfigError(
                    f"the broker at {self.where} answered rlm's SASL {mech} exchange with a step "
                    f"that does not verify ({_CREDENTIALS}): {err or type(err).__name__}"
                ) from None
        if not (steps.is_done() and steps.is_authenticated()):
            raise KafkaProtocolError(f"{self.where} did not finish the SASL {mech} exchange")

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
        """rlm's own request (ApiVersions, FindCoordinator, SASL) with a correlation id of its
        own: the decoded response body."""
        body.with_header(correlation_id=next(self._ids), client_id="rlm")
        frame = bytes(body.encode(version=version, header=True, framed=False))
        answer = await self.roundtrip(frame, timeout_s)
        try:
            return response.decode(answer, version=version, header=True)
        except Exception as err:  # kafka-python's decoders raise what the bytes make them raise
            raise KafkaProtocolError(
                f"{self.where} answered a {type(body).__name__} v{version} that does not decode: {err}"
            ) from None

    def close(self) -> None:
        with contextlib.suppress(Exception):  # already broken: nothing to release but the socket
            self._writer.close()
