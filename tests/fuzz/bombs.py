"""Decompression bombs: a few KiB/MiB of valid framing that inflate to gigabytes, one per codec.

Each is built structurally (no gigabyte is ever compressed here) and wrapped in a valid v2 batch,
so the tests exercise the path every reader takes (``decode_records``). ``python -m
tests.fuzz.bombs <name>`` decodes one bomb in a fresh interpreter and prints its peak RSS growth:
the memory property is measured in a process of its own, never assumed.
"""

from __future__ import annotations

import resource
import struct
import sys
import zlib

import cramjam

from rlm.formats.compression import Compression, xxh32
from rlm.formats.records import RecordSpec, build_batch

GIB = 1 << 30


def gzip_bomb(total: int = 2 * GIB) -> bytes:
    """Concatenated gzip members (read back-to-back like Java does) of 64 MiB of zeros each."""
    chunk = 64 << 20
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    member = b"".join(c.compress(zeros) for _ in range(chunk >> 20)) + c.flush()
    return member * (total // chunk)


def snappy_preamble_bomb(claimed: int = (1 << 32) - 1) -> bytes:
    """A raw snappy block whose length preamble claims ~4 GiB, followed by one literal."""
    out = bytearray()
    v = claimed
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out) + b"\x00x"  # literal tag of length 1


def xerial_bomb(blocks: int = 64) -> bytes:
    """snappy-java framing whose blocks each declare ~4 GiB."""
    header = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    block = snappy_preamble_bomb()
    return header + (struct.pack(">i", len(block)) + block) * blocks


def lz4_bomb(total: int = 2 * GIB) -> bytes:
    """An LZ4 frame (4 MiB max blocks, independent) of compressed all-zero 4 MiB blocks."""
    flg, bd = 0x60, 0x70
    block = bytes(cramjam.lz4.compress_block(bytes(4 << 20), store_size=False))
    head = b"\x04\x22\x4d\x18" + bytes((flg, bd, (xxh32(bytes((flg, bd))) >> 8) & 0xFF))
    body = (struct.pack("<I", len(block)) + block) * (total // (4 << 20))
    return head + body + b"\x00\x00\x00\x00"


def zstd_rle_bomb(total: int = 2 * GIB) -> bytes:
    """A zstd frame (no content size, 128 KiB window) of RLE blocks: 4 bytes per 128 KiB."""
    head = struct.pack("<I", 0xFD2FB528) + bytes((0x00, 0x38))  # descriptor 0; window 2^(10+7)
    n = total // (128 << 10)
    block = lambda last: ((128 << 10) << 3 | 1 << 1 | last).to_bytes(3, "little") + b"\x00"  # noqa: E731
    return head + block(0) * (n - 1) + block(1)


def zstd_content_size_bomb(claimed: int = 1 << 40) -> bytes:
    """A single-segment zstd frame declaring a 1 TiB content size, holding one tiny raw block."""
    head = struct.pack("<I", 0xFD2FB528) + bytes((0xE0,)) + struct.pack("<Q", claimed)
    return head + ((1 << 3) | 1).to_bytes(3, "little") + b"x"


BOMBS = {
    "gzip": (Compression.GZIP, gzip_bomb),
    "snappy": (Compression.SNAPPY, snappy_preamble_bomb),
    "snappy-xerial": (Compression.SNAPPY, xerial_bomb),
    "lz4": (Compression.LZ4, lz4_bomb),
    "zstd-rle": (Compression.ZSTD, zstd_rle_bomb),
    "zstd-content-size": (Compression.ZSTD, zstd_content_size_bomb),
}


def bomb_batch(name: str) -> bytes:
    """A valid v2 batch (CRC correct) whose records section is the bomb ``name``."""
    codec, make = BOMBS[name]
    honest = bytearray(build_batch([RecordSpec(0, None, b"v")], base_offset=0))
    payload = make()
    out = honest[:61] + payload
    struct.pack_into(">i", out, 8, len(out) - 12)
    struct.pack_into(">h", out, 21, int(codec))
    import crc32c

    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def _main(name: str) -> None:
    from rlm.errors import RlmError
    from rlm.formats.records import decode_records, iter_batches

    data = bomb_batch(name)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        for batch in iter_batches(data):
            decode_records(data, batch)
        outcome = "decoded"
    except RlmError as err:
        outcome = f"{type(err).__name__}: {err}"
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(f"{len(data)} {grown_kib} {outcome}")


if __name__ == "__main__":
    _main(sys.argv[1])
