from __future__ import annotations

import bisect
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlm.errors import CorruptIndexError, InvalidArgumentError
from rlm.formats.indexes.offset_index import (
    INT32_MAX,
    OffsetIndex,
    OffsetIndexBuilder,
    OffsetPosition,
    encode_entry,
)

BASE = 1000


def raw(*pairs: tuple[int, int]) -> bytes:
    return b"".join(struct.pack(">ii", rel, pos) for rel, pos in pairs)


def test_reads_big_endian_relative_entries() -> None:
    index = OffsetIndex(BASE, raw((3, 100), (9, 4500)))
    assert list(index) == [OffsetPosition(1003, 100), OffsetPosition(1009, 4500)]
    assert index.entry(1) == OffsetPosition(1009, 4500)
    assert index.last_offset == 1009
    assert index.valid_bytes == 16


def test_empty_index() -> None:
    index = OffsetIndex(BASE, b"")
    assert len(index) == 0
    assert index.last_offset == BASE
    assert index.lookup(5000) == OffsetPosition(BASE, 0)


def test_lookup_floor_inclusive_and_default() -> None:
    index = OffsetIndex(BASE, raw((3, 100), (9, 4500)))
    assert index.lookup(1002) == OffsetPosition(BASE, 0)  # before the first entry
    assert index.lookup(1003) == OffsetPosition(1003, 100)  # inclusive
    assert index.lookup(1008) == OffsetPosition(1003, 100)
    assert index.lookup(1009) == OffsetPosition(1009, 4500)
    assert index.lookup(10**12) == OffsetPosition(1009, 4500)
    assert index.lookup(0) == OffsetPosition(BASE, 0)  # below the base


def test_entry_out_of_range() -> None:
    with pytest.raises(InvalidArgumentError):
        OffsetIndex(BASE, raw((3, 100))).entry(1)


def test_accepts_memoryview_and_bytearray() -> None:
    data = raw((1, 10), (2, 20))
    assert list(OffsetIndex(BASE, memoryview(data))) == list(OffsetIndex(BASE, bytearray(data)))


def test_preallocated_zero_tail_is_ignored() -> None:
    index = OffsetIndex(BASE, raw((3, 100), (9, 4500)) + bytes(8 * 50))
    assert len(index) == 2
    assert index.valid_bytes == 16
    assert index.lookup(10**9) == OffsetPosition(1009, 4500)


def test_fully_preallocated_kafka_index_has_no_entries() -> None:
    # A fresh active segment's .index is all zeros: Kafka never writes an all-zero entry.
    assert len(OffsetIndex(BASE, bytes(8 * 100))) == 0


def test_remote_index_first_entry_zero_is_real() -> None:
    # .remoteoffsetindex: the first entry is (rel 0, pos 0) — the set's first entry.
    index = OffsetIndex(BASE, raw((0, 0), (5, 82)), preallocated=False)
    assert list(index) == [OffsetPosition(BASE, 0), OffsetPosition(1005, 82)]
    only = OffsetIndex(BASE, raw((0, 0)), preallocated=False)
    assert list(only) == [OffsetPosition(BASE, 0)]
    # Not preallocated: trailing zeros are entries, and out of order ones at that.
    with pytest.raises(CorruptIndexError):
        OffsetIndex(BASE, raw((0, 0), (5, 82)) + bytes(8), preallocated=False)


def test_length_not_multiple_of_entry_size() -> None:
    with pytest.raises(CorruptIndexError, match="not a multiple of 8") as err:
        OffsetIndex(BASE, raw((1, 10)) + b"\x00\x01\x02")
    assert err.value.position == 8


def test_last_offset_below_base() -> None:
    with pytest.raises(CorruptIndexError, match="below the base") as err:
        OffsetIndex(BASE, raw((1, 10), (-5, 20)))
    assert err.value.position == 8


def test_first_offset_below_base() -> None:
    with pytest.raises(CorruptIndexError, match="below the base"):
        OffsetIndex(BASE, raw((-1, 10), (5, 20)))


def test_non_monotonic_offsets_name_the_entry() -> None:
    with pytest.raises(CorruptIndexError, match="entry 2") as err:
        OffsetIndex(BASE, raw((1, 10), (5, 20), (5, 30), (9, 40)))
    assert err.value.position == 16
    assert err.value.offset == 1005


def test_decreasing_positions_are_corrupt() -> None:
    with pytest.raises(CorruptIndexError) as err:
        OffsetIndex(BASE, raw((1, 10), (5, 9)))
    assert err.value.position == 8


def test_zero_entry_in_the_middle_is_corrupt() -> None:
    with pytest.raises(CorruptIndexError):
        OffsetIndex(BASE, raw((1, 10), (0, 0), (5, 20)))


