"""Codecs: rlm's decompress reads what independent encoders write, and vice versa."""

from __future__ import annotations

import gzip
import os
import struct

import lz4.frame
import pytest
import snappy
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import codec as kp_codec

from rlm.errors import CompressionError
from rlm.formats.compression import XERIAL_MAGIC, Compression, compress, decompress, xxh32

# Mixed compressible / incompressible data, > 64 KiB so lz4 and xerial use several blocks.
PAYLOAD = (b"kafka record payload " * 5000) + os.urandom(70_000) + b"\x00" * 50_000


def test_labels_and_ids() -> None:
    assert [c.label for c in Compression] == ["none", "gzip", "snappy", "lz4", "zstd"]
    assert [int(c) for c in Compression] == [0, 1, 2, 3, 4]
    assert Compression.from_label("Snappy") is Compression.SNAPPY
    with pytest.raises(CompressionError):
        Compression.from_label("brotli")
    with pytest.raises(CompressionError):
        Compression.from_id(5)


@pytest.mark.parametrize("codec", list(Compression))
@pytest.mark.parametrize("xerial", [False, True])
def test_round_trip(codec: Compression, xerial: bool) -> None:
    blob = compress(codec, PAYLOAD, xerial=xerial)
    if codec is not Compression.NONE:
        assert blob != PAYLOAD
    assert decompress(codec, blob) == PAYLOAD
    assert decompress(codec, memoryview(blob)) == PAYLOAD


def test_empty_payload_round_trip() -> None:
    for codec in Compression:
        assert decompress(codec, compress(codec, b"")) == b""


# --- independent encoders → rlm ---------------------------------------------------------------


def test_gzip_from_stdlib_and_concatenated_members() -> None:
    assert decompress(Compression.GZIP, gzip.compress(PAYLOAD)) == PAYLOAD
    two = gzip.compress(b"first-") + gzip.compress(b"second")
    assert decompress(Compression.GZIP, two) == b"first-second"


def test_snappy_raw_and_xerial_from_python_snappy() -> None:
    assert decompress(Compression.SNAPPY, snappy.compress(PAYLOAD)) == PAYLOAD
    xerial = kp_codec.snappy_encode(PAYLOAD, xerial_compatible=True)
    assert xerial.startswith(XERIAL_MAGIC)
    assert decompress(Compression.SNAPPY, xerial) == PAYLOAD


@pytest.mark.parametrize("linked", [True, False])
@pytest.mark.parametrize("checksums", [True, False])
@pytest.mark.parametrize("store_size", [True, False])
def test_lz4_frames_from_lz4_library(linked: bool, checksums: bool, store_size: bool) -> None:
    frame = lz4.frame.compress(
        PAYLOAD,
        block_linked=linked,
        content_checksum=checksums,
        block_checksum=checksums,
        store_size=store_size,
    )
    assert decompress(Compression.LZ4, frame) == PAYLOAD


def _break_header_checksum(frame: bytes) -> bytes:
    """Rewrite HC the way Kafka 0.8/0.9 computed it: over magic+descriptor instead of descriptor."""
    hc_at = 6 + (8 if frame[4] & 0x08 else 0)
    broken = (xxh32(frame[0:hc_at]) >> 8) & 0xFF
    assert broken != frame[hc_at]  # otherwise the test would prove nothing
    return frame[:hc_at] + bytes([broken]) + frame[hc_at + 1 :]


def test_lz4_legacy_broken_header_checksum() -> None:
    frame = _break_header_checksum(lz4.frame.compress(PAYLOAD, store_size=False))
    assert decompress(Compression.LZ4, frame, legacy_lz4=True) == PAYLOAD
    with pytest.raises(CompressionError):
        decompress(Compression.LZ4, frame)  # magic 2 data must have a correct checksum


