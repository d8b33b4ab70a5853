"""Upper bounds on what a compressed block inflates to, read from its framing before decoding.

A batch of a few KiB can claim gigabytes once decompressed (a "decompression bomb"): a forged
snappy length preamble, a zstd frame of RLE blocks, an LZ4 frame of highly compressible blocks.
The decoders (cramjam) allocate whatever the data asks for, so :mod:`rlm.formats.compression`
computes these bounds first and refuses a block whose bound exceeds its limit (docs/fuzzing.md).
Each bound is exact for stored/raw/RLE blocks and the format's own per-block maximum for
compressed ones; a walk that does not fit the framing raises :class:`CompressionError` naming the
byte. Cost: a few struct reads per block (blocks are 64 KiB-4 MiB for LZ4, <= 128 KiB for zstd).

LZ4 frame (lz4_Frame_format.md): magic ``04 22 4D 18``, FLG (bit 3 content size, bit 0 dict id,
bit 4 block checksums, bit 2 content checksum), BD (bits 4-6: max block size 4=64 KiB .. 7=4 MiB),
[content size 8], [dict id 4], HC, blocks ``{size uint32 LE, bit 31 = stored}``, end mark 0,
[content checksum 4]. Skippable frames: magic ``0x184D2A50..5F``, size uint32 LE, data.

zstd frame (RFC 8878): magic ``28 B5 2F FD``, descriptor (bits 7-6 content-size field, bit 5
single segment, bit 3 reserved, bit 2 checksum, bits 1-0 dict id), [window descriptor], [dict id],
[content size], blocks ``{header 3 bytes LE: bit 0 last, bits 1-2 type (raw, RLE, compressed),
bits 3-23 size}``, [checksum 4]. A block regenerates at most min(window, 128 KiB) bytes.

Pure: bytes in, an int out.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from rlm.errors import CompressionError, CorruptRecordError
from rlm.formats.varint import decode_uvarint

__all__ = ["lz4_bound", "snappy_raw_length", "zstd_bound"]

_U32 = struct.Struct("<I")
_LZ4_MAGIC = 0x184D2204
_ZSTD_MAGIC = 0xFD2FB528
_SKIPPABLE_LOW, _SKIPPABLE_HIGH = 0x184D2A50, 0x184D2A5F
_LZ4_BLOCK_MAX = {4: 64 << 10, 5: 256 << 10, 6: 1 << 20, 7: 4 << 20}
_ZSTD_BLOCK_MAX = 128 << 10


def _need(data: memoryview, pos: int, n: int, codec: str, what: str) -> None:
    if pos + n > len(data):
        raise CompressionError(f"{codec}: truncated {what} at byte {pos}")


def _le(data: memoryview, pos: int, n: int) -> int:
    return int.from_bytes(data[pos : pos + n], "little")


def _skippable(data: memoryview, pos: int, codec: str) -> int:
    _need(data, pos, 8, codec, "skippable frame")
    end: int = pos + 8 + _U32.unpack_from(data, pos + 4)[0]
    _need(data, pos, end - pos, codec, "skippable frame")
    return end


def _lz4_frame(data: memoryview, pos: int) -> tuple[int, int]:
    """(bound of the frame at ``pos``, position after it)."""
    _need(data, pos, 7, "lz4", "frame descriptor")
    flg, bd = data[pos + 4], data[pos + 5]
    block_max = _LZ4_BLOCK_MAX.get((bd >> 4) & 7)
    if block_max is None:
        raise CompressionError(f"lz4: invalid block maximum size in frame descriptor at byte {pos + 5}")
    p = pos + 6 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0) + 1  # ... + HC
    bound = 0
    while True:
        _need(data, p, 4, "lz4", "block size")
        (word,) = _U32.unpack_from(data, p)
        p += 4
        if word == 0:
            break
        size = word & 0x7FFFFFFF
        if size > block_max:
            raise CompressionError(
                f"lz4: block of {size} bytes at byte {p - 4} exceeds the frame's "
                f"maximum block size {block_max}"
            )
        bound += size if word & 0x80000000 else block_max
        p += size + (4 if flg & 0x10 else 0)
        _need(data, p, 0, "lz4", "block")
    p += 4 if flg & 0x04 else 0
    _need(data, p, 0, "lz4", "content checksum")
    return bound, p


def _frames_bound(
    data: bytes | bytearray | memoryview,
    codec: str,
    magic_number: int,
    frame: Callable[[memoryview, int], tuple[int, int]],
) -> int:
    """Sum of ``frame``'s bound over the concatenated frames of ``data`` (skippable frames skipped)."""
    view, pos, total = memoryview(data), 0, 0
    while pos < len(view):
        _need(view, pos, 4, codec, "frame magic")
        (magic,) = _U32.unpack_from(view, pos)
        if _SKIPPABLE_LOW <= magic <= _SKIPPABLE_HIGH:
            pos = _skippable(view, pos, codec)
            continue
        if magic != magic_number:
            raise CompressionError(f"{codec}: not a {codec} frame (bad magic at byte {pos})")
        bound, pos = frame(view, pos)
        total += bound
    return total


