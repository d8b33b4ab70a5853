"""Kafka's wire framing and the APIs the listener serves (docs/kafka-listener.md, docs/formats.md §8).

A request frame is ``int32 size`` (big-endian: the byte count that follows, at most
``kafka.max_request_bytes``), then the request header — ``api_key int16``, ``api_version int16``,
``correlation_id int32``, ``client_id`` (int16-length nullable string), plus tagged fields when the
API version is *flexible* (header v2) — then the body. A response frame is ``int32 size``, then
``correlation_id int32`` (plus tagged fields when flexible, except ApiVersions whose response header
is always v0), then the body.

Bodies are encoded and decoded by kafka-python's ``kafka.protocol`` classes, which are generated
from Kafka's own JSON message schemas (every version, flexible ones included): the listener only
decides which versions it *answers exactly* (:data:`SERVED`) and fills the fields.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

from kafka.protocol.admin import (
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
)
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import (
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
)
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from rlm.errors import KafkaProtocolError
from rlm.formats.varint import decode_uvarint, encode_uvarint

__all__ = [
    "API_VERSIONS",
    "SERVED",
    "Api",
    "Codes",
    "Frame",
    "RequestFrame",
    "code_name",
    "encode_fetch_response",
    "encode_response",
    "kafka_code",
    "parse_request",
    "unsupported_api_versions",
]

_HEAD = struct.Struct(">hhi")  # api_key, api_version, correlation_id: the first 8 bytes of a header
_INT16 = struct.Struct(">h")
_RESPONSE_HEAD = struct.Struct(">ii")  # a response frame's size, then its header's correlation id
#: Besides arrays, the kinds a -1 length makes null (a UUID has no null: all zeros decodes as None).
_NULLABLE_KINDS = frozenset({"string", "bytes", "records"})


class Codes:
    """Kafka's error codes (``org.apache.kafka.common.protocol.Errors``) the listener answers."""

    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    UNKNOWN_TOPIC_OR_PARTITION = 3
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    UNSUPPORTED_VERSION = 35
    INVALID_REQUEST = 42
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    KAFKA_STORAGE_ERROR = 56
    SASL_AUTHENTICATION_FAILED = 58
    FETCH_SESSION_ID_NOT_FOUND = 70
    INVALID_FETCH_SESSION_EPOCH = 71
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    UNKNOWN_TOPIC_ID = 100
    FETCH_SESSION_TOPIC_ID_ERROR = 106


def kafka_code(name: str) -> int:
    """The error code Kafka names ``name`` (``OFFSET_OUT_OF_RANGE`` → 1); an unknown name is a bug
    (KeyError) that tests/ops/test_error_kinds.py catches for every class in rlm/errors.py."""
    code = vars(Codes)[name]
    assert isinstance(code, int)
    return code


def code_name(code: int) -> str:
    """Kafka's name of an error code (metric labels), e.g. ``OFFSET_OUT_OF_RANGE``."""
    return next((k for k, v in vars(Codes).items() if v == code and k.isupper()), str(code))


@dataclass(frozen=True, slots=True)
class Api:
    """One served API: its kafka-python classes and the versions answered exactly (inclusive)."""

    key: int
    request: Any
    response: Any
    min_version: int
    max_version: int

    @property
    def name(self) -> str:
        """Kafka's name of the API (``Fetch``, ``ListOffsets``, …)."""
        return str(self.request.__name__).removesuffix("Request")


