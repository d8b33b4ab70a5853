"""The remote read engine (rlm/tiering/read/readahead.py, docs/read-path.md) on real tiered logs written
with LogWriter: sequential detection, read-ahead across objects without a second GET (requests
counted by rlm.testing.counting), bounds, cancellation when idle, hot lookups kept cached while a
catch-up scans, answers identical to the path without read-ahead and to a brute-force reading of
the log, and ``verify`` still catching a corrupt remote batch. No timing is asserted."""

from __future__ import annotations

import gc
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from rlm.errors import CorruptRecordError
from rlm.formats.records import iter_batches
from rlm.logdir.discovery import list_segments
from rlm.storage.api import StorageBackend
from rlm.storage.memory import MemoryBackend
from rlm.storage.registry import create_backend
from rlm.storage.wrapper import WrappingBackend
from rlm.testing.counting import CountingBackend
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read.answers import FetchResult
from rlm.tiering.read.cache import RangeKey, RemoteRangeCache
from rlm.tiering.read.lookup import PartitionReader
from rlm.tiering.read.readahead import ReadAhead
from rlm.tiering.read.readers import TieredReaders
from rlm.tiering.read.remote_sets import chain_from
from tests.lookup.helpers import (
    BruteLog,
    delete_local_segments,
    expected_fetch,
    settings_for,
    write_generated,
)

ENTRY = 1_500  # index_entry_bytes: several entries per segment object, several objects


class Gate(WrappingBackend):
    """Holds the read-ahead threads' reads until :meth:`open` (a fetch's own reads pass)."""

    name = "gate"

    def __init__(self, inner: StorageBackend) -> None:
        super().__init__()
        self.inner = inner
        self.opened = threading.Event()
        self.entered = 0  # read-ahead reads that reached the store

    def _read(self, key: str, start: int, end: int | None) -> bytes:
        if threading.current_thread().name.startswith("rlm-read-ahead"):
            self.entered += 1  # one thread at a time in the test that counts
            assert self.opened.wait(60), "the gate was never opened"
        return super()._read(key, start, end)


class Catchup:
    """A generated partition tiered through a counting backend, local segments deleted but the
    active one: a consumer from the remote log start reads the remote tier only."""

    def __init__(self, tmp: Path, *, gate: bool = False, store: str = "memory", **tiering: Any) -> None:
        self.log_dir = tmp / "logs"
        write_generated(self.log_dir, batches=500)
        self.part = self.log_dir / "orders-0"
        self.brute = BruteLog.scan(self.part)
        options = {"root": str(tmp / "store")} if store == "local" else {}
        inner = create_backend(store, options) if store == "local" else MemoryBackend()
        self.gate = Gate(inner) if gate else None
        self.backend = CountingBackend(self.gate or inner)
        self.settings = settings_for(
            [self.log_dir],
            backend=store,
            options=options,
            state_dir=str(tmp / "state"),
            index_entry_bytes=ENTRY,
            index_rotate_bytes=12_000,
            **tiering,
        )
        results = RemoteLogManager(self.settings, self.backend).run_once()
        assert all(r.error is None for r in results) and results[0].copied
        assert len(delete_local_segments(self.part)) >= 5
        self.local_start = list_segments(self.part)[0].base_offset

    def readers(self, *, cache_bytes: int = 1 << 24, read_ahead: bool = True) -> TieredReaders:
        self.registry = CollectorRegistry()
        readers = TieredReaders(
            self.settings, self.backend, cache=RemoteRangeCache(cache_bytes, registry=self.registry)
        )
        readers.resources.read_ahead = read_ahead
        return readers

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def entry_key(self, reader: PartitionReader, offset: int) -> RangeKey:
        entry = next(chain_from(reader._sets(), offset))
        return reader.res.key_of(entry)

    def scan(
        self,
        readers: TieredReaders,
        key: str | None,
        max_bytes: int,
        each: Callable[[FetchResult], None] | None = None,
    ) -> list[FetchResult]:
        """Fetch from the remote log start while the remote tier answers (settling read-ahead)."""
        offset = readers.reader("orders", 0).offsets().remote_log_start_offset
        assert offset is not None
        out = []
        while offset < self.local_start:
            got = readers.reader("orders", 0).fetch(offset, max_bytes, reader_key=key)
            assert got.tier == "remote" and got.batches and got.next_offset is not None
            readers.resources.ahead.settle(60)
            out.append(got)
            if each is not None:
                each(got)
            offset = got.next_offset
        return out


def _rid(key: str) -> tuple[str, str, int]:
    return key, "orders", 0


