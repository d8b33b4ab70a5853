"""The compiled decoder (rlm.formats.records.native, docs/decoder.md) fails exactly like the Python
reference on corrupt input: random bytes, truncations, mutations with CRCs fixed or left broken,
mutations inside the compression, invalid UTF-8 header keys, offsets past int64 — and never reads
past the end of the records (a PROT_NONE guard page after the block). Equal means: the same Arrow
batches, or the same RlmError text."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlm.formats.compression import Compression, compress
from rlm.formats.records import Header, RecordSpec, build_batch, choice, native
from tests.formats.native_helpers import INT64_MAX, PROPERTY, T0, assert_same, needs_native, task
from tests.formats.test_records import legacy_message
from tests.formats.test_scan_native import _PAGE, guarded  # noqa: F401  (the guard-page fixture)
from tests.fuzz.harness import fix_crcs, mutated

# -- corrupt input -------------------------------------------------------------------------------


def reframe(batch: bytes, codec: Compression) -> bytes:
    """``batch`` (uncompressed, v2) with its records section compressed by ``codec``, CRC fixed."""
    body = compress(codec, batch[61:])
    head = bytearray(batch[:61])
    struct.pack_into(">i", head, 8, 49 + len(body))
    struct.pack_into(">h", head, 21, struct.unpack_from(">h", head, 21)[0] | int(codec))
    return fix_crcs(bytes(head) + body)


SEED = build_batch(
    [
        RecordSpec(
            T0 + i,
            None if i == 1 else b"k%d" % i,
            b"v" * i,
            (Header("h", None), Header("é", b"x")) if i % 2 else (),
        )
        for i in range(5)
    ],
    base_offset=40,
)


@needs_native
@PROPERTY
@given(mutated(SEED, max_ops=3), st.sampled_from(Compression), st.booleans())
def test_mutated_records_fail_the_same(data: bytes, codec: Compression, inside: bool) -> None:
    if inside and len(data) > 61:  # mutate the records, then compress them: past the codec
        data = reframe(data, codec)
    assert_same(task(), fix_crcs(data))
    assert_same(task(), data)  # CRC left broken: the same one-line CRC error


def legacy_set(magic: int, base: int) -> bytes:
    """Three inner messages (v1: relative offsets 0..2; v0: absolute)."""
    return b"".join(
        legacy_message(
            i if magic == 1 else base + i,
            magic,
            None if i == 1 else b"k",
            None if i == 2 else b"v" * i,
            ts=T0 + i,
        )
        for i in range(3)
    )


@needs_native
@PROPERTY
@given(st.sampled_from((0, 1)), st.sampled_from(list(Compression)[1:]), st.data())
def test_mutated_legacy_sets_fail_the_same(magic: int, codec: Compression, data: st.DataObject) -> None:
    inner = data.draw(mutated(legacy_set(magic, 500), max_ops=3))
    if data.draw(st.booleans()):
        inner = fix_crcs(inner)
    wrapper = legacy_message(502, magic, None, compress(codec, inner), attrs=int(codec), ts=T0 + 9)
    assert_same(task(), wrapper)


@needs_native
@pytest.mark.parametrize("wrapper_offset", [INT64_MAX, -(1 << 63), -(1 << 63) + 1])
def test_legacy_offsets_past_int64_are_exact(wrapper_offset: int) -> None:
    # v1 offsets are wrapper - last + inner: past int64 in C's arithmetic, the Python rows serve.
    for magic in (0, 1):
        if magic == 0 and wrapper_offset < -(1 << 62):
            continue  # v0 inner offsets are stored absolute: they must fit the int64 field
        inner = legacy_set(magic, wrapper_offset - 2 if magic == 0 else 0)
        wrapper = legacy_message(
            wrapper_offset, magic, None, compress(Compression.GZIP, inner), attrs=1, ts=T0
        )
        assert_same(task(lo=-(1 << 63)), wrapper)


@needs_native
@pytest.mark.parametrize("bad", [b"\xc3\x28", b"\xed\xa0", b"\xc0\xaf"[:2], b"\xf4\x90"])
def test_header_keys_must_be_utf8_in_both(bad: bytes) -> None:
    # "é" is c3 a9; each replacement is invalid UTF-8 (bad continuation, surrogate lead, overlong,
    # past U+10FFFF lead) of the same length, so only the text check can reject it.
    assert SEED.count("é".encode()) == 2
    data = fix_crcs(SEED.replace("é".encode(), bad, 1))
    got = assert_same(task(), data)
    assert isinstance(got, str) and "header key is not UTF-8" in got


@needs_native
@PROPERTY
@given(st.binary(max_size=600), st.integers(0, 60))
def test_random_and_truncated_bytes_fail_the_same(junk: bytes, cut: int) -> None:
    assert_same(task(), junk)
    assert_same(task(), fix_crcs(SEED[:61] + junk))
    assert_same(task(), SEED[: len(SEED) - cut])


@needs_native
def test_add_v2_never_reads_outside_its_range() -> None:
    # The records section ends at `end` even when the buffer goes on: a record whose length runs
    # past `end` is rejected although the bytes after it exist.
    b = native.Builder()
    rec = bytes([0x10, 0, 0, 0, 1, ord("k"), 0x02, ord("v"), 0])  # length 8 but 7 bytes follow in range
    ok = b.add_v2(
        rec + b"\x00" * 16, 0, len(rec) - 1, 0, T0, T0, False, 0, 1, 0, INT64_MAX, 0, 0, False, False
    )
    assert ok < 0 and b.rows == 0
    with pytest.raises(ValueError):
        b.add_v2(rec, 0, len(rec) + 1, 0, T0, T0, False, 0, 1, 0, INT64_MAX, 0, 0, False, False)


@pytest.fixture(scope="module")
def guard_page(request: pytest.FixtureRequest) -> memoryview:
    """The compiled scan's guard page (tests/formats/test_scan_native.py)."""
    view: memoryview = request.getfixturevalue("guarded")
    return view


@needs_native
@PROPERTY
@given(
    st.binary(max_size=300) | mutated(SEED[61:], max_ops=4) | mutated(legacy_set(1, 0), max_ops=4),
    st.integers(-1, 60),
    st.booleans(),
)
def test_never_reads_past_the_records(
    guard_page: memoryview, block: bytes, count: int, log_append: bool
) -> None:
    # The block ends where a PROT_NONE page begins: one byte read past it kills the run.
    tail = guard_page[_PAGE - len(block) :]
    tail[:] = block
    b = native.Builder()
    rows = b.add_v2(tail, 0, len(tail), 40, T0, T0, log_append, 0, count, 0, INT64_MAX, 0, 0, False, False)
    assert rows == b.rows or (rows < 0 and b.rows == 0)
    native.set_decoder("native")
    try:
        out = choice.native_records(tail, 0, len(tail), 40, T0, T0, log_append, count)
    finally:
        native.set_decoder(None)
    assert isinstance(out, int) or len(out) == count
    for magic in (0, 1):
        legacy_rows = b.add_legacy(tail, 2, magic, T0, log_append, 0, 0, INT64_MAX, 0, 0, False, False)
        assert legacy_rows < 0 or legacy_rows <= len(block) // 26
