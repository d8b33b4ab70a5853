"""The range cache's two segments: a catch-up reader passing through a hot range (read ahead, then
admitted as ``sequential``) must not demote it to the scan segment, where the rest of the scan
would evict it (bench/catchup_bench.py measured the hot-key hit rate dropping to 0.76 from it)."""

from __future__ import annotations

from rlm.tiering.read.cache import RemoteRangeCache

MIB = 1 << 20


def _key(i: int) -> tuple[str, int, int]:
    return ("seg.log", i * MIB, (i + 1) * MIB)


def test_a_scan_passing_a_hot_range_leaves_it_cached() -> None:
    cache = RemoteRangeCache(8 * MIB)
    hot = [_key(i) for i in range(0, 40, 10)]  # 4 hot ranges spread over the log
    for k in hot:
        cache.put(k, b"h" * MIB, "lookup")
    for i in range(40):  # a catch-up reads the whole log (5x the cache), hot ranges included
        cache.put(_key(i), b"s" * MIB, "sequential")
    assert cache.bytes_held <= 8 * MIB
    for k in hot:
        assert cache.get(k, "lookup") is not None, k


def test_sequential_ranges_still_only_use_free_space() -> None:
    cache = RemoteRangeCache(4 * MIB)
    for i in range(3):
        cache.put(_key(100 + i), b"h" * MIB, "lookup")
    for i in range(10):
        cache.put(_key(i), b"s" * MIB, "sequential")
    assert all(cache.get(_key(100 + i)) is not None for i in range(3))
    assert sum(cache.get(_key(i), "sequential") is not None for i in range(10)) == 1


def test_read_ahead_slices_are_copied_before_the_main_segment_keeps_them() -> None:
    """Read-ahead hands out zero-copy slices of one 8 MiB GET. A slice kept by the main segment
    would pin the whole GET while counting 1 MiB, so the main segment holds a copy; the scan
    segment (its ranges leave in read order, siblings together) may keep the slice."""
    whole = bytes(range(256)) * (8 * MIB // 256)
    view = memoryview(whole)
    cache = RemoteRangeCache(16 * MIB)
    cache.put(_key(0), view[:MIB], "sequential")
    cache.put(_key(1), view[MIB : 2 * MIB], "lookup")
    kept_scan, kept_main = cache.get(_key(0), "sequential"), cache.get(_key(1), "sequential")
    assert isinstance(kept_scan, memoryview) and kept_scan.obj is whole
    assert isinstance(kept_main, bytes) and kept_main == whole[MIB : 2 * MIB]
    promoted = cache.get(_key(0), "lookup")  # a lookup wants it: into the main segment, copied
    assert isinstance(promoted, bytes) and promoted == whole[:MIB]
    assert cache.bytes_held == 2 * MIB


def test_a_catch_up_keeps_at_most_its_share_of_an_empty_cache() -> None:
    """A catch-up reads each range once: it keeps its last ranges, a quarter of the bound, for a
    reader close behind it, not the whole free cache (every page of which would be new memory)."""
    cache = RemoteRangeCache(8 * MIB)
    for i in range(20):
        cache.put(_key(i), b"s" * MIB, "sequential")
    kept = [i for i in range(20) if cache.get(_key(i), "sequential") is not None]
    assert kept == [18, 19] and cache.bytes_held == 2 * MIB
    assert cache.get(_key(19), "lookup") is not None  # promoted: the scan segment has room again
    for i in range(20, 23):
        cache.put(_key(i), b"s" * MIB, "sequential")
    kept = [i for i in range(23) if cache.get(_key(i), "sequential") is not None]
    assert kept == [19, 21, 22] and cache.bytes_held == 3 * MIB
    for i in range(100, 106):  # lookups still use the whole bound
        cache.put(_key(i), b"h" * MIB, "lookup")
    assert all(cache.get(_key(i)) is not None for i in range(100, 106))
    assert cache.bytes_held <= 8 * MIB
