from __future__ import annotations

import bisect
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlm.errors import CorruptIndexError, InvalidArgumentError
from rlm.formats.indexes.time_index import TimeIndex, TimeIndexBuilder, TimestampOffset, encode_entry

BASE = 5000


def raw(*pairs: tuple[int, int]) -> bytes:
    return b"".join(struct.pack(">qi", ts, rel) for ts, rel in pairs)


def test_reads_entries() -> None:
    index = TimeIndex(BASE, raw((100, 2), (250, 7)))
    assert list(index) == [TimestampOffset(100, 5002), TimestampOffset(250, 5007)]
    assert index.entry(0) == TimestampOffset(100, 5002)
    assert index.last_entry == TimestampOffset(250, 5007)
    assert index.valid_bytes == 24


def test_empty_index_last_entry_and_lookup() -> None:
    index = TimeIndex(BASE, b"")
    assert index.last_entry == TimestampOffset(-1, BASE)
    assert index.lookup(10**15) == TimestampOffset(-1, BASE)


def test_lookup_floor_inclusive_and_default() -> None:
    index = TimeIndex(BASE, raw((100, 2), (250, 7)))
    assert index.lookup(99) == TimestampOffset(-1, BASE)
    assert index.lookup(100) == TimestampOffset(100, 5002)
    assert index.lookup(249) == TimestampOffset(100, 5002)
    assert index.lookup(250) == TimestampOffset(250, 5007)
    assert index.lookup(10**15) == TimestampOffset(250, 5007)


def test_ceiling() -> None:
    index = TimeIndex(BASE, raw((100, 2), (250, 7)))
    assert index.ceiling(0) == TimestampOffset(100, 5002)
    assert index.ceiling(100) == TimestampOffset(100, 5002)
    assert index.ceiling(101) == TimestampOffset(250, 5007)
    assert index.ceiling(251) is None


def test_entry_out_of_range() -> None:
    with pytest.raises(InvalidArgumentError):
        TimeIndex(BASE, b"").entry(0)


def test_preallocated_zero_tail_is_ignored() -> None:
    index = TimeIndex(BASE, raw((100, 2)) + bytes(12 * 40))
    assert list(index) == [TimestampOffset(100, 5002)]
    assert index.valid_bytes == 12


def test_fully_preallocated_kafka_time_index_has_no_entries() -> None:
    index = TimeIndex(BASE, bytes(12 * 10))
    assert len(index) == 0
    assert index.lookup(5) == TimestampOffset(-1, BASE)


def test_remote_time_index_first_entry_zero_is_real() -> None:
    # A .remotetimeindex may start with (ts 0, rel 0): rlm's files are never preallocated.
    index = TimeIndex(BASE, bytes(12), preallocated=False)
    assert list(index) == [TimestampOffset(0, BASE)]
    assert index.lookup(5) == TimestampOffset(0, BASE)
    assert index.lookup(-1) == TimestampOffset(-1, BASE)
    assert len(TimeIndex(BASE, raw((0, 0), (7, 3)), preallocated=False)) == 2


def test_length_not_multiple_of_entry_size() -> None:
    with pytest.raises(CorruptIndexError, match="not a multiple of 12") as err:
        TimeIndex(BASE, raw((100, 2)) + b"\x01" * 5)
    assert err.value.position == 12


def test_last_offset_below_base() -> None:
    with pytest.raises(CorruptIndexError, match="below the base"):
        TimeIndex(BASE, raw((100, -2)))


def test_decreasing_timestamp_is_corrupt() -> None:
    with pytest.raises(CorruptIndexError, match="entry 1") as err:
        TimeIndex(BASE, raw((100, 2), (99, 3)))
    assert err.value.position == 12


def test_decreasing_offset_is_corrupt() -> None:
    with pytest.raises(CorruptIndexError) as err:
        TimeIndex(BASE, raw((100, 2), (150, 3), (200, 1)))
    assert err.value.position == 24


