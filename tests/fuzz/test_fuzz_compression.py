"""Fuzz the codecs directly: random and mutated compressed blocks, with random output limits.

Beyond "only CompressionError", the property checks the memory bound: whatever ``decompress``
returns is never larger than the ``max_size`` it was given.
"""

from __future__ import annotations

import functools

from hypothesis import given
from hypothesis import strategies as st

from rlm.formats.compression import Compression, compress, decompress
from rlm.formats.inflate_bounds import lz4_bound, snappy_raw_length, zstd_bound
from tests.fuzz.harness import expect_clean, fuzz_settings, mutated

_PAYLOAD = b"".join(b"record-%d-" % i + bytes(range(i % 50)) for i in range(400))


@functools.cache
def frames() -> dict[tuple[Compression, bool], bytes]:
    out = {}
    for codec in Compression:
        for xerial in (False, True) if codec is Compression.SNAPPY else (False,):
            out[(codec, xerial)] = compress(codec, _PAYLOAD, xerial=xerial)
    return out


def _check(codec: Compression, data: bytes, max_size: int, legacy: bool) -> None:
    result = expect_clean(decompress, codec, data, max_size=max_size, legacy_lz4=legacy)
    if isinstance(result, bytes):
        # NONE inflates nothing: the bytes are the batch's own, already bounded by its size.
        assert result == data if codec is Compression.NONE else len(result) <= max_size


_LIMITS = st.sampled_from((0, 1, 100, len(_PAYLOAD) - 1, len(_PAYLOAD), 1 << 20)) | st.integers(0, 1 << 22)


@fuzz_settings(2)
@given(st.sampled_from(list(Compression)), st.binary(max_size=2048), _LIMITS, st.booleans())
def test_random_blocks(codec: Compression, data: bytes, max_size: int, legacy: bool) -> None:
    _check(codec, data, max_size, legacy)


@fuzz_settings(4)
@given(
    st.sampled_from(sorted(frames(), key=str)).flatmap(
        lambda key: st.tuples(st.just(key[0]), mutated(frames()[key], max_ops=3))
    ),
    _LIMITS,
    st.booleans(),
)
def test_mutated_frames(case: tuple[Compression, bytes], max_size: int, legacy: bool) -> None:
    codec, data = case
    _check(codec, data, max_size, legacy)


@fuzz_settings(2)
@given(st.binary(max_size=512) | st.sampled_from(sorted(frames().values())).flatmap(mutated))
def test_framing_bounds(data: bytes) -> None:
    # The bound readers see hostile framing first: they must only ever raise CompressionError.
    for fn in (lz4_bound, zstd_bound, snappy_raw_length):
        result = expect_clean(fn, data)
        if isinstance(result, int):
            assert result >= 0
