"""Kafka's compression codecs: what producers write inside batches, and how to read it back.

The codec id lives in the low 3 bits of a batch's attributes (v2: int16 @21; v0/v1: int8 @17):
0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd. The whole records section (v2) or the wrapper value
(v0/v1) is one compressed stream.

Wire formats accepted by :func:`decompress`:

* **gzip** — RFC 1952 (Java ``GZIPOutputStream``); concatenated members are read like Java does.
* **snappy** — either a raw snappy block (librdkafka, KafkaJS) or snappy-java's *xerial* framing
  (every Java producer)::

      0  magic   8 bytes  82 'S' 'N' 'A' 'P' 'P' 'Y' 00
      8  version int32    (1)
      12 compat  int32    (1)
      16 blocks  { length int32 big-endian, raw snappy block of that length }*

* **lz4** — the LZ4 frame format (KIP-57; Java ``KafkaLZ4BlockOutputStream``): magic
  ``04 22 4D 18`` (little-endian 0x184D2204), FLG, BD, [content size 8], [dict id 4], HC, then
  blocks ``{size uint32 LE (bit 31 = stored uncompressed), data, [checksum 4]}``, end mark
  ``00000000``, [content checksum 4]. HC is byte 1 of xxHash32 over FLG..(before HC). Kafka before
  0.10 (magic 0 messages) hashed from the magic instead, so its HC is wrong: ``legacy_lz4=True``
  ignores HC, like Kafka's ``KafkaLZ4BlockInputStream(ignoreFlagDescriptorChecksum=true)``.
* **zstd** — zstd frames; frames without a content size (streaming writers, Java ``ZstdOutputStream``)
  are decoded by streaming.

Every failure surfaces as :class:`~rlm.errors.CompressionError`. Output is bounded: a block that
would inflate past ``max_size`` (default :data:`MAX_DECOMPRESSED_BYTES`) is refused before the
memory is allocated — gzip is inflated incrementally up to the limit, snappy's length preamble and
the LZ4/zstd framing give an upper bound up front (:mod:`rlm.formats.inflate_bounds`,
docs/fuzzing.md). Codecs come from ``cramjam``
(snappy, lz4, zstd; verified for raw snappy, lz4 frames with linked/independent blocks and zstd
frames without content size) and ``zlib`` (gzip).
"""

from __future__ import annotations

import enum
import struct
import zlib

import cramjam

from rlm.errors import CompressionError
from rlm.formats.inflate_bounds import lz4_bound, snappy_raw_length, zstd_bound

__all__ = ["MAX_DECOMPRESSED_BYTES", "XERIAL_MAGIC", "Compression", "compress", "decompress", "xxh32"]

#: Largest decompressed size of one compressed block (a v2 batch's records, a v0/v1 wrapper's
#: value) rlm accepts, in bytes. Kafka's own limit is on the compressed batch (message.max.bytes,
#: 1 MiB by default); 256 MiB leaves real batches two orders of magnitude of headroom while a
#: "decompression bomb" (KiB that claim GiB) is refused instead of exhausting memory.
MAX_DECOMPRESSED_BYTES = 256 << 20

XERIAL_MAGIC = b"\x82SNAPPY\x00"
#: snappy-java's ``SnappyOutputStream`` default block size (what Java producers emit).
XERIAL_BLOCK_SIZE = 32 * 1024
_XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)

_LZ4_MAGIC = b"\x04\x22\x4d\x18"
#: Kafka's LZ4 writer: version 01, independent blocks, no checksums, no content size; 64 KiB blocks.
_LZ4_FLG = 0x60
_LZ4_BD = 0x40
_LZ4_BLOCK_SIZE = 64 * 1024


class Compression(enum.IntEnum):
    """Codec ids of Kafka's batch attributes (bits 0-2)."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @property
    def label(self) -> str:
        """Kafka's ``compression.type`` name: ``none|gzip|snappy|lz4|zstd``."""
        return self.name.lower()

    @classmethod
    def from_label(cls, label: str) -> Compression:
        """Inverse of :attr:`label` (case-insensitive); unknown → :class:`CompressionError`."""
        try:
            return cls[label.strip().upper()]
        except KeyError:
            raise CompressionError(f"unknown compression type {label!r}") from None

    @classmethod
    def from_id(cls, codec_id: int) -> Compression:
        """Codec for the attribute bits; ids 5-7 are unknown → :class:`CompressionError`."""
        try:
            return cls(codec_id)
        except ValueError:
            raise CompressionError(f"unknown compression codec id {codec_id}") from None


