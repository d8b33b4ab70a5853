"""Valid encodings the mutators start from: rlm's own builders, LogWriter output and the real broker
fixtures (/work/shared/fixtures, when present)."""

from __future__ import annotations

import functools
import struct
import tempfile
from pathlib import Path

from rlm.formats.compression import Compression, compress
from rlm.formats.records import (
    ControlRecordType,
    Header,
    RecordSpec,
    TimestampType,
    build_batch,
    encode_control_key,
    encode_end_txn_marker,
)
from tests.conftest import locate_fixtures
from tests.formats.test_records import legacy_message

T0 = 1_700_000_000_000


def _specs(n: int) -> list[RecordSpec]:
    out = []
    for i in range(n):
        headers = (Header("h", b"v"), Header("nul", None)) if i % 2 else ()
        key = None if i % 3 == 0 else f"key-{i}".encode()
        value = None if i == 4 else bytes(range(i * 7 % 40))
        out.append(RecordSpec(T0 + i * 13 - (50 if i == 3 else 0), key, value, headers))
    return out


@functools.cache
def v2_seeds() -> dict[str, bytes]:
    """One small multi-record v2 batch per codec (snappy both framings), plus special batches."""
    seeds = {}
    for codec in Compression:
        seeds[f"v2-{codec.label}"] = build_batch(_specs(6), base_offset=100, compression=codec)
    seeds["v2-snappy-raw"] = build_batch(
        _specs(6), base_offset=5, compression=Compression.SNAPPY, snappy_xerial=False
    )
    seeds["v2-logappend-txn"] = build_batch(
        _specs(3),
        base_offset=7,
        compression=Compression.LZ4,
        timestamp_type=TimestampType.LOG_APPEND_TIME,
        log_append_time=T0,
        producer_id=42,
        producer_epoch=1,
        base_sequence=0,
        is_transactional=True,
    )
    marker = RecordSpec(T0, encode_control_key(ControlRecordType.COMMIT), encode_end_txn_marker(3))
    seeds["v2-control"] = build_batch(
        [marker], base_offset=10, is_control=True, is_transactional=True, producer_id=42, producer_epoch=1
    )
    seeds["v2-empty-compacted"] = build_batch([], base_offset=20, last_offset=25, max_timestamp=T0)
    return seeds


def _legacy_wrapper(magic: int, codec: Compression, base: int, n: int) -> bytes:
    # v1 inner offsets are relative (0..n-1), v0 absolute; the wrapper holds the last absolute one.
    inner = b"".join(
        legacy_message(i if magic == 1 else base + i, magic, f"k{i}".encode(), bytes(range(i * 5)), ts=T0 + i)
        for i in range(n)
    )
    return legacy_message(
        base + n - 1, magic, None, compress(codec, inner, xerial=True), attrs=int(codec), ts=T0
    )


@functools.cache
def legacy_seeds() -> dict[str, bytes]:
    """v0 and v1: plain messages and a compressed wrapper per legacy codec (gzip, snappy, lz4)."""
    seeds = {}
    for magic in (0, 1):
        plain = b"".join(
            legacy_message(30 + i, magic, b"k" if i else None, b"value" * i, ts=T0 + i) for i in range(3)
        )
        seeds[f"v{magic}-none"] = plain
        for codec in (Compression.GZIP, Compression.SNAPPY, Compression.LZ4):
            seeds[f"v{magic}-{codec.label}"] = _legacy_wrapper(magic, codec, 40, 4)
    return seeds


@functools.cache
def writer_segment() -> bytes:
    """A ``.log`` written by LogWriter: mixed codecs, several batches (tests.lookup.helpers)."""
    from tests.lookup.helpers import write_generated

    with tempfile.TemporaryDirectory() as tmp:
        write_generated(Path(tmp), "fuzz", 0, batches=12, seed=3, segment_bytes=1 << 30)
        (log,) = sorted((Path(tmp) / "fuzz-0").glob("*.log"))
        return log.read_bytes()


def fixture_files(suffix: str, *, max_bytes: int = 20_000, limit: int = 6) -> dict[str, bytes]:
    """Small real broker files ending in ``suffix`` (non-empty), by relative path; {} without fixtures."""
    root = locate_fixtures()
    if root is None:
        return {}
    found = {}
    for path in sorted((root / "kafka-logs").rglob(f"*{suffix}")):
        size = path.stat().st_size
        if path.is_file() and 0 < size <= max_bytes:
            found[str(path.relative_to(root))] = path.read_bytes()
        if len(found) >= limit:
            break
    return found


@functools.cache
def record_seeds() -> dict[str, bytes]:
    """Every record-batch seed: v2 per codec, v0/v1, a LogWriter segment and real broker segments."""
    seeds = {**v2_seeds(), **legacy_seeds(), "logwriter": writer_segment()}
    seeds["v2-multi"] = b"".join(v2_seeds()[k] for k in ("v2-gzip", "v2-control", "v2-zstd"))
    seeds.update(fixture_files(".log"))
    seeds.update(fixture_files(".checkpoint", max_bytes=40_000, limit=2))  # KRaft snapshots: batches
    return seeds


def v2_with(seed: bytes, **fields: int) -> bytes:
    """``seed`` (one v2 batch) with header fields overwritten (CRC not fixed: see harness.fix_crcs)."""
    layout = {
        "base_offset": (0, ">q"),
        "size": (8, ">i"),
        "epoch": (12, ">i"),
        "magic": (16, ">b"),
        "attributes": (21, ">h"),
        "last_delta": (23, ">i"),
        "base_ts": (27, ">q"),
        "max_ts": (35, ">q"),
        "count": (57, ">i"),
    }
    buf = bytearray(seed)
    for name, value in fields.items():
        pos, fmt = layout[name]
        struct.pack_into(fmt, buf, pos, value)
    return bytes(buf)
