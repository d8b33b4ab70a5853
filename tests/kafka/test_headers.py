"""The listener decodes a request's header itself (rlm/kafka/protocol.py ``_client_id``): the
client id and the body it finds are the library's for every header shape a client sends —
null, empty and non-ASCII client ids, flexible headers with tagged fields — and a header that does
not decode is refused, as the library refuses it. It writes a response's header itself too
(``encode_response``): the frames are the library's byte for byte."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from kafka.protocol.consumer import ListOffsetsRequest
from kafka.protocol.metadata import ApiVersionsRequest

from rlm.errors import KafkaProtocolError
from rlm.formats.varint import encode_uvarint
from rlm.kafka.protocol import SERVED, encode_response, parse_request
from rlm.testing.kafka_wire import fetch_request


def _frame(req: Any, version: int, client_id: str | None, tags: list[tuple[int, bytes]] | None) -> bytes:
    """``req`` encoded at ``version`` behind a header written by hand (``tags``: a flexible
    header's tagged fields; None: a v1 header)."""
    head = struct.pack(">hhi", req.API_KEY, version, 77)
    if client_id is None:
        head += struct.pack(">h", -1)
    else:
        raw = client_id.encode()
        head += struct.pack(">h", len(raw)) + raw
    if tags is not None:
        head += encode_uvarint(len(tags))
        for tag, data in tags:
            head += encode_uvarint(tag) + encode_uvarint(len(data)) + data
    return head + bytes(req.encode(version=version))


def _library(frame: bytes, version: int) -> Any:
    return SERVED[struct.unpack_from(">h", frame)[0]].request.decode(frame, version=version, header=True)


CASES = [
    (fetch_request([("t", 0, 5), ("t", 1, 9)]), 12, [(0, b"x"), (7, b"\x00" * 300)]),
    (fetch_request([("t", 0, 5)]), 11, None),
    (ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[]), 9, []),
    (ApiVersionsRequest(client_software_name="c", client_software_version="1"), 3, [(1, b"")]),
    (ApiVersionsRequest(), 0, None),
]


@pytest.mark.parametrize("client_id", [None, "", "rdkafka", "ünïcødé-客户"])
@pytest.mark.parametrize(("req", "version", "tags"), CASES)
def test_the_header_decodes_as_the_library_decodes_it(
    req: Any, version: int, tags: list[tuple[int, bytes]] | None, client_id: str | None
) -> None:
    frame = _frame(req, version, client_id, tags)
    parsed, expected = parse_request(frame), _library(frame, version)
    assert parsed.client_id == expected.header.client_id == client_id
    assert parsed.correlation_id == 77 and parsed.version == version
    assert parsed.body.to_dict() == expected.to_dict()


@pytest.mark.parametrize(
    "cut",
    [
        lambda f: f[:9],  # inside the client id's length
        lambda f: f[:8] + struct.pack(">h", 200) + f[10:12],  # the client id runs past the frame
        lambda f: f[:8] + struct.pack(">h", 2) + b"\xff\xfe" + f[10:],  # not UTF-8
        lambda f: f[:15] + b"\xff\xff\xff\xff\xff\xff",  # an overlong tag count (client id "rlmxx")
    ],
)
def test_a_header_that_does_not_decode_is_refused(cut: Any) -> None:
    frame = _frame(fetch_request([("t", 0, 5)]), 12, "rlmxx", [])
    with pytest.raises(KafkaProtocolError, match="does not decode"):
        parse_request(cut(frame))


@pytest.mark.parametrize("api", SERVED.values(), ids=lambda a: a.name)
def test_responses_are_framed_as_the_library_frames_them(api: Any) -> None:
    """The response header too is written by the listener (``encode_response``): byte for byte the
    library's, for every API and version served — ApiVersions' header is v0 even when flexible."""
    for version in range(api.min_version, api.max_version + 1):
        expected = api.response()
        expected.API_VERSION = version
        expected.with_header(correlation_id=-7)
        assert bytes(encode_response(api, version, -7, api.response())) == bytes(
            expected.encode(header=True, framed=True)
        ), version