# --- xxHash32 (only needed for the 2-14 byte LZ4 frame descriptor, so pure Python is plenty) ---
_P1, _P2, _P3, _P4, _P5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def xxh32(data: bytes | bytearray | memoryview, seed: int = 0) -> int:
    """xxHash32 of ``data`` (reference algorithm), used for LZ4 frame header checksums."""
    data = bytes(data)
    n = len(data)
    i = 0
    if n >= 16:
        v = [(seed + _P1 + _P2) & _M32, (seed + _P2) & _M32, seed & _M32, (seed - _P1) & _M32]
        while i + 16 <= n:
            for lane in range(4):
                (word,) = struct.unpack_from("<I", data, i + 4 * lane)
                v[lane] = (_rotl((v[lane] + word * _P2) & _M32, 13) * _P1) & _M32
            i += 16
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M32
    else:
        h = (seed + _P5) & _M32
    h = (h + n) & _M32
    while i + 4 <= n:
        (word,) = struct.unpack_from("<I", data, i)
        h = (_rotl((h + word * _P3) & _M32, 17) * _P4) & _M32
        i += 4
    while i < n:
        h = (_rotl((h + data[i] * _P5) & _M32, 11) * _P1) & _M32
        i += 1
    h ^= h >> 15
    h = (h * _P2) & _M32
    h ^= h >> 13
    h = (h * _P3) & _M32
    h ^= h >> 16
    return h


def _lz4_descriptor_end(frame: bytes | bytearray | memoryview) -> int:
    """Index of the HC byte of an LZ4 frame (descriptor is FLG, BD and the optional fields)."""
    if len(frame) < 7 or bytes(frame[:4]) != _LZ4_MAGIC:
        raise CompressionError("lz4: not an LZ4 frame (bad magic)")
    flg = frame[4]
    end = 6
    if flg & 0x08:  # content size present
        end += 8
    if flg & 0x01:  # dictionary id present
        end += 4
    if len(frame) <= end:
        raise CompressionError("lz4: truncated frame descriptor")
    return end


def _too_large(codec: str, size: int, max_size: int) -> CompressionError:
    return CompressionError(
        f"{codec}: decompresses to {size} bytes or more, over the limit of {max_size} bytes "
        "(a corrupt or hostile batch)"
    )


def _decompress_lz4(data: bytes | bytearray | memoryview, legacy: bool, max_size: int) -> bytes:
    bound = lz4_bound(data)
    if bound > max_size:
        raise _too_large("lz4", bound, max_size)
    if legacy:
        # Patch the header checksum to the correct one so the standard decoder accepts the frame:
        # the same effect as Kafka skipping the check for pre-KIP-57 frames.
        hc = _lz4_descriptor_end(data)
        patched = bytearray(data)
        patched[hc] = (xxh32(patched[4:hc]) >> 8) & 0xFF
        data = patched
    return bytes(cramjam.lz4.decompress(data))


def _snappy_block(block: bytes | bytearray | memoryview, budget: int, max_size: int) -> bytes:
    # The decoder allocates the length the preamble declares: check it against what is left.
    declared = snappy_raw_length(block)
    if declared > budget:
        raise _too_large("snappy", max_size - budget + declared, max_size)
    return bytes(cramjam.snappy.decompress_raw(block))


def _decompress_snappy(data: bytes | bytearray | memoryview, max_size: int) -> bytes:
    if bytes(data[:8]) != XERIAL_MAGIC:
        return _snappy_block(data, max_size, max_size)
    view = memoryview(data)
    if len(view) < 16:
        raise CompressionError("snappy: truncated xerial header")
    out = bytearray()
    pos = 16  # magic + version + compat; the versions are informational only
    while pos < len(view):
        if pos + 4 > len(view):
            raise CompressionError(f"snappy: truncated xerial block length at {pos}")
        (length,) = struct.unpack_from(">i", view, pos)
        pos += 4
        if length < 0 or pos + length > len(view):
            raise CompressionError(f"snappy: xerial block length {length} at {pos - 4} runs past the end")
        out += _snappy_block(view[pos : pos + length], max_size - len(out), max_size)
        pos += length
    return bytes(out)


def _decompress_gzip(data: bytes | bytearray | memoryview, max_size: int) -> bytes:
    out = bytearray()
    rest = bytes(data)
    while True:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)  # 16+: gzip container only, like GZIPInputStream
        # At most one byte past the limit is inflated: enough to know the limit is exceeded.
        out += d.decompress(rest, max_size - len(out) + 1)
        if len(out) > max_size:
            raise _too_large("gzip", len(out), max_size)
        if not d.eof:
            raise CompressionError("gzip: truncated stream")
        rest = d.unused_data
        if not rest:
            return bytes(out)


