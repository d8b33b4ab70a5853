"""Remote lookups: what they cost in object-store requests (counted by a wrapper around the real
backend), the byte-bounded range cache, and its metrics."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from rlm.logdir.discovery import list_segments
from rlm.storage.api import StorageBackend
from rlm.storage.memory import MemoryBackend
from rlm.storage.registry import create_backend
from rlm.testing.counting import CountingBackend
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read.cache import RemoteRangeCache
from rlm.tiering.read.lookup import PartitionReader
from rlm.tiering.read.readers import TieredReaders
from tests.lookup.helpers import (
    BruteLog,
    delete_local_segments,
    settings_for,
    write_generated,
)
from tests.s3servers import S3Target


class Tiered:
    """A generated partition, tiered through a counting backend, local segments deleted (but the
    active one): every record below the log end's last segment is remote only."""

    def __init__(self, tmp: Path, inner: StorageBackend, **tiering: int) -> None:
        self.log_dir = tmp / "logs"
        write_generated(self.log_dir)
        self.brute = BruteLog.scan(self.log_dir / "orders-0")
        self.backend = CountingBackend(inner)
        self.settings = settings_for(
            [self.log_dir],
            backend="memory",
            state_dir=str(tmp / "state"),
            index_entry_bytes=tiering.get("index_entry_bytes", 3_000),
            index_rotate_bytes=tiering.get("index_rotate_bytes", 20_000),
        )
        results = RemoteLogManager(self.settings, self.backend).run_once()
        assert all(r.error is None for r in results) and results[0].copied
        self.deleted = delete_local_segments(self.log_dir / "orders-0")
        assert len(self.deleted) >= 5
        self.local_start = list_segments(self.log_dir / "orders-0")[0].base_offset
        self.sets = sorted((self.log_dir / "orders-0").glob("*.remotelogindex"))
        assert len(self.sets) >= 2  # lookups cross rotated index sets too

    def readers(self, cache_bytes: int = 1 << 24) -> tuple[TieredReaders, CollectorRegistry]:
        registry = CollectorRegistry()
        readers = TieredReaders(
            self.settings, self.backend, cache=RemoteRangeCache(cache_bytes, registry=registry)
        )
        readers.resources.read_ahead = False
        return readers, registry

    def reader(self, cache_bytes: int = 1 << 24) -> tuple[PartitionReader, CollectorRegistry]:
        readers, registry = self.readers(cache_bytes)
        return readers.reader("orders", 0), registry

    def cost(self, call: Callable[..., Any], *args: Any) -> int:
        """Store requests made by ``call(*args)``; its result is kept in :attr:`last`."""
        before = self.backend.total
        self.last = call(*args)
        return self.backend.total - before


def _sample(registry: CollectorRegistry, name: str) -> float:
    return registry.get_sample_value(name) or 0.0