# Versions: what each handler fills field by field (docs/kafka-listener.md "Versions"). Fetch 13+
# names topics by id (rlm/kafka/topic_ids.py); 15 moves the replica id into a tagged field a
# consumer leaves out; 16-17 add tagged fields for followers only. ListOffsets stops at 9 (-5
# latest tiered; 10+ add a timeout and -6). Metadata 12 may ask a topic by id; 13 adds a
# top-level error code (0 here).
SERVED: dict[int, Api] = {
    api.key: api
    for api in (
        Api(0, ProduceRequest, ProduceResponse, 3, 9),  # refused: read-only
        Api(1, FetchRequest, FetchResponse, 4, 17),
        Api(2, ListOffsetsRequest, ListOffsetsResponse, 1, 9),
        Api(3, MetadataRequest, MetadataResponse, 0, 13),
        Api(10, FindCoordinatorRequest, FindCoordinatorResponse, 0, 3),  # no groups: refused
        Api(11, JoinGroupRequest, JoinGroupResponse, 0, 5),
        Api(12, HeartbeatRequest, HeartbeatResponse, 0, 4),
        Api(13, LeaveGroupRequest, LeaveGroupResponse, 0, 4),
        Api(14, SyncGroupRequest, SyncGroupResponse, 0, 4),
        Api(17, SaslHandshakeRequest, SaslHandshakeResponse, 0, 1),
        Api(18, ApiVersionsRequest, ApiVersionsResponse, 0, 4),
        Api(21, DeleteRecordsRequest, DeleteRecordsResponse, 0, 2),  # SASL-authenticated only
        Api(22, InitProducerIdRequest, InitProducerIdResponse, 0, 4),  # refused: read-only
        Api(23, OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse, 2, 4),
        Api(32, DescribeConfigsRequest, DescribeConfigsResponse, 1, 4),
        Api(36, SaslAuthenticateRequest, SaslAuthenticateResponse, 0, 2),
    )
}

API_VERSIONS_KEY = 18
#: ``(api_key, min_version, max_version)`` as ApiVersions advertises them.
API_VERSIONS: list[tuple[int, int, int]] = [(a.key, a.min_version, a.max_version) for a in SERVED.values()]


@dataclass(frozen=True, slots=True)
class RequestFrame:
    """A decoded request: which API, its version, the correlation id to echo, the body."""

    api: Api
    version: int
    correlation_id: int
    client_id: str | None
    body: Any


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """``(api_key, api_version, correlation_id)`` of a request frame (without its size prefix)."""
    if len(frame) < _HEAD.size:
        raise KafkaProtocolError(f"request of {len(frame)} bytes is shorter than a request header")
    key, version, correlation_id = _HEAD.unpack_from(frame)
    return key, version, correlation_id


def parse_request(frame: bytes, served: dict[int, Api] | None = None) -> RequestFrame:
    """Decode one request frame (the bytes after the size prefix). An API key the listener does
    not serve, a version outside ``served`` (default :data:`SERVED`; a listener relaying groups
    passes its own table, rlm/kafka/coordinator.py) or bytes that do not decode raise
    :class:`KafkaProtocolError` naming the key and version (the caller closes the connection,
    except for ApiVersions: see :func:`unsupported_api_versions`)."""
    key, version, correlation_id = peek_header(frame)
    api = (SERVED if served is None else served).get(key)
    if api is None:
        raise KafkaProtocolError(
            f"api_key {key} (version {version}) is not served by this read-only listener"
        )
    if not api.min_version <= version <= api.max_version:
        raise KafkaProtocolError(
            f"api_key {key} version {version} is not served (versions {api.min_version}-{api.max_version})"
        )
    try:
        client_id, start = _client_id(frame, api.request.flexible_version_q(version))
        body = api.request.decode(memoryview(frame)[start:], version=version)
    except Exception as err:  # the library raises struct/Index/Value/Unicode errors on garbage
        raise KafkaProtocolError(
            f"api_key {key} version {version}: the request does not decode: {type(err).__name__}: {err}"
        ) from None
    null = _null_field(api.request._struct, body, version)
    if null is not None:
        raise KafkaProtocolError(f"api_key {key} version {version}: non-nullable field {null} is null")
    return RequestFrame(api, version, correlation_id, client_id, body)