def test_xxh32_matches_liblz4_header_checksums() -> None:
    # liblz4 writes HC = second byte of xxh32(descriptor); check several descriptor shapes.
    for kwargs in ({}, {"store_size": False}, {"block_linked": False, "content_checksum": True}):
        frame = lz4.frame.compress(b"x" * 100, **kwargs)  # type: ignore[arg-type]
        hc_at = 6 + (8 if frame[4] & 0x08 else 0)
        assert frame[hc_at] == (xxh32(frame[4:hc_at]) >> 8) & 0xFF
    # reference vectors of xxHash32 (seed 0)
    assert xxh32(b"") == 0x02CC5D05
    assert xxh32(b"a") == 0x550D7456
    assert xxh32(b"Nobody inspects the spammish repetition") == 0xE2293B2F


def test_zstd_without_content_size() -> None:
    streamed = zstandard.ZstdCompressor(write_content_size=False).compress(PAYLOAD)
    assert decompress(Compression.ZSTD, streamed) == PAYLOAD
    cobj = zstandard.ZstdCompressor().compressobj()
    chunked = cobj.compress(PAYLOAD[:1000]) + cobj.compress(PAYLOAD[1000:]) + cobj.flush()
    assert decompress(Compression.ZSTD, chunked) == PAYLOAD


# --- rlm → independent decoders ---------------------------------------------------------------


def test_rlm_output_read_by_independent_decoders() -> None:
    assert gzip.decompress(compress(Compression.GZIP, PAYLOAD)) == PAYLOAD
    assert snappy.decompress(compress(Compression.SNAPPY, PAYLOAD)) == PAYLOAD
    assert kp_codec.snappy_decode(compress(Compression.SNAPPY, PAYLOAD, xerial=True)) == PAYLOAD
    assert lz4.frame.decompress(compress(Compression.LZ4, PAYLOAD)) == PAYLOAD
    assert (
        zstandard.ZstdDecompressor().decompressobj().decompress(compress(Compression.ZSTD, PAYLOAD))
        == PAYLOAD
    )


def test_lz4_output_uses_kafka_frame_settings() -> None:
    frame = compress(Compression.LZ4, PAYLOAD)
    assert frame[:4] == b"\x04\x22\x4d\x18"
    assert frame[4] == 0x60  # version 01, independent blocks, no checksums, no content size
    assert frame[5] == 0x40  # 64 KiB max block
    assert frame.endswith(b"\x00\x00\x00\x00")  # end mark, no content checksum


def test_xerial_output_layout() -> None:
    blob = compress(Compression.SNAPPY, PAYLOAD, xerial=True)
    assert blob[:16] == XERIAL_MAGIC + struct.pack(">ii", 1, 1)
    (first_block,) = struct.unpack_from(">i", blob, 16)
    assert snappy.uncompress(blob[20 : 20 + first_block]) == PAYLOAD[: 32 * 1024]


# --- garbage ----------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", [c for c in Compression if c is not Compression.NONE])
@pytest.mark.parametrize(
    "garbage",
    [
        b"this is not compressed data at all",
        b"\xff" * 64,
        XERIAL_MAGIC + b"\x00\x00\x00\x01" * 2 + b"\x7f\xff\xff\xff",
    ],
    ids=["text", "ff", "bad-xerial"],
)
def test_garbage_raises_compression_error(codec: Compression, garbage: bytes) -> None:
    with pytest.raises(CompressionError) as info:
        decompress(codec, garbage)
    assert codec.label in str(info.value)


def test_truncated_streams_raise() -> None:
    for codec in (Compression.GZIP, Compression.LZ4, Compression.ZSTD):
        blob = compress(codec, PAYLOAD)
        with pytest.raises(CompressionError):
            decompress(codec, blob[: len(blob) // 2])


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=3000), st.sampled_from(list(Compression)), st.booleans())
def test_round_trip_property(data: bytes, codec: Compression, xerial: bool) -> None:
    assert decompress(codec, compress(codec, data, xerial=xerial)) == data
