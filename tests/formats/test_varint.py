"""Zig-zag varint/varlong: known encodings, boundaries, round trips, malformed input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.record.util import decode_varint as kp_decode_varint
from kafka.record.util import encode_varint as kp_encode_varint

from rlm.errors import CorruptRecordError, InvalidArgumentError
from rlm.formats.varint import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    decode_uvarint,
    decode_varint,
    decode_varlong,
    encode_uvarint,
    encode_varint,
    encode_varlong,
    size_of_varint,
)

# Values and encodings from the protobuf/Kafka zig-zag definition.
KNOWN = [
    (0, "00"),
    (-1, "01"),
    (1, "02"),
    (-2, "03"),
    (63, "7e"),
    (-64, "7f"),
    (64, "8001"),
    (-65, "8101"),
    (INT32_MAX, "feffffff0f"),
    (INT32_MIN, "ffffffff0f"),
]


@pytest.mark.parametrize(("value", "hexed"), KNOWN)
def test_known_varint_encodings(value: int, hexed: str) -> None:
    assert encode_varint(value).hex() == hexed
    assert decode_varint(bytes.fromhex(hexed), 0) == (value, len(hexed) // 2)


def test_varlong_extremes() -> None:
    assert encode_varlong(INT64_MAX).hex() == "fe" + "ff" * 8 + "01"
    assert encode_varlong(INT64_MIN).hex() == "ff" * 9 + "01"
    for v in (INT64_MIN, INT64_MAX, INT32_MIN - 1, INT32_MAX + 1):
        enc = encode_varlong(v)
        assert decode_varlong(enc, 0) == (v, len(enc))
        assert len(enc) == size_of_varint(v)


def test_decode_at_position_returns_next_position() -> None:
    buf = b"\xaa\xbb" + encode_varint(300) + encode_varint(-7)
    value, pos = decode_varint(buf, 2)
    assert value == 300
    assert decode_varint(buf, pos) == (-7, len(buf))


@pytest.mark.parametrize("fn", [decode_varint, decode_varlong])
def test_truncated_raises_with_position(fn: object) -> None:
    with pytest.raises(CorruptRecordError) as info:
        fn(b"\x00\x00\x80\x80", 2)  # type: ignore[operator]
    assert info.value.position == 2
    assert "truncated" in str(info.value)


def test_overlong_varint_raises() -> None:
    with pytest.raises(CorruptRecordError) as info:
        decode_varint(b"\x01" + b"\x80" * 5 + b"\x00", 1)
    assert info.value.position == 1
    assert "overlong" in str(info.value)
    # a varlong may use those 6 bytes
    assert decode_varlong(b"\x80" * 5 + b"\x00", 0) == (0, 6)
    with pytest.raises(CorruptRecordError):
        decode_varlong(b"\x80" * 10 + b"\x00", 0)


def test_out_of_range_encode() -> None:
    with pytest.raises(InvalidArgumentError):
        encode_varint(INT32_MAX + 1)
    with pytest.raises(InvalidArgumentError):
        encode_varint(INT32_MIN - 1)
    with pytest.raises(InvalidArgumentError):
        encode_varlong(INT64_MAX + 1)


def test_fifth_byte_high_bits_dropped_like_java() -> None:
    # Java's (b << 28) on an int drops bits above 32; a non-canonical 5th byte must not widen the value.
    assert decode_varint(bytes.fromhex("feffffff7f"), 0) == (INT32_MAX, 5)


@given(st.integers(INT32_MIN, INT32_MAX))
def test_varint_round_trip_and_kafka_python_agrees(value: int) -> None:
    enc = encode_varint(value)
    assert decode_varint(enc, 0) == (value, len(enc))
    assert decode_varlong(enc, 0) == (value, len(enc))  # same wire format for in-range values
    assert len(enc) == size_of_varint(value) <= 5
    kp = bytearray()
    kp_encode_varint(value, kp.append)
    assert bytes(kp) == enc
    assert kp_decode_varint(enc, 0) == (value, len(enc))


@given(st.integers(INT64_MIN, INT64_MAX), st.binary(max_size=4))
def test_varlong_round_trip_at_offset(value: int, prefix: bytes) -> None:
    enc = encode_varlong(value)
    assert decode_varlong(prefix + enc + b"\xff", len(prefix)) == (value, len(prefix) + len(enc))
    assert len(enc) <= 10


@given(st.integers(min_value=0, max_value=2**35 - 1))
def test_unsigned_varint_round_trip(value: int) -> None:
    data = encode_uvarint(value)
    assert decode_uvarint(data + b"\x7f", 0) == (value, len(data))


def test_unsigned_varint_truncated_and_overlong_name_the_start() -> None:
    with pytest.raises(CorruptRecordError, match="truncated unsigned varint") as truncated:
        decode_uvarint(b"\x00\x80\x80", 1)
    assert truncated.value.position == 1
    with pytest.raises(CorruptRecordError, match="overlong unsigned varint: more than 5 bytes"):
        decode_uvarint(b"\x80" * 6, 0)