def _remote_queries(t: Tiered) -> tuple[list[int], list[int]]:
    remote = [r for r in t.brute.records if r.offset < t.local_start]
    step = max(1, len(remote) // 25)
    offsets = [r.offset for r in remote[::step]]
    stamps = sorted({r.timestamp for r in remote})
    return offsets, stamps[:: max(1, len(stamps) // 25)]


def _check_cold_costs(t: Tiered) -> None:
    local_start = t.local_start
    offsets, stamps = _remote_queries(t)
    for offset in offsets:
        reader, _ = t.reader()  # fresh reader: cold cache
        assert t.cost(reader.lookup_offset, offset) <= 2, offset
        result = t.last
        assert result.found and result.tier == "remote" and result.offset == offset
        assert t.cost(reader.lookup_offset, offset) == 0, offset  # warm
    for ts in stamps:
        reader, _ = t.reader()
        assert t.cost(reader.lookup_timestamp, ts) <= 2, ts
        want = t.brute.first_ts_ge(ts)
        assert want is not None and want.offset < local_start
        assert t.last.found and t.last.tier == "remote" and t.last.offset == want.offset
        assert t.cost(reader.lookup_timestamp, ts) == 0, ts


def test_cold_remote_lookup_costs_at_most_two_requests(tmp_path: Path) -> None:
    _check_cold_costs(Tiered(tmp_path, MemoryBackend()))


@pytest.mark.s3
def test_cold_remote_lookup_costs_at_most_two_s3_requests(tmp_path: Path, moto_endpoint: str) -> None:
    s3 = create_backend(
        "s3",
        {"bucket": "rlm-test", "prefix": f"lookup-{uuid.uuid4().hex[:8]}", "endpoint_url": moto_endpoint},
    )
    t = Tiered(tmp_path, s3)
    _check_cold_costs(t)
    assert set(t.backend.calls) >= {"put", "read"}


@pytest.mark.s3
def test_cold_remote_lookup_costs_at_most_two_requests_on_seaweedfs(
    tmp_path: Path, s3_target: S3Target
) -> None:
    t = Tiered(tmp_path, create_backend("s3", s3_target.options()))
    _check_cold_costs(t)
    assert set(t.backend.calls) >= {"put", "read"}


def test_repeated_remote_lookups_hit_the_cache(tmp_path: Path) -> None:
    t = Tiered(tmp_path, MemoryBackend())
    reader, registry = t.reader()
    offsets, stamps = _remote_queries(t)
    first = t.cost(lambda: [reader.lookup_offset(o) for o in offsets])
    first += t.cost(lambda: [reader.lookup_timestamp(s) for s in stamps])
    assert first > 0
    hits = _sample(registry, "rlm_remote_cache_hits_total")
    requests = _sample(registry, "rlm_remote_fetch_requests_total")
    assert requests == first == _sample(registry, "rlm_remote_cache_misses_total")
    for _ in range(3):
        assert t.cost(lambda: [reader.lookup_offset(o) for o in offsets]) == 0
        assert t.cost(lambda: [reader.lookup_timestamp(s) for s in stamps]) == 0
    assert _sample(registry, "rlm_remote_cache_hits_total") >= hits + 3 * (len(offsets) + len(stamps))
    assert _sample(registry, "rlm_remote_fetch_requests_total") == requests
    assert _sample(registry, "rlm_remote_fetch_bytes_total") > 0
    assert _sample(registry, "rlm_remote_fetch_errors_total") == 0


def test_cache_respects_its_byte_bound_and_counts_evictions(tmp_path: Path) -> None:
    t = Tiered(tmp_path, MemoryBackend())
    offsets, _ = _remote_queries(t)
    bound = 8_000  # a couple of entries (index_entry_bytes = 3000)
    reader, registry = t.reader(cache_bytes=bound)
    cache = reader.res.cache
    stored = 0
    for offset in offsets:
        stored += t.cost(reader.lookup_offset, offset)
        assert cache.bytes_held <= bound
        assert _sample(registry, "rlm_remote_cache_bytes") == cache.bytes_held
    evictions = _sample(registry, "rlm_remote_cache_evictions_total")
    assert evictions > 0
    # Every range loaded was kept until evicted: loads = evictions + ranges still held (≥ 1).
    held = stored - evictions
    assert held >= 1 and held == cache.ranges_held
    # LRU: the newest range is still there, the oldest is gone (costs a store read again).
    assert t.cost(reader.lookup_offset, offsets[-1]) == 0
    assert t.cost(reader.lookup_offset, offsets[0]) == 1


def test_a_range_larger_than_the_cache_is_not_kept(tmp_path: Path) -> None:
    t = Tiered(tmp_path, MemoryBackend())
    offsets, _ = _remote_queries(t)
    reader, registry = t.reader(cache_bytes=100)  # smaller than any entry
    for _ in range(2):
        assert t.cost(reader.lookup_offset, offsets[1]) == 1
    assert reader.res.cache.bytes_held == 0 and _sample(registry, "rlm_remote_cache_hits_total") == 0
