"""Consumer groups through the live cluster's coordinator (docs/kafka-listener.md §6).

With delegation on (``[kafka] groups = "auto"`` and a bootstrap known), FindCoordinator names rlm
itself — its node id, at the address the client reached, as Metadata does — and rlm relays
JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit and OffsetFetch to the cluster's group
coordinator, so committed offsets live in ``__consumer_offsets`` as usual. A request is decoded
only to validate it and read its group id; its raw frame goes upstream unchanged (correlation id
included) on a connection owned by the client connection (:class:`RelaySession`: one per
coordinator node, opened lazily, closed with the client connection). Never shared among clients:
a JoinGroup held through a rebalance would hold every other client's heartbeats behind it.

Everything here runs on the listener's event loop (a JoinGroup may be held for minutes; it must
not hold a pool thread). An unreachable cluster answers COORDINATOR_NOT_AVAILABLE in each API's
shape; the client then asks FindCoordinator again (rlm) and retries.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import replace
from typing import Any

from kafka.protocol.consumer import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
)

from rlm.errors import ConfigError, KafkaProtocolError
from rlm.kafka.protocol import Api, Codes, RequestFrame, encode_response
from rlm.kafka.upstream import PLAINTEXT, Upstream, UpstreamSecurity, split_server

__all__ = [
    "FIND_COORDINATOR",
    "MAX_GROUPS_CACHED",
    "RELAYED",
    "Coordinator",
    "RelaySession",
    "group_of",
    "unavailable",
]

log = logging.getLogger(__name__)

# Kafka's coordinator error codes: a relayed answer carrying one means the cached coordinator is
# stale (moved, or loading), so the cache entry and the upstream connection are dropped.
NOT_AVAILABLE = Codes.COORDINATOR_NOT_AVAILABLE
_STALE = frozenset({Codes.COORDINATOR_LOAD_IN_PROGRESS, NOT_AVAILABLE, Codes.NOT_COORDINATOR})
_JOIN_GROUP, _OFFSET_COMMIT, _OFFSET_FETCH = 11, 8, 9
_JOIN_SLACK_S = 5.0  # a JoinGroup is held up to its rebalance timeout; the answer may take this longer
_GROUP, _TRANSACTION = 0, 1  # FindCoordinator key types (2: share group, not served)
_WARN_EVERY_S = 60.0  # a refused credential is warned about once a minute, not on every heartbeat
#: Groups whose coordinator is remembered at most (a few hundred bytes each); one forgotten is
#: asked of the cluster again.
MAX_GROUPS_CACHED = 10_000

#: FindCoordinator while delegating: v4+ batch keys (KIP-699), v6 adds key type 2 (share groups).
FIND_COORDINATOR = Api(10, FindCoordinatorRequest, FindCoordinatorResponse, 0, 6)

#: The relayed APIs, at the versions Kafka 4.1.1 and kafka-python share (docs/kafka-listener.md §6),
#: further capped by what the cluster advertises (:meth:`Coordinator.served`).
RELAYED: dict[int, Api] = {
    api.key: api
    for api in (
        Api(8, OffsetCommitRequest, OffsetCommitResponse, 2, 9),
        Api(9, OffsetFetchRequest, OffsetFetchResponse, 1, 9),
        Api(11, JoinGroupRequest, JoinGroupResponse, 0, 9),
        Api(12, HeartbeatRequest, HeartbeatResponse, 0, 4),
        Api(13, LeaveGroupRequest, LeaveGroupResponse, 0, 5),
        Api(14, SyncGroupRequest, SyncGroupResponse, 0, 5),
    )
}


class Coordinator:
    """The group → coordinator directory of one listener, over the cluster at ``bootstrap``
    (``"host:port"`` strings, tried in order), reached as ``security`` says (``[cluster]``).
    ``timeout_s``: connecting, and every relayed request but JoinGroup (whose bound is its
    rebalance timeout + 5 s); rlm's listener passes ``kafka.idle_timeout_ms``."""

    def __init__(
        self,
        bootstrap: tuple[str, ...],
        *,
        node_id: int,
        timeout_s: float,
        security: UpstreamSecurity = PLAINTEXT,
    ) -> None:
        self.bootstrap = bootstrap
        self.node_id = node_id
        self.timeout_s = timeout_s
        self.security = security
        self._warned_at = -_WARN_EVERY_S
        # group → (node id, host, port), least recently used first out: group ids come from
        # clients, and a client inventing them must not grow this without bound
        self._where: OrderedDict[str, tuple[int, str, int]] = OrderedDict()
        self._cluster: dict[int, tuple[int, int]] | None = None  # api key → versions, once known

    def served(self, base: dict[int, Api]) -> dict[int, Api]:
        """``base`` (the listener's table) with FindCoordinator 0–6 and the relayed APIs, each
        capped by the cluster's versions once an upstream ApiVersions told them."""
        table = {**base, FIND_COORDINATOR.key: FIND_COORDINATOR}
        for key, api in RELAYED.items():
            lo, hi = api.min_version, api.max_version
            if self._cluster is not None:
                theirs = self._cluster.get(key, (1, 0))
                lo, hi = max(lo, theirs[0]), min(hi, theirs[1])
            if lo <= hi:
                table[key] = replace(api, min_version=lo, max_version=hi)
            else:
                table.pop(key, None)
        return table

    def find_coordinator(self, req: Any, version: int, host: str, port: int) -> Any:
        """rlm itself for every group key (``host``/``port``: where the client reached rlm); a
        transactional id TRANSACTIONAL_ID_AUTHORIZATION_FAILED, a share group INVALID_REQUEST."""
        cls = FindCoordinatorResponse
        key_type = req.key_type if version >= 1 else _GROUP
        if key_type == _GROUP:
            code, message, node = Codes.NONE, None, (self.node_id, host, port)
        elif key_type == _TRANSACTION:
            code, message, node = Codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "no transactions here", None
        else:
            code, message, node = Codes.INVALID_REQUEST, "only classic consumer groups are relayed", None
        node_id, at, at_port = node or (-1, "", -1)
        if version < 4:
            return cls(
                throttle_time_ms=0,
                error_code=code,
                error_message=message,
                node_id=node_id,
                host=at,
                port=at_port,
            )
        coordinators = [
            cls.Coordinator(
                key=k, node_id=node_id, host=at, port=at_port, error_code=code, error_message=message
            )
            for k in req.coordinator_keys
        ]
        return cls(throttle_time_ms=0, coordinators=coordinators)

    def timeout_for(self, req: RequestFrame) -> float:
        """Seconds a relayed request may take: a JoinGroup its rebalance timeout (the session
        timeout at v0, as Kafka) + 5 s, the others :attr:`timeout_s`."""
        if req.api.key != _JOIN_GROUP:
            return self.timeout_s
        held = req.body.rebalance_timeout_ms if req.version >= 1 else req.body.session_timeout_ms
        return max(int(held), 0) / 1000 + _JOIN_SLACK_S

    def forget(self, group: str) -> None:
        self._where.pop(group, None)

    async def connect(self, host: str, port: int) -> Upstream:
        """A connection to ``host:port`` as :attr:`security` says (the errors of
        :meth:`Upstream.open`; a ConfigError is also logged: see :meth:`refused`)."""
        try:
            return await Upstream.open(host, port, self.timeout_s, self.security)
        except ConfigError as err:
            self.refused(err)
            raise

    def refused(self, err: ConfigError) -> None:
        """Log a refusal of rlm's own credentials: a warning at most once a minute (every client
        retries through FindCoordinator every few seconds), in between at INFO."""
        now = time.monotonic()
        level = logging.INFO
        if now - self._warned_at >= _WARN_EVERY_S:
            level, self._warned_at = logging.WARNING, now
        log.log(level, "kafka: groups: %s; group requests answer COORDINATOR_NOT_AVAILABLE", err)

    async def locate(self, group: str) -> tuple[int, str, int] | None:
        """``(node id, host, port)`` of ``group``'s coordinator: cached, else asked of the first
        bootstrap server that answers (FindCoordinator, key type 0). None: no server answered, or
        the cluster answered an error (it is logged)."""
        hit = self._where.get(group)
        if hit is not None:
            self._where.move_to_end(group)
            return hit
        for server in self.bootstrap:
            host, port = split_server(server)
            try:
                up = await self.connect(host, port)
            except ConfigError:
                continue
            except (OSError, TimeoutError, EOFError, KafkaProtocolError) as err:
                log.info("kafka: groups: cannot reach %s: %s", server, err or type(err).__name__)
                continue
            try:
                found = await self._ask(up, group)
            except (OSError, TimeoutError, EOFError, KafkaProtocolError) as err:
                log.info("kafka: groups: %s did not answer FindCoordinator: %s", server, err)
                continue
            finally:
                up.close()
            if found is not None:
                self._where[group] = found
                while len(self._where) > MAX_GROUPS_CACHED:
                    self._where.popitem(last=False)
            return found
        return None

    async def _ask(self, up: Upstream, group: str) -> tuple[int, str, int] | None:
        if self._cluster is None:
            got = await up.request(ApiVersionsRequest(), 0, ApiVersionsResponse, self.timeout_s)
            self._cluster = {k.api_key: (k.min_version, k.max_version) for k in got.api_keys}
        lo, hi = self._cluster.get(FIND_COORDINATOR.key, (0, 3))
        if lo <= 3:
            version = min(hi, 3)
            req = FindCoordinatorRequest(key=group, key_type=_GROUP)
        else:  # a cluster without the single-key versions: one key in the batch form
            version = min(hi, 6)
            req = FindCoordinatorRequest(key_type=_GROUP, coordinator_keys=[group])
        resp = await up.request(req, version, FindCoordinatorResponse, self.timeout_s)
        answer = resp.coordinators[0] if version >= 4 else resp
        if answer.error_code:
            log.info("kafka: groups: FindCoordinator %r at %s: error %d", group, up.where, answer.error_code)
            return None
        return int(answer.node_id), str(answer.host), int(answer.port)