def _covered(ranges: dict[tuple[str, int, int], int], key: tuple[str, int, int]) -> bool:
    """Whether one ranged read covered all of ``key``'s bytes."""
    return any(o == key[0] and s <= key[1] and key[2] <= e for o, s, e in ranges)


def _each_byte_once(ranges: dict[tuple[str, int, int], int]) -> bool:
    """No range read twice and no two ranged reads of one object overlapping (whole-object reads,
    end None, are the segments' entries objects, read once each as well)."""
    spans = sorted(k for k in ranges if k[2] is not None)
    return max(ranges.values()) == 1 and all(
        a[0] != b[0] or a[2] <= b[1] for a, b in itertools.pairwise(spans)
    )


def test_a_reader_is_sequential_after_two_fetches_and_a_jump_drops_its_window(tmp_path: Path) -> None:
    t = Catchup(tmp_path)
    readers = t.readers()
    ahead = readers.resources.ahead
    start = readers.reader("orders", 0).offsets().remote_log_start_offset
    assert start is not None
    first = readers.reader("orders", 0).fetch(start, 1_000, reader_key="a")
    assert t.metric("rlm_remote_prefetch_requests_total") == 0 and ahead.reader_bytes(_rid("a")) == 0
    # Another reader at a's next offset is not a's continuation; without a key nothing is tracked.
    readers.reader("orders", 0).fetch(first.next_offset, 1_000, reader_key="b")
    for _ in range(3):
        readers.reader("orders", 0).fetch(first.next_offset, 1_000)
    assert t.metric("rlm_remote_prefetch_requests_total") == 0
    second = readers.reader("orders", 0).fetch(first.next_offset, 1_000, reader_key="a")
    assert t.metric("rlm_remote_prefetch_requests_total") > 0 and ahead.reader_bytes(_rid("a")) > 0
    ahead.settle(60)
    assert t.metric("rlm_remote_prefetch_wasted_bytes_total") == 0
    # A jump backwards: the window is dropped, what it had read counts as wasted.
    readers.reader("orders", 0).fetch(start, 1_000, reader_key="a")
    assert second.next_offset != start
    assert t.metric("rlm_remote_prefetch_wasted_bytes_total") > 0
    assert ahead.reader_bytes(_rid("a")) == 0


@pytest.mark.parametrize("max_bytes", [700, 4_000])
def test_read_ahead_crosses_objects_and_no_range_is_read_twice(tmp_path: Path, max_bytes: int) -> None:
    t = Catchup(tmp_path)
    readers = t.readers()
    reader = readers.reader("orders", 0)
    crossings = 0
    previous: list[str] = []

    def check(got: FetchResult) -> None:
        nonlocal crossings
        key = t.entry_key(reader, got.batches[0].base_offset)
        if previous and key[0] != previous[-1] and len(previous) >= 2:
            crossings += 1  # this fetch starts in the next object: it was read ahead
        previous.append(key[0])

    before: dict[int, bool] = {}

    def each(got: FetchResult) -> None:
        check(got)
        nxt = got.next_offset
        if nxt is not None and nxt < t.local_start:
            before[nxt] = _covered(t.backend.ranges, t.entry_key(reader, nxt))  # already read?

    fetched = t.scan(readers, "catchup", max_bytes, each)
    assert crossings >= 3
    # From the third fetch on, everything a fetch starts with was read before it was asked for.
    later = [o for o in list(before)[2:]]
    assert later and all(before[o] for o in later)
    assert t.backend.ranges and _each_byte_once(t.backend.ranges)  # no byte read twice
    # Read-ahead reads adjacent entries of one object with one GET (docs/read-path.md).
    entry = t.entry_key(reader, t.local_start - 1)
    assert max(e - s for _o, s, e in t.backend.ranges if e is not None) > entry[2] - entry[1]
    assert t.metric("rlm_remote_prefetch_hits_total") >= len(fetched) - 3
    assert t.metric("rlm_remote_prefetch_wasted_bytes_total") == 0


