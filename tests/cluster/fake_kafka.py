"""A fake Kafka broker at the wire-protocol level, for the kafka-admin leadership source.

A threaded TCP server on loopback that answers ApiVersions, Metadata, and SASL PLAIN
(SaslHandshake + SaslAuthenticate) with kafka-python's own ``kafka.protocol`` message classes,
decoding each request at the version the client chose and answering at that version. The cluster
it describes (brokers, topics, leaders, epochs) is whatever the test sets. It is not Kafka: no
controller, no other APIs (an unknown request closes the connection), no TLS. What a test against
it proves is that rlm's client configuration, request and parsing work with kafka-python's real
client end to end over TCP — not that a real broker answers the same way.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import struct
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

_SASL_AUTHENTICATION_FAILED = 58
_UNSUPPORTED_SASL_MECHANISM = 33
_UNSUPPORTED_VERSION = 35
#: (api key, max version) this broker advertises; Metadata 12 is what Kafka 3.x/4.x brokers serve.
_APIS = {ApiVersionsRequest: 3, MetadataRequest: 12, SaslHandshakeRequest: 1, SaslAuthenticateRequest: 2}


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True  # a broker restarted on its port (TIME_WAIT of the old connections)
    daemon_threads = True


@dataclass
class FakeCluster:
    """What Metadata answers: partitions ``(topic, partition) -> (leader, leader_epoch)``."""

    brokers: tuple[int, ...] = (1, 2, 3)
    partitions: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    topic_errors: dict[str, int] = field(default_factory=dict)
    topic_ids: dict[str, uuid.UUID] = field(default_factory=dict)
    replicas: dict[tuple[str, int], tuple[int, ...]] = field(default_factory=dict)


class FakeKafkaBroker:
    """``with FakeKafkaBroker() as broker: broker.address`` → ``"127.0.0.1:<port>"``."""

    def __init__(self, *, sasl_plain: tuple[str, str] | None = None, port: int = 0) -> None:
        self.cluster = FakeCluster()
        self.sasl_plain = sasl_plain
        self.requests: list[tuple[str, int]] = []  # (request class name, version), in order
        self.authenticated: list[str] = []  # user names that passed SASL PLAIN
        self._lock = threading.Lock()
        self._connections: list[Any] = []
        broker = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                broker._serve(self.request)

        self._server = _Server(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set_leader(
        self, topic: str, partition: int, leader: int, epoch: int, replicas: tuple[int, ...] | None = None
    ) -> None:
        """``replicas`` default: every broker."""
        with self._lock:
            self.cluster.topic_ids.setdefault(topic, uuid.uuid4())
            self.cluster.partitions[(topic, partition)] = (leader, epoch)
            self.cluster.replicas[(topic, partition)] = replicas or self.cluster.brokers

    def metadata_requests(self) -> int:
        return sum(1 for name, _ in self.requests if name == "MetadataRequest")

    def __enter__(self) -> FakeKafkaBroker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop listening and drop every open connection (as a broker that went away)."""
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            for sock in self._connections:
                with contextlib.suppress(OSError):  # already closed by the client
                    sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)

    # -- the protocol -----------------------------------------------------------------------------

    def _serve(self, sock: Any) -> None:
        with self._lock:
            self._connections.append(sock)
        authenticated = self.sasl_plain is None
        while True:
            head = _read(sock, 4)
            if head is None:
                return
            payload = _read(sock, struct.unpack(">i", head)[0])
            if payload is None:
                return
            api_key, version, correlation_id = struct.unpack(">hhi", payload[:8])
            request_class = next((c for c in _APIS if api_key == c.API_KEY), None)
            if request_class is ApiVersionsRequest and version > _APIS[request_class]:
                # Kafka's answer to a newer ApiVersions: UNSUPPORTED_VERSION at v0, with the list.
                response = ApiVersionsResponse(
                    error_code=_UNSUPPORTED_VERSION, api_keys=self._api_keys(), throttle_time_ms=0
                )
                _send(sock, response, 0, correlation_id)
                continue
            if request_class is None or version > _APIS[request_class]:
                return  # a client asking for what was not advertised: closed (a test failure)
            request = request_class.decode(payload, version=version, header=True)
            with self._lock:
                self.requests.append((request_class.__name__, version))
            if request_class is MetadataRequest and not authenticated:
                return  # Kafka closes the connection of a client that skips authentication
            response, authenticated = self._answer(request, authenticated)
            _send(sock, response, version, correlation_id)

    def _answer(self, request: Any, authenticated: bool) -> tuple[Any, bool]:
        if isinstance(request, ApiVersionsRequest):
            answer = ApiVersionsResponse(error_code=0, api_keys=self._api_keys(), throttle_time_ms=0)
            return answer, authenticated
        if isinstance(request, SaslHandshakeRequest):
            ok = self.sasl_plain is not None and request.mechanism == "PLAIN"
            return SaslHandshakeResponse(
                error_code=0 if ok else _UNSUPPORTED_SASL_MECHANISM, mechanisms=["PLAIN"]
            ), authenticated
        if isinstance(request, SaslAuthenticateRequest):
            _authzid, user, password = bytes(request.auth_bytes).split(b"\0")
            ok = self.sasl_plain == (user.decode(), password.decode())
            if ok:
                self.authenticated.append(user.decode())
            return SaslAuthenticateResponse(
                error_code=0 if ok else _SASL_AUTHENTICATION_FAILED,
                error_message=None if ok else "Authentication failed: Invalid username or password",
                auth_bytes=b"",
                session_lifetime_ms=0,
            ), ok
        return self._metadata(), authenticated

    @staticmethod
    def _api_keys() -> list[Any]:
        return [
            ApiVersionsResponse.ApiVersion(api_key=c.API_KEY, min_version=0, max_version=v)
            for c, v in _APIS.items()
        ]

    def _metadata(self) -> Any:
        r = MetadataResponse
        with self._lock:
            brokers = [
                r.MetadataResponseBroker(node_id=n, host="127.0.0.1", port=self.port, rack=None)
                for n in self.cluster.brokers
            ]
            by_topic: dict[str, list[Any]] = {}
            for (topic, partition), (leader, epoch) in sorted(self.cluster.partitions.items()):
                by_topic.setdefault(topic, []).append(
                    r.MetadataResponseTopic.MetadataResponsePartition(
                        error_code=0 if leader >= 0 else 5,  # LEADER_NOT_AVAILABLE
                        partition_index=partition,
                        leader_id=leader,
                        leader_epoch=epoch,
                        replica_nodes=list(self.cluster.replicas[(topic, partition)]),
                        isr_nodes=list(self.cluster.replicas[(topic, partition)]),
                        offline_replicas=[],
                    )
                )
            topics = [
                r.MetadataResponseTopic(
                    error_code=0,
                    name=name,
                    topic_id=self.cluster.topic_ids[name],
                    is_internal=False,
                    partitions=parts,
                    authorized_operations=set(),
                )
                for name, parts in by_topic.items()
            ]
            topics += [
                r.MetadataResponseTopic(
                    error_code=code,
                    name=name,
                    topic_id=uuid.UUID(int=0),
                    is_internal=False,
                    partitions=[],
                    authorized_operations=set(),
                )
                for name, code in self.cluster.topic_errors.items()
            ]
        return r(
            throttle_time_ms=0,
            brokers=brokers,
            cluster_id="fake-cluster",
            controller_id=1,
            topics=topics,
            authorized_operations=set(),
        )


def _send(sock: Any, response: Any, version: int, correlation_id: int) -> None:
    response.API_VERSION = version  # before the header exists: the setter would write it into one
    response.with_header(correlation_id=correlation_id)
    sock.sendall(response.encode(header=True, framed=True))


def _read(sock: Any, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        try:
            chunk = sock.recv(size - len(data))
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return data