class RelaySession:
    """One client connection's upstream connections, one per coordinator node."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self._up: dict[int, Upstream] = {}

    async def relay(self, req: RequestFrame, frame: bytes) -> bytes | bytearray:
        """The framed answer of the group's coordinator to ``frame`` (``req`` decoded from it):
        the cluster's own bytes, or COORDINATOR_NOT_AVAILABLE in the API's shape."""
        directory, group = self.coordinator, group_of(req)
        where = await directory.locate(group)
        if where is None:
            return encode_response(req.api, req.version, req.correlation_id, unavailable(req))
        node, host, port = where
        try:
            up = self._up.get(node)
            if up is None:
                up = self._up[node] = await directory.connect(host, port)
            answer = await up.roundtrip(frame, directory.timeout_for(req))
        except ConfigError:
            self._drop(node, group)
            return encode_response(req.api, req.version, req.correlation_id, unavailable(req))
        except (OSError, TimeoutError, EOFError, KafkaProtocolError) as err:
            log.info("kafka: groups: %s of %r at %s:%d failed: %s", req.api.name, group, host, port, err)
            self._drop(node, group)
            return encode_response(req.api, req.version, req.correlation_id, unavailable(req))
        if _STALE & _error_codes(req, answer):
            self._drop(node, group)
        return len(answer).to_bytes(4, "big") + answer

    def _drop(self, node: int, group: str) -> None:
        self.coordinator.forget(group)
        up = self._up.pop(node, None)
        if up is not None:
            up.close()

    def close(self) -> None:
        """Close every upstream connection (the client connection ended)."""
        for up in self._up.values():
            up.close()
        self._up.clear()


def group_of(req: RequestFrame) -> str:
    """The group a relayed request is about (OffsetFetch v8+: its first group; Kafka's consumer
    asks for one; others in the batch are answered by the same coordinator, NOT_COORDINATOR
    when theirs is another)."""
    body = req.body
    if req.api.key == _OFFSET_FETCH and req.version >= 8:
        if not body.groups:
            raise KafkaProtocolError("OffsetFetch names no group")
        return str(body.groups[0].group_id)
    return str(body.group_id)


def _error_codes(req: RequestFrame, answer: bytes) -> set[int]:
    """The error codes of a relayed answer: top level, per OffsetFetch group, per partition."""
    try:
        body = req.api.response.decode(answer, version=req.version, header=True)
    except Exception:  # not decodable: passed on as it is, nothing to learn
        return set()
    codes = {getattr(body, "error_code", None) or 0}
    for group in getattr(body, "groups", None) or ():
        codes.add(group.error_code)
    for topic in getattr(body, "topics", None) or ():
        codes.update(p.error_code for p in topic.partitions)
    return codes


def unavailable(req: RequestFrame) -> Any:
    """COORDINATOR_NOT_AVAILABLE in the shape of ``req``'s response: top level for the group
    APIs, per partition for OffsetCommit, per group (v8+) or top level and per partition for
    OffsetFetch."""
    api, body = req.api, req.body
    if api.key == _OFFSET_COMMIT:
        topic = OffsetCommitResponse.OffsetCommitResponseTopic
        topics = [
            topic(
                name=t.name,
                partitions=[
                    topic.OffsetCommitResponsePartition(
                        partition_index=p.partition_index, error_code=NOT_AVAILABLE
                    )
                    for p in t.partitions
                ],
            )
            for t in body.topics
        ]
        return OffsetCommitResponse(throttle_time_ms=0, topics=topics)
    if api.key == _OFFSET_FETCH:
        return _offset_fetch_unavailable(req)
    return api.response(error_code=NOT_AVAILABLE)


def _offset_fetch_unavailable(req: RequestFrame) -> Any:
    cls, body = OffsetFetchResponse, req.body
    if req.version >= 8:
        groups = [
            cls.OffsetFetchResponseGroup(group_id=g.group_id, topics=[], error_code=NOT_AVAILABLE)
            for g in body.groups
        ]
        return cls(throttle_time_ms=0, groups=groups)
    topic = cls.OffsetFetchResponseTopic
    topics = [
        topic(
            name=t.name,
            partitions=[
                topic.OffsetFetchResponsePartition(
                    partition_index=i, committed_offset=-1, metadata="", error_code=NOT_AVAILABLE
                )
                for i in t.partition_indexes
            ],
        )
        for t in body.topics or ()
    ]
    return cls(throttle_time_ms=0, topics=topics, error_code=NOT_AVAILABLE)
