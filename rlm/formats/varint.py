"""Zig-zag variable-length integers as used inside Kafka v2 records (protobuf encoding).

Layout: the zig-zag value ``(n << 1) ^ (n >> 63)`` (``>> 31`` for 32-bit) is written little-end
first, 7 bits per byte; the high bit (0x80) of a byte says "another byte follows". A ``varint``
(Kafka ``ByteUtils.readVarint``) holds a signed int32 in at most 5 bytes, a ``varlong``
(``readVarlong``) a signed int64 in at most 10 bytes. Examples: 0 → ``00``, -1 → ``01``,
1 → ``02``, 63 → ``7e``, -64 → ``7f``, 64 → ``80 01``.

Decoding mirrors Kafka: bits beyond 32/64 in the last allowed byte are dropped (Java's shift
semantics), a continuation bit on the last allowed byte is an overlong encoding and a buffer that
ends inside a varint is truncated; both raise :class:`~rlm.errors.CorruptRecordError` carrying the
position of the varint's first byte.
"""

from __future__ import annotations

from rlm.errors import CorruptRecordError, InvalidArgumentError

__all__ = [
    "INT32_MAX",
    "INT32_MIN",
    "INT64_MAX",
    "INT64_MIN",
    "decode_uvarint",
    "decode_varint",
    "decode_varlong",
    "encode_uvarint",
    "encode_varint",
    "encode_varlong",
    "size_of_varint",
]

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

_MASK32 = (1 << 32) - 1
_MASK64 = (1 << 64) - 1


def decode_uvarint(
    buf: bytes | bytearray | memoryview, pos: int, max_bytes: int = 5, kind: str = "unsigned varint"
) -> tuple[int, int]:
    """Decode an unsigned LEB128 varint (no zig-zag; Kafka's ``UNSIGNED_VARINT``) of at most
    ``max_bytes`` bytes at ``pos``; return ``(value, position after it)``. Truncated or overlong
    input → :class:`CorruptRecordError` with the start position."""
    return _decode(buf, pos, max_bytes, -1, kind, zigzag=False)


def _decode(
    buf: bytes | bytearray | memoryview,
    pos: int,
    max_bytes: int,
    mask: int,
    kind: str,
    *,
    zigzag: bool = True,
) -> tuple[int, int]:
    start = pos
    end = len(buf)
    result = 0
    shift = 0
    for _ in range(max_bytes):
        if pos >= end:
            raise CorruptRecordError(f"truncated {kind}: buffer ends inside it", position=start)
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            if not zigzag:
                return result, pos
            # Unsigned wire value; drop bits Java would shift out, then undo zig-zag.
            result &= mask
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
    raise CorruptRecordError(f"overlong {kind}: more than {max_bytes} bytes", position=start)


def decode_varint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """Decode a zig-zag varint (int32, ≤ 5 bytes) at ``pos``; return ``(value, position after it)``."""
    return _decode(buf, pos, 5, _MASK32, "varint")


def decode_varlong(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """Decode a zig-zag varlong (int64, ≤ 10 bytes) at ``pos``; return ``(value, position after it)``."""
    return _decode(buf, pos, 10, _MASK64, "varlong")


def encode_uvarint(v: int) -> bytes:
    """Encode a non-negative int as an unsigned LEB128 varint (no zig-zag): Kafka's ``UNSIGNED_VARINT``
    (compact lengths and tagged fields of flexible versions, the KRaft record frame)."""
    if v < 0:
        raise InvalidArgumentError(f"unsigned varint must not be negative: {v}")
    out = bytearray()
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def encode_varint(value: int) -> bytes:
    """Encode a signed int32 as a zig-zag varint; out of range → :class:`InvalidArgumentError`."""
    if not INT32_MIN <= value <= INT32_MAX:
        raise InvalidArgumentError(f"varint out of int32 range: {value}")
    return encode_uvarint(((value << 1) ^ (value >> 31)) & _MASK32)


def encode_varlong(value: int) -> bytes:
    """Encode a signed int64 as a zig-zag varlong; out of range → :class:`InvalidArgumentError`."""
    if not INT64_MIN <= value <= INT64_MAX:
        raise InvalidArgumentError(f"varlong out of int64 range: {value}")
    return encode_uvarint(((value << 1) ^ (value >> 63)) & _MASK64)


def size_of_varint(value: int) -> int:
    """Bytes :func:`encode_varint` / :func:`encode_varlong` would use for ``value``."""
    v = ((value << 1) ^ (value >> 63)) & _MASK64
    n = 1
    while v > 0x7F:
        v >>= 7
        n += 1
    return n