def _client_id(frame: bytes, flexible: bool) -> tuple[str | None, int]:
    """A request header's client id and the position its body starts at: Kafka's RequestHeader
    v1 (``flexible``: v2, then tagged fields, which no API served reads). Decoded here, as the
    library reads it (a negative length is null, the string is strict UTF-8), because its header
    decoding — the frame copied into a BytesIO, then a field walk not compiled as bodies' are —
    was half of parsing a Fetch request. Raises on bytes that do not decode (the caller names them);
    the decoded body then has no ``header``: only this client id is ever read of it."""
    pos = _HEAD.size
    (length,) = _INT16.unpack_from(frame, pos)
    pos += 2
    client_id = None
    if length >= 0:
        if pos + length > len(frame):
            raise ValueError("Buffer underrun decoding string")
        client_id = str(frame[pos : pos + length], "utf-8")
        pos += length
    if flexible:
        count, pos = decode_uvarint(frame, pos, kind="tagged field count")
        for _ in range(count):
            _tag, pos = decode_uvarint(frame, pos, kind="tag")
            size, pos = decode_uvarint(frame, pos, kind="tagged field size")
            pos += size
    return client_id, pos


def _null_field(struct: Any, value: Any, version: int) -> str | None:
    """The first field of the decoded ``value`` that its schema says is not nullable at ``version``
    but the bytes made null (length -1), as ``name`` or ``array.name``; None when there is none.
    kafka-python decodes a -1 length as None whatever the schema; Kafka's broker refuses the
    request instead ("non-nullable field … was serialized as null"), and so does the listener:
    handlers may rely on every non-nullable field being there (a fuzzing finding, docs/fuzzing.md)."""
    for name, refused, inner, array in _checks(struct, version):
        got = getattr(value, name, None)
        if got is None:
            if refused:
                return name
            continue
        for item in (got if array else [got]) if inner is not None else ():
            found = _null_field(inner, item, version)
            if found is not None:
                return f"{name}.{found}"
    return None


#: Per (schema struct, version): what :func:`_null_field` checks of each field the version has —
#: ``(name, a null is refused, the inner struct or None, an array of them)``. The schema's answers,
#: asked once: walking them per request was a tenth of a Fetch's parse. Bounded by the schemas and
#: versions served (versions are checked before a body is decoded); the struct is kept so its id
#: is never another's.
_CHECKS: dict[tuple[int, int], tuple[Any, list[tuple[str, bool, Any, bool]]]] = {}


def _checks(struct: Any, version: int) -> list[tuple[str, bool, Any, bool]]:
    hit = _CHECKS.get((id(struct), version))
    if hit is not None and hit[0] is struct:
        return hit[1]
    out: list[tuple[str, bool, Any, bool]] = []
    for name, field in struct.fields.items():
        if not field.for_version_q(version) or field.tagged_field_q(version):
            continue
        # only length-prefixed kinds encode null (-1); a zero UUID also decodes as None
        kind = str(field._json.get("type", ""))
        refused = (kind.startswith("[]") or kind in _NULLABLE_KINDS) and not field.nullable_for_version_q(
            version
        )
        array = bool(field.is_struct_array())
        inner = field.array_of if array else field if field.is_struct() else None
        out.append((str(name), bool(refused), inner, array))
    _CHECKS[(id(struct), version)] = (struct, out)  # the same list whoever wrote it first
    return out


def encode_response(api: Api, version: int, correlation_id: int, body: Any) -> bytes | bytearray:
    """The framed response: size, header (flexible as the version says), body, in one buffer
    (record bytes copied into it; a Fetch answer goes out by :func:`encode_fetch_response`)."""
    body.API_VERSION = version
    encoded = body.encode()
    # Kafka's ResponseHeader v0 (the correlation id), v1 from the API's first flexible version on
    # (then no tagged fields: one 0 byte) — except ApiVersions' (always v0, KIP-511). Written here:
    # the library encodes a header by walking its schema uncompiled, a fifth of a Fetch answer's
    # encoding.
    tagged = api.key != API_VERSIONS_KEY and api.response.flexible_version_q(version)
    head = _RESPONSE_HEAD.size + (1 if tagged else 0)
    out = bytearray(head + len(encoded))
    _RESPONSE_HEAD.pack_into(out, 0, len(out) - 4, correlation_id)  # tagged: out[8] stays 0
    out[head:] = encoded
    return out