def lz4_bound(data: bytes | bytearray | memoryview) -> int:
    """Bytes the LZ4 frames in ``data`` can inflate to at most (stored blocks exactly)."""
    return _frames_bound(data, "lz4", _LZ4_MAGIC, _lz4_frame)


def _zstd_header(data: memoryview, pos: int) -> tuple[int, int | None, bool, int]:
    """(block maximum, declared content size or None, has checksum, position of the first block)."""
    _need(data, pos, 6, "zstd", "frame header")
    fhd = data[pos + 4]
    if fhd & 0x08:
        raise CompressionError(f"zstd: reserved bit set in frame header at byte {pos + 4}")
    single = bool(fhd & 0x20)
    p = pos + 5
    window = 0
    if not single:
        wd = data[p]
        base = 1 << (10 + (wd >> 3))
        window = base + (base // 8) * (wd & 7)
        p += 1
    p += (0, 1, 2, 4)[fhd & 3]
    fcs_size = (1 if single else 0, 2, 4, 8)[fhd >> 6]
    _need(data, p, fcs_size, "zstd", "frame header")
    content: int | None = None
    if fcs_size:
        content = _le(data, p, fcs_size) + (256 if fcs_size == 2 else 0)
        p += fcs_size
    if single:
        window = content or 0
    return min(window, _ZSTD_BLOCK_MAX), content, bool(fhd & 0x04), p


def _zstd_frame(data: memoryview, pos: int) -> tuple[int, int]:
    block_max, content, checksum, p = _zstd_header(data, pos)
    bound = 0
    while True:
        _need(data, p, 3, "zstd", "block header")
        header = _le(data, p, 3)
        kind, size = (header >> 1) & 3, header >> 3
        if kind == 3:
            raise CompressionError(f"zstd: reserved block type at byte {p}")
        if kind in (0, 1) and size > max(block_max, 1):
            raise CompressionError(f"zstd: block of {size} bytes at byte {p} exceeds the maximum {block_max}")
        bound += block_max if kind == 2 else size
        p += 3 + (1 if kind == 1 else size)
        _need(data, p, 0, "zstd", "block")
        if header & 1:
            break
    p += 4 if checksum else 0
    _need(data, p, 0, "zstd", "checksum")
    if content is not None:
        if content > bound:
            raise CompressionError(
                f"zstd: frame at byte {pos} declares {content} bytes but its blocks hold at most {bound}"
            )
        bound = content
    return bound, p


def zstd_bound(data: bytes | bytearray | memoryview) -> int:
    """Bytes the zstd frames in ``data`` can inflate to at most (the declared content size if any)."""
    return _frames_bound(data, "zstd", _ZSTD_MAGIC, _zstd_frame)


def snappy_raw_length(block: bytes | bytearray | memoryview) -> int:
    """The uncompressed length a raw snappy block declares (its uvarint preamble, <= 2^32-1)."""
    try:
        value, _ = decode_uvarint(block, 0, 5, "snappy length preamble")
    except CorruptRecordError:
        raise CompressionError("snappy: invalid length preamble") from None
    if value >= 1 << 32:
        raise CompressionError("snappy: invalid length preamble")
    return value