def test_read_ahead_leaves_no_garbage_cycle_holding_store_bytes(tmp_path: Path) -> None:
    """A GET's bytes must go when the last range using them does, not when the cyclic collector
    next runs: the daemon runs it rarely (tune_gc), and a catch-up's GETs waiting for it held
    ~480 MiB and made every store read fault in fresh pages (BENCHMARKS.md, #35)."""
    t = Catchup(tmp_path)
    readers = t.readers()
    gc.collect()
    gc.disable()
    try:
        t.scan(readers, "catchup", 4_000)
        assert t.metric("rlm_remote_prefetch_requests_total") > 3
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        holding = [
            o
            for o in gc.garbage
            if isinstance(o, Future) and o.done() and not o.cancelled() and o.exception() is None
        ]
        assert holding == [], f"{len(holding)} finished reads freed only by the cyclic collector"
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def test_read_ahead_stays_within_its_bounds(tmp_path: Path) -> None:
    t = Catchup(
        tmp_path, gate=True, read_ahead_bytes=8_000, read_ahead_total_bytes=12_000, read_ahead_threads=2
    )
    readers = t.readers()
    ahead = readers.resources.ahead
    start = readers.reader("orders", 0).offsets().remote_log_start_offset
    assert start is not None and t.gate is not None

    def two(key: str, offset: int) -> int:
        got = readers.reader("orders", 0).fetch(offset, 700, reader_key=key)
        assert got.next_offset is not None
        return readers.reader("orders", 0).fetch(got.next_offset, 700, reader_key=key).next_offset or 0

    a_next = two("a", start)
    assert 0 < ahead.reader_bytes(_rid("a")) <= 8_000
    assert t.metric("rlm_remote_prefetch_in_flight") > 0  # held at the gate
    two("b", a_next)
    assert 0 < ahead.reader_bytes(_rid("b")) <= 8_000
    assert ahead.bytes_reserved == ahead.reader_bytes(_rid("a")) + ahead.reader_bytes(_rid("b")) <= 12_000
    assert t.metric("rlm_remote_prefetch_bytes") == ahead.bytes_reserved
    t.gate.opened.set()

    def bounded(_: FetchResult) -> None:
        assert ahead.reader_bytes(_rid("a")) <= 8_000 and ahead.bytes_reserved <= 12_000

    t.scan(readers, "a", 700, bounded)
    assert t.metric("rlm_remote_prefetch_hits_total") > 0


def test_an_idle_reader_is_dropped_and_its_queued_reads_cancelled(tmp_path: Path) -> None:
    t = Catchup(tmp_path, gate=True, read_ahead_idle_ms=1_000, read_ahead_threads=1)
    readers = t.readers()
    res = readers.resources
    now = [0.0]
    res.ahead = ReadAhead(res.load, res.limits, res.cache, clock=lambda: now[0])
    start = readers.reader("orders", 0).offsets().remote_log_start_offset
    assert start is not None and t.gate is not None
    got = readers.reader("orders", 0).fetch(start, 700, reader_key="a")
    readers.reader("orders", 0).fetch(got.next_offset or 0, 700, reader_key="a")
    issued = t.metric("rlm_remote_prefetch_requests_total")
    assert issued >= 3 and res.ahead.reader_bytes(_rid("a")) > 0  # one at the gate, the rest queued
    now[0] += 0.5
    res.ahead.sweep()
    assert res.ahead.reader_bytes(_rid("a")) > 0  # not idle yet
    now[0] += 1.0
    res.ahead.sweep()
    assert res.ahead.reader_bytes(_rid("a")) == 0 and res.ahead.bytes_reserved == 0
    assert t.metric("rlm_remote_prefetch_readers") == 0
    t.gate.opened.set()
    assert res.ahead._pool is not None
    res.ahead._pool.shutdown(wait=True)  # the one that had started finishes; nothing else runs
    assert t.gate.entered == 1 < issued
    assert t.metric("rlm_remote_prefetch_in_flight") == 0
    assert t.metric("rlm_remote_prefetch_wasted_bytes_total") > 0