def _decompress_zstd(data: bytes | bytearray | memoryview, max_size: int) -> bytes:
    bound = zstd_bound(data)
    if bound > max_size:
        raise _too_large("zstd", bound, max_size)
    # cramjam streams frames without a content size (verified), so no size hint is needed.
    return bytes(cramjam.zstd.decompress(data))


def decompress(
    codec: Compression,
    data: bytes | bytearray | memoryview,
    *,
    legacy_lz4: bool = False,
    max_size: int = MAX_DECOMPRESSED_BYTES,
) -> bytes:
    """Decompress one Kafka compressed block (see module docstring for accepted framings).

    ``legacy_lz4`` (magic 0/1 messages) ignores the LZ4 frame header checksum. ``NONE`` returns
    the bytes unchanged. Output larger than ``max_size`` bytes, or framing that could inflate
    past it, is refused before it is allocated. Any failure → :class:`CompressionError`.
    """
    try:
        if codec == Compression.NONE:
            return bytes(data)
        if codec == Compression.GZIP:
            return _decompress_gzip(data, max_size)
        if codec == Compression.SNAPPY:
            return _decompress_snappy(data, max_size)
        if codec == Compression.LZ4:
            return _decompress_lz4(data, legacy_lz4, max_size)
        if codec == Compression.ZSTD:
            return _decompress_zstd(data, max_size)
    except CompressionError:
        raise
    except (zlib.error, cramjam.DecompressionError, ValueError, TypeError, struct.error) as exc:
        raise CompressionError(f"{Compression(codec).label}: cannot decompress: {exc}") from exc
    raise CompressionError(f"unknown compression codec {codec!r}")


def _compress_lz4_kafka(data: bytes) -> bytes:
    # Hand-framed so the output is exactly what Java's KafkaLZ4BlockOutputStream emits: independent
    # 64 KiB blocks, no block/content checksums, no content size, a correct (KIP-57) HC.
    out = bytearray(_LZ4_MAGIC)
    out += bytes((_LZ4_FLG, _LZ4_BD))
    out.append((xxh32(bytes((_LZ4_FLG, _LZ4_BD))) >> 8) & 0xFF)
    view = memoryview(data)
    for start in range(0, len(view), _LZ4_BLOCK_SIZE):
        chunk = view[start : start + _LZ4_BLOCK_SIZE]
        block = bytes(cramjam.lz4.compress_block(chunk, store_size=False))
        if len(block) < len(chunk):
            out += struct.pack("<I", len(block))
            out += block
        else:  # incompressible: store it, flagged by the high bit of the size
            out += struct.pack("<I", len(chunk) | 0x80000000)
            out += chunk
    out += b"\x00\x00\x00\x00"  # end mark
    return bytes(out)


def _compress_snappy_xerial(data: bytes) -> bytes:
    out = bytearray(_XERIAL_HEADER)
    view = memoryview(data)
    for start in range(0, len(view), XERIAL_BLOCK_SIZE):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + XERIAL_BLOCK_SIZE]))
        out += struct.pack(">i", len(block))
        out += block
    return bytes(out)


def compress(codec: Compression, data: bytes | bytearray | memoryview, *, xerial: bool = False) -> bytes:
    """Compress ``data`` the way a Kafka producer does for ``codec``.

    ``xerial`` (snappy only) selects snappy-java's framing, which Java producers write; the
    default is a raw snappy block (librdkafka). lz4 uses Kafka's frame settings (see
    ``_compress_lz4_kafka``); zstd uses level 3 (Kafka's default); gzip uses level 6 (Java default).
    """
    raw = bytes(data)
    try:
        if codec == Compression.NONE:
            return raw
        if codec == Compression.GZIP:
            c = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
            return c.compress(raw) + c.flush()
        if codec == Compression.SNAPPY:
            return _compress_snappy_xerial(raw) if xerial else bytes(cramjam.snappy.compress_raw(raw))
        if codec == Compression.LZ4:
            return _compress_lz4_kafka(raw)
        if codec == Compression.ZSTD:
            return bytes(cramjam.zstd.compress(raw, level=3))
    except cramjam.CompressionError as exc:
        raise CompressionError(f"{Compression(codec).label}: cannot compress: {exc}") from exc
    raise CompressionError(f"unknown compression codec {codec!r}")
