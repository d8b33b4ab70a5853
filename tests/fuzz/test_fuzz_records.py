"""Fuzz the record-batch parser (v0, v1, v2; every codec) and the varint decoder.

Inputs: random bytes; mutations of valid encodings (rlm's builders, legacy messages, a LogWriter
segment, real broker segments and KRaft snapshots); header fields spliced with CRCs fixed so the
parser gets past the CRC check; record payloads mutated *inside* the compression and re-compressed.
"""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from rlm.formats.compression import Compression, compress, decompress
from rlm.formats.records import (
    V2_HEADER_SIZE,
    Buffer,
    decode_records,
    iter_batches,
    parse_control_record,
    valid_bytes,
)
from rlm.formats.varint import decode_varint, decode_varlong
from tests.fuzz.harness import INTERESTING, crc_fixed, expect_clean, fix_crcs, fuzz_settings, mutated
from tests.fuzz.seeds import legacy_seeds, record_seeds, v2_seeds, v2_with


def parse_log(buf: Buffer, verify_crc: bool = True) -> int:
    """Everything a reader does with a ``.log``: scan, decode every batch, read control keys."""
    records = 0
    for batch in iter_batches(buf, verify_crc=verify_crc):
        decoded = decode_records(buf, batch)
        records += len(decoded)
        if batch.is_control:
            for rec in decoded:
                parse_control_record(rec)
    valid_bytes(buf)
    return records


def test_seeds_parse_cleanly() -> None:
    # The mutators start from valid encodings: every seed must parse without an error.
    for name, seed in record_seeds().items():
        assert not isinstance(expect_clean(parse_log, seed), Exception), name


@fuzz_settings(2)
@given(st.binary(max_size=4096), st.booleans())
def test_random_bytes(data: bytes, verify_crc: bool) -> None:
    expect_clean(parse_log, data, verify_crc, located=True)


@fuzz_settings(3)
@given(
    st.sampled_from(sorted(record_seeds())).flatmap(
        lambda name: st.tuples(st.just(name), mutated(record_seeds()[name]) | crc_fixed(record_seeds()[name]))
    ),
    st.booleans(),
)
def test_mutated_valid_logs(case: tuple[str, bytes], verify_crc: bool) -> None:
    _, data = case
    expect_clean(parse_log, data, verify_crc, located=True)


_FIELDS = ("size", "count", "last_delta", "attributes", "magic", "base_offset", "base_ts", "max_ts", "epoch")


@fuzz_settings(2)
@given(
    st.sampled_from(sorted(v2_seeds())),
    st.sampled_from(_FIELDS),
    st.sampled_from(INTERESTING) | st.integers(-(2**15), 2**15),
)
def test_v2_header_fields_spliced(name: str, field: str, value: int) -> None:
    bounds = {"attributes": 2**15, "magic": 2**7}.get(field, 2**31)
    if field in ("base_offset", "base_ts", "max_ts"):
        bounds = 2**63
    value = max(-bounds, min(bounds - 1, value))
    data = fix_crcs(v2_with(v2_seeds()[name], **{field: value}))
    expect_clean(parse_log, data, located=True)


def _rebuild_v2(seed: bytes, payload: bytes) -> bytes:
    """``seed``'s header over a new (already compressed) payload: size fixed, CRC fixed."""
    out = bytearray(seed[:V2_HEADER_SIZE]) + payload
    struct.pack_into(">i", out, 8, len(out) - 12)
    return fix_crcs(bytes(out))


@st.composite
def v2_inner_mutations(draw: st.DrawFn) -> bytes:
    # Mutate the records section *before* compression: the codec is valid, the framing is not.
    name = draw(st.sampled_from(sorted(v2_seeds())))
    seed = v2_seeds()[name]
    codec = Compression(struct.unpack_from(">h", seed, 21)[0] & 7)
    records = decompress(codec, seed[V2_HEADER_SIZE:])
    return _rebuild_v2(seed, compress(codec, draw(mutated(records)), xerial="raw" not in name))


@fuzz_settings(3)
@given(v2_inner_mutations())
def test_v2_records_mutated_inside_the_compression(data: bytes) -> None:
    expect_clean(parse_log, data, located=True)


@st.composite
def legacy_inner_mutations(draw: st.DrawFn) -> bytes:
    from tests.formats.test_records import legacy_message

    name = draw(st.sampled_from([k for k in sorted(legacy_seeds()) if not k.endswith("none")]))
    seed = legacy_seeds()[name]
    magic = seed[16]
    codec = Compression(seed[17] & 7)
    (value_len,) = struct.unpack_from(">i", seed, 22 + (8 if magic == 1 else 0))
    inner = decompress(codec, seed[-value_len:], legacy_lz4=magic == 0)
    wrapped = compress(codec, draw(mutated(inner)), xerial=True)
    (offset,) = struct.unpack_from(">q", seed, 0)
    return legacy_message(offset, magic, None, wrapped, attrs=seed[17], ts=1)


@fuzz_settings(2)
@given(legacy_inner_mutations())
def test_legacy_wrappers_mutated_inside_the_compression(data: bytes) -> None:
    expect_clean(parse_log, data, located=True)


@fuzz_settings(2)
@given(st.binary(max_size=16), st.integers(0, 20))
def test_varints(data: bytes, pos: int) -> None:
    for fn in (decode_varint, decode_varlong):
        result = expect_clean(fn, data, pos, located=True)
        if isinstance(result, tuple):
            assert pos < result[1] <= len(data)