def test_hot_lookups_stay_cached_while_a_catch_up_scans(tmp_path: Path) -> None:
    t = Catchup(tmp_path)
    cache_bytes = 8 * ENTRY  # far less than the catch-up reads between two rounds of lookups
    readers = t.readers(cache_bytes=cache_bytes)
    remote = [r.offset for r in t.brute.records if r.offset < t.local_start]
    hot = [remote[len(remote) // 5], remote[len(remote) // 2], remote[4 * len(remote) // 5]]

    def lookups() -> int:
        before = t.backend.calls["read"]
        for offset in hot:
            assert readers.reader("orders", 0).lookup_offset(offset).offset == offset
        return t.backend.calls["read"] - before

    assert lookups() > 0 and lookups() == 0  # warm
    misses: list[int] = []
    fetched: list[FetchResult] = []

    def each(got: FetchResult) -> None:
        fetched.append(got)
        if len(fetched) % 5 == 0:  # ~ 8 entries scanned between two rounds: a plain LRU evicts
            misses.append(lookups())

    t.scan(readers, "catchup", 4_000, each)
    assert sum(len(f.data) for f in fetched) > 3 * cache_bytes and len(misses) >= 5
    hit_rate = 1 - sum(misses) / (len(misses) * len(hot))
    assert hit_rate >= 0.9, misses
    assert t.metric("rlm_remote_cache_admissions_total", **{"class": "sequential"}) > 0
    assert t.metric("rlm_remote_cache_bytes") <= cache_bytes


@pytest.mark.parametrize("max_bytes", [1, 900, 3_000, 1 << 20])
def test_read_ahead_answers_are_the_bytes_of_the_log(tmp_path: Path, max_bytes: int) -> None:
    t = Catchup(tmp_path)
    with_ahead = t.scan(t.readers(), "catchup", max_bytes)
    assert _each_byte_once(t.backend.ranges)  # parallel reads within a fetch read nothing twice
    single = t.readers().reader("orders", 0).fetch(with_ahead[0].requested_offset or 0, max_bytes)
    assert bytes(single.data) == bytes(with_ahead[0].data)  # one fetch, no reader: its entries at once
    without = t.scan(t.readers(read_ahead=False), None, max_bytes)
    assert [bytes(f.data) for f in with_ahead] == [bytes(f.data) for f in without]
    for got in with_ahead:
        offset = got.requested_offset
        want = expected_fetch(t.brute, got.batches[0].base_offset, max_bytes)
        assert bytes(got.data) == b"".join(b.data for b in want), offset
        parsed = [(b.position, b.size, b.base_offset) for b in iter_batches(got.data)]
        assert parsed == [(b.position, b.size, b.base_offset) for b in got.batches]


def test_verify_catches_a_corrupt_remote_batch(tmp_path: Path) -> None:
    t = Catchup(tmp_path, store="local")
    reader = t.readers().reader("orders", 0)
    start = reader.offsets().remote_log_start_offset
    assert start is not None
    clean = bytes(reader.fetch(start, 1 << 20).data)
    key, begin, _ = t.entry_key(reader, start)
    obj = tmp_path / "store" / key
    raw = bytearray(obj.read_bytes())
    first = next(iter_batches(bytes(raw[begin:])))
    raw[begin + first.size - 3] ^= 0xFF  # inside the first batch's records: covered by its CRC
    obj.write_bytes(bytes(raw))
    unchecked = t.readers().reader("orders", 0).fetch(start, 1 << 20)  # a fresh cache
    assert bytes(unchecked.data) != clean and len(unchecked.data) == len(clean)
    with pytest.raises(CorruptRecordError):
        t.readers().reader("orders", 0).fetch(start, 1 << 20, verify=True)


@pytest.mark.integration
def test_read_ahead_answers_are_the_bytes_of_the_fixtures(fixtures_dir: Path, tmp_path: Path) -> None:
    """Every tiered partition of the real brokers' logs (compacted, compressed, transactional),
    caught up from the remote tier with and without read-ahead: the log's own bytes both times."""
    from rlm.config import load_settings
    from rlm.formats import naming
    from tests.lookup.helpers import copy_fixture_logs, write_config

    dirs = copy_fixture_logs(fixtures_dir, tmp_path / "logs")
    config = write_config(tmp_path / "rlm.toml", dirs, store=tmp_path / "store", index_entry_bytes=4_096)
    settings = load_settings(config)
    backend = CountingBackend(create_backend("local", {"root": str(tmp_path / "store")}))
    assert all(r.error is None for r in RemoteLogManager(settings, backend).run_once())
    parts = [
        p
        for d in dirs
        for p in sorted(d.iterdir())
        if p.is_dir() and any(p.glob("*" + naming.REMOTE_LOG_INDEX))
    ]
    brutes = {p: BruteLog.scan(p) for p in parts}
    for p in parts:
        delete_local_segments(p)
    checked = 0
    for p, brute in brutes.items():
        topic, partition = naming.parse_partition_dir(p.name)
        for max_bytes in (3_000, 1 << 20):
            answers = []
            for read_ahead in (True, False):
                readers = TieredReaders(settings, backend, cache=RemoteRangeCache(1 << 24))
                readers.resources.read_ahead = read_ahead
                ranges = readers.reader(topic, partition).offsets()
                offset, got = ranges.remote_log_start_offset, []
                assert offset is not None
                while offset <= ranges.highest_tiered_offset:
                    f = readers.reader(topic, partition).fetch(offset, max_bytes, reader_key="c")
                    if not f.batches:
                        break
                    got.append(bytes(f.data))
                    want = expected_fetch(brute, f.batches[0].base_offset, max_bytes)
                    assert got[-1] == b"".join(b.data for b in want), (p, offset)
                    offset = f.next_offset
                    assert offset is not None
                answers.append(got)
            assert answers[0] == answers[1] and answers[0], p
            checked += 1
    assert checked >= 4