#: A framed response as the transport takes it: one buffer, or parts sent in order.
Frame = bytes | bytearray | tuple[bytes | bytearray | memoryview, ...]

_FETCH_FLEXIBLE = 12  # Kafka's FetchResponse.json, "flexibleVersions": "12+"
#: Stands in for a partition's records while the rest is encoded (followed by its 4-byte index):
#: 12 random bytes a process draws once, so no offset, name or id in a response holds it by chance.
_MARK = os.urandom(12)


def encode_fetch_response(api: Api, version: int, correlation_id: int, body: Any) -> Frame:
    """A Fetch response as parts: the encoded fields, and each partition's records as the read
    left them, so record bytes are never copied into a frame (encoding a 1 MiB answer in one
    buffer cost 5x a plain copy of it: 0.3 ms, two copies into fresh buffers). ``body``'s
    records are swapped for 16-byte stand-ins while its fields are encoded, then spliced back
    behind their real length. Answers without records are one buffer, as :func:`encode_response`
    makes them."""
    held: list[Any] = []
    for topic in body.responses:
        for p in topic.partitions:
            if p.records is not None and len(p.records):
                held.append((p, p.records))
                p.records = _MARK + len(held).to_bytes(4, "big")
    out = encode_response(api, version, correlation_id, body)
    if not held:
        return out
    parts: list[bytes | bytearray | memoryview] = []
    cursor = 0
    for n, (p, records) in enumerate(held, 1):
        p.records = records
        mark = _MARK + n.to_bytes(4, "big")
        head = _records_length(version, len(mark))
        at = out.find(mark, cursor)
        if at < cursor + len(head) or out[at - len(head) : at] != head:  # never seen: be safe
            for q, kept in held:
                q.records = kept
            return encode_response(api, version, correlation_id, body)
        # the fields before the records and their length go out as one small part: one send
        parts += [bytes(out[cursor : at - len(head)]) + _records_length(version, len(records)), records]
        cursor = at + len(mark)
    parts.append(out[cursor:])
    size = sum(len(part) for part in parts) - 4
    parts[0] = size.to_bytes(4, "big") + bytes(parts[0][4:])
    return tuple(parts)


def _records_length(version: int, size: int) -> bytes:
    """The length prefix of a records field: an unsigned varint of size + 1 in flexible versions
    (COMPACT_RECORDS), else an INT32."""
    return size.to_bytes(4, "big", signed=True) if version < _FETCH_FLEXIBLE else encode_uvarint(size + 1)


def unsupported_api_versions(correlation_id: int, served: dict[int, Api] | None = None) -> bytes | bytearray:
    """Kafka's answer to an ApiVersions request of a version it does not know: a **v0** response
    with UNSUPPORTED_VERSION and the served list (``served``, default :data:`SERVED`), so the
    client retries with a version in it."""
    body = api_versions_body(Codes.UNSUPPORTED_VERSION, served)
    return encode_response(SERVED[API_VERSIONS_KEY], 0, correlation_id, body)


def api_versions_body(error_code: int = Codes.NONE, served: dict[int, Api] | None = None) -> Any:
    """ApiVersions' answer: :data:`API_VERSIONS`, or the versions of ``served`` (a listener's own table)."""
    versions = (
        API_VERSIONS if served is None else [(a.key, a.min_version, a.max_version) for a in served.values()]
    )
    key = ApiVersionsResponse.ApiVersion
    return ApiVersionsResponse(
        error_code=error_code,
        throttle_time_ms=0,
        api_keys=[key(api_key=k, min_version=lo, max_version=hi) for k, lo, hi in versions],
    )