def test_encode_entry_and_int32_guard() -> None:
    assert encode_entry(BASE, BASE + 7, 99) == raw((7, 99))
    assert encode_entry(BASE, BASE + INT32_MAX, INT32_MAX) == raw((INT32_MAX, INT32_MAX))
    with pytest.raises(InvalidArgumentError, match="overflows int32"):
        encode_entry(BASE, BASE + INT32_MAX + 1, 0)
    with pytest.raises(InvalidArgumentError):
        encode_entry(BASE, BASE - 1, 0)
    with pytest.raises(InvalidArgumentError, match="position"):
        encode_entry(BASE, BASE, INT32_MAX + 1)


def test_builder_append_rules() -> None:
    builder = OffsetIndexBuilder(BASE)
    assert builder.append(BASE, 0) == raw((0, 0))  # first entry may be the base itself
    builder.append(1010, 4100)
    with pytest.raises(InvalidArgumentError, match="last offset is 1010"):
        builder.append(1010, 9000)  # offsets strictly increase
    with pytest.raises(InvalidArgumentError):
        builder.append(1011, 4099)  # positions never go back
    assert builder.last_offset == 1010
    assert list(OffsetIndex(BASE, builder.to_bytes()).entries) == list(builder.entries)


def test_builder_overflow_is_refused_and_detectable() -> None:
    builder = OffsetIndexBuilder(BASE)
    assert not builder.would_fit(BASE + INT32_MAX + 1, 0)
    assert builder.would_fit(BASE + INT32_MAX, 0)
    with pytest.raises(InvalidArgumentError, match="rotate"):
        builder.append(BASE + INT32_MAX + 1, 0)
    assert len(builder) == 0


def test_builder_full_check() -> None:
    builder = OffsetIndexBuilder(BASE, max_index_size=20)  # room for 2 entries (rounded down)
    builder.append(1001, 1)
    assert not builder.is_full()
    builder.append(1002, 2)
    assert builder.is_full()
    with pytest.raises(InvalidArgumentError, match="full"):
        builder.append(1003, 3)
    assert OffsetIndexBuilder(BASE).is_full(8) is False
    assert builder.is_full(100) is False


def test_builder_preallocated_bytes_read_back() -> None:
    builder = OffsetIndexBuilder(BASE)
    builder.append(1003, 100)
    data = builder.to_bytes(preallocate_to=100)
    assert len(data) == 96
    assert list(OffsetIndex(BASE, data)) == [OffsetPosition(1003, 100)]


def test_builder_from_index_resumes() -> None:
    index = OffsetIndex(BASE, raw((3, 100)) + bytes(16))
    builder = OffsetIndexBuilder.from_index(index)
    builder.append(1004, 200)
    assert builder.to_bytes() == raw((3, 100), (4, 200))


def test_truncate_to_removes_offsets_at_or_above() -> None:
    builder = OffsetIndexBuilder(BASE)
    for rel in (2, 4, 6):
        builder.append(BASE + rel, rel * 10)
    builder.truncate_to(1004)  # exact match: removed with everything after
    assert [e.offset for e in builder.entries] == [1002]
    builder.append(1003, 30)  # appending after a truncation continues from the new last
    builder.truncate_to(10**9)  # beyond the last: no effect
    assert builder.to_bytes() == raw((2, 20), (3, 30))
    builder.truncate()
    assert builder.to_bytes() == b""
    assert builder.last_offset == BASE


offsets_strategy = st.lists(st.integers(0, 10_000), unique=True, max_size=60).map(sorted)


@given(offsets_strategy, st.integers(-50, 10_100))
def test_lookup_matches_bisect_oracle(rels: list[int], target_rel: int) -> None:
    entries = [(rel, rel * 3 + 1) for rel in rels]
    index = OffsetIndex(BASE, raw(*entries))
    slot = bisect.bisect_right(rels, target_rel) - 1
    expected = OffsetPosition(BASE + rels[slot], entries[slot][1]) if slot >= 0 else OffsetPosition(BASE, 0)
    assert index.lookup(BASE + target_rel) == expected


@given(offsets_strategy, st.integers(-5, 10_005))
def test_builder_truncate_to_matches_filter(rels: list[int], cut_rel: int) -> None:
    builder = OffsetIndexBuilder(BASE)
    for rel in rels:
        builder.append(BASE + rel, rel)
    builder.truncate_to(BASE + cut_rel)
    kept = [(rel, rel) for rel in rels if rel < cut_rel]
    assert builder.to_bytes() == raw(*kept)
    assert builder.last_offset == (BASE + kept[-1][0] if kept else BASE)
