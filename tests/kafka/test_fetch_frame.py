"""A Fetch response goes out as parts, its records as the read left them (rlm/kafka/protocol.py
``encode_fetch_response``): the bytes a client receives are exactly the single-buffer encoding's,
at every Fetch version the listener serves, whatever mix of partitions with and without records
and aborted transactions — and the records themselves are never copied into a frame.

The live catch-ups (tests/kafka/test_clients.py and the others of this package) read these frames
with librdkafka, kafka-python and aiokafka; this holds the splice to the encoder byte for byte.
"""

from __future__ import annotations

import os

import pytest
from kafka.protocol.consumer import FetchResponse

from rlm.kafka.fetching import _partition_data
from rlm.kafka.protocol import SERVED, encode_fetch_response, encode_response
from rlm.kafka.reads import FetchedPartition

FETCH = SERVED[1]
TOPIC = FetchResponse.FetchableTopicResponse


def _body(records: list[bytes | memoryview], *, aborted_at: int = 1) -> object:
    parts = [
        _partition_data(i, FetchedPartition(0, 1000 + i, 900, 0, r, [(5, 7)] if i == aborted_at else None))
        for i, r in enumerate(records)
    ]
    return FetchResponse(
        throttle_time_ms=0,
        error_code=0,
        session_id=3,
        responses=[
            TOPIC(topic="orders", topic_id=None, partitions=parts[:2]),
            TOPIC(topic="o", topic_id=None, partitions=parts[2:]),
        ],
    )


RECORDS: list[bytes | memoryview] = [
    os.urandom(1 << 20),
    b"",
    memoryview(os.urandom(300)),
    os.urandom(70_000),  # its varint length takes three bytes
    os.urandom(16),  # as long as the stand-in
]


@pytest.mark.parametrize("version", range(FETCH.min_version, FETCH.max_version + 1))
def test_the_parts_are_the_single_buffer_bytes(version: int) -> None:
    whole = bytes(encode_response(FETCH, version, 7, _body(RECORDS)))
    frame = encode_fetch_response(FETCH, version, 7, _body(RECORDS))
    assert isinstance(frame, tuple)
    assert b"".join(bytes(part) for part in frame) == whole
    decoded = FetchResponse.decode(whole[4:], version=version, header=True)
    got = [bytes(p.records or b"") for t in decoded.responses for p in t.partitions]
    assert got == [bytes(r) for r in RECORDS]


def test_the_records_go_out_as_read() -> None:
    frame = encode_fetch_response(FETCH, 12, 7, _body(RECORDS))
    assert isinstance(frame, tuple)
    for records in RECORDS:
        if len(records):
            assert any(part is records for part in frame), "copied into the frame"


def test_each_records_length_goes_out_with_the_fields_before_it() -> None:
    frame = encode_fetch_response(FETCH, 12, 7, _body(RECORDS))
    assert isinstance(frame, tuple)
    filled = [r for r in RECORDS if len(r)]
    assert len(frame) == 2 * len(filled) + 1  # fields + length, records, ..., the fields after
    assert list(frame[1::2]) == filled


def test_an_answer_without_records_is_one_buffer() -> None:
    frame = encode_fetch_response(FETCH, 12, 7, _body([b"", b""]))
    assert frame == encode_response(FETCH, 12, 7, _body([b"", b""]))