def test_encode_entry_guards_int32() -> None:
    assert encode_entry(BASE, 7, BASE + 1) == raw((7, 1))
    with pytest.raises(InvalidArgumentError, match="overflows int32"):
        encode_entry(BASE, 7, BASE + 2**31)


def test_maybe_append_only_when_timestamp_grows() -> None:
    builder = TimeIndexBuilder(BASE)
    assert builder.maybe_append(-1, BASE) == b""  # v0 data: NO_TIMESTAMP never indexed
    assert builder.maybe_append(100, 5002) == raw((100, 2))
    assert builder.maybe_append(100, 5004) == b""  # equal timestamp: no entry
    assert builder.maybe_append(150, 5004) == raw((150, 4))
    assert builder.maybe_append(160, 5004) == raw((160, 4))  # same offset, larger ts: appended (Kafka)
    with pytest.raises(InvalidArgumentError, match="offset"):
        builder.maybe_append(200, 5003)
    with pytest.raises(InvalidArgumentError, match="timestamp"):
        builder.maybe_append(120, 5010)
    assert list(TimeIndex(BASE, builder.to_bytes())) == list(builder.entries)


def test_full_check_reserves_the_roll_slot() -> None:
    builder = TimeIndexBuilder(BASE, max_index_size=36)  # 3 slots: full at 2 entries
    builder.maybe_append(10, 5001)
    builder.maybe_append(20, 5002)
    assert builder.is_full()
    with pytest.raises(InvalidArgumentError, match="full"):
        builder.maybe_append(30, 5003)
    # On roll Kafka appends the final entry (max timestamp) with skipFullCheck.
    assert builder.maybe_append(30, 5003, skip_full_check=True) == raw((30, 3))
    assert len(builder) == 3


def test_roll_entry_skipped_when_max_already_indexed() -> None:
    builder = TimeIndexBuilder(BASE)
    builder.maybe_append(30, 5003)
    assert builder.maybe_append(30, 5003, skip_full_check=True) == b""
    assert len(builder) == 1


def test_truncate_and_from_index() -> None:
    builder = TimeIndexBuilder.from_index(TimeIndex(BASE, raw((10, 1), (20, 3), (30, 5)) + bytes(12)))
    builder.truncate_to(5003)
    assert builder.to_bytes() == raw((10, 1))
    assert builder.last_entry == TimestampOffset(10, 5001)
    builder.truncate()
    assert builder.last_entry == TimestampOffset(-1, BASE)
    assert builder.to_bytes(preallocate_to=30) == bytes(24)


entries_strategy = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**5)), max_size=60).map(
    lambda pairs: sorted(pairs)
)


def _monotone(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    # Make offsets non-decreasing alongside sorted timestamps, and timestamps > 0 (no all-zero entry).
    out, top = [], 0
    for ts, rel in pairs:
        top = max(top, rel)
        out.append((ts + 1, top))
    return out


@given(entries_strategy, st.integers(-10, 10**6 + 10))
def test_lookup_matches_bisect_oracle(pairs: list[tuple[int, int]], target: int) -> None:
    entries = _monotone(pairs)
    index = TimeIndex(BASE, raw(*entries))
    timestamps = [ts for ts, _ in entries]
    slot = bisect.bisect_right(timestamps, target) - 1
    expected = (
        TimestampOffset(entries[slot][0], BASE + entries[slot][1]) if slot >= 0 else TimestampOffset(-1, BASE)
    )
    assert index.lookup(target) == expected


@given(entries_strategy, st.integers(-2, 10**5 + 2))
def test_builder_truncate_to_matches_filter(pairs: list[tuple[int, int]], cut: int) -> None:
    builder = TimeIndexBuilder(BASE)
    appended = []
    for ts, rel in _monotone(pairs):
        if builder.maybe_append(ts, BASE + rel):
            appended.append((ts, rel))
    builder.truncate_to(BASE + cut)
    kept = [(ts, rel) for ts, rel in appended if rel < cut]
    assert builder.to_bytes() == raw(*kept)
