"""Fetches answered on the listener's event loop (rlm/kafka/on_loop.py, docs/kafka-listener.md §8),
in process over two tiered partitions whose older segments are only in the store: a Fetch whose
read would wait (nothing cached) is handed to the pool, which goes on with it; one whose ranges are
cached is answered on the loop; a Fetch of two partitions, the first cached and the second not,
keeps the first's read and reads only the second in the pool. Answers on either path carry the
same bytes. ListOffsets likewise: the latest, earliest and tiered offsets on the loop, a timestamp
in the store's data in the pool, with the answers of an in-process read. No timing is asserted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.consumer import FetchResponse, ListOffsetsRequest, ListOffsetsResponse
from prometheus_client import CollectorRegistry

from rlm.config import load_settings
from rlm.kafka.api import KafkaApi
from rlm.kafka.metrics import KafkaMetrics
from rlm.kafka.reads import list_offset
from rlm.kafka.server import KafkaListener
from rlm.storage.local import LocalBackend
from rlm.testing.kafka_wire import fetch_request
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read.lookup import PartitionReader
from rlm.tiering.read.readers import TieredReaders
from tests.kafka.helpers import call, connect, toml_config
from tests.lookup.helpers import delete_local_segments, write_generated


class Served:
    """``t-0`` and ``t-1`` tiered whole, all but their last segment deleted, behind a listener."""

    def __init__(self, tmp: Path) -> None:
        logs, store = tmp / "logs", tmp / "store"
        for partition in (0, 1):
            write_generated(logs, "t", partition, batches=150, seed=5 + partition, segment_bytes=8_000)
        settings = load_settings(toml_config(tmp / "rlm.toml", [logs], store, {"listen": "127.0.0.1:0"}))
        manager = RemoteLogManager(settings, LocalBackend(root=str(store)))
        assert all(r.error is None and r.copied for r in manager.run_once())
        for partition in (0, 1):
            delete_local_segments(logs / f"t-{partition}", keep_last=1)
        self.readers = TieredReaders(settings, LocalBackend(root=str(store)))
        self.fresh = lambda: TieredReaders(settings, LocalBackend(root=str(store)))  # caches of its own
        self.registry = CollectorRegistry()
        metrics = KafkaMetrics(self.registry)
        self.listener = KafkaListener(KafkaApi(self.readers), settings.kafka, metrics=metrics).start()

    def on_loop(self, outcome: str, api: str = "fetch") -> float:
        name = f"rlm_kafka_{api}_on_loop_total"
        return self.registry.get_sample_value(name, {"outcome": outcome}) or 0.0

    def list_offsets(self, sock: Any, timestamps: list[int]) -> list[tuple[int, int, int]]:
        """(error, offset, leader epoch) of ``t-0`` at each timestamp, in one ListOffsets v9."""
        t = ListOffsetsRequest.ListOffsetsTopic
        parts = [
            t.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=ts)
            for ts in timestamps
        ]
        req = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[t(name="t", partitions=parts)])
        got = call(self.listener.port, req, 9, ListOffsetsResponse, sock=sock)
        return [(p.error_code, p.offset, p.leader_epoch) for p in got.topics[0].partitions]

    def expected(self, timestamp: int) -> tuple[int, int, int]:
        got = list_offset(self.readers, "t", 0, timestamp, False, 9)
        return (got.error, got.offset, got.leader_epoch)

    def fetch(self, sock: Any, parts: list[tuple[str, int, int]]) -> list[bytes]:
        req = fetch_request(parts, max_bytes=1 << 20, partition_max_bytes=2_000)
        got = call(self.listener.port, req, 12, FetchResponse, sock=sock)
        out = [p for t in got.responses for p in t.partitions]
        assert [p.error_code for p in out] == [0] * len(parts)
        return [bytes(p.records or b"") for p in out]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    s = Served(tmp_path)
    yield s
    s.listener.stop()
    s.readers.close()


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every record read that returned (``PartitionReader.fetch``): (partition, offset)."""
    seen: list[tuple[int, int]] = []
    real = PartitionReader.fetch

    def counted(self: PartitionReader, offset: int, *args: Any, **kwargs: Any) -> Any:
        got = real(self, offset, *args, **kwargs)
        seen.append((self.part.partition, offset))
        return got

    monkeypatch.setattr(PartitionReader, "fetch", counted)
    return seen


def test_a_cold_fetch_is_handed_to_the_pool_and_a_cached_one_answered_on_the_loop(served: Served) -> None:
    sock = connect(served.listener.port)
    try:
        first = served.fetch(sock, [("t", 0, 0)])
        assert first[0] and (served.on_loop("handed"), served.on_loop("answered")) == (1, 0)
        second = served.fetch(sock, [("t", 0, 0)])  # after a read that waited, one goes to the pool whole
        assert (served.on_loop("handed"), served.on_loop("answered")) == (1, 0)
        third = served.fetch(sock, [("t", 0, 0)])  # cached by the first: nothing to wait for
        assert (served.on_loop("handed"), served.on_loop("answered")) == (1, 1)
        assert first == second == third
    finally:
        sock.close()


def test_a_fetch_handed_over_keeps_the_partitions_read_on_the_loop(
    served: Served, reads: list[tuple[int, int]]
) -> None:
    def fetch(parts: list[tuple[str, int, int]]) -> list[bytes]:
        sock = connect(served.listener.port)  # a new connection: tried on the loop from its first Fetch
        try:
            return served.fetch(sock, parts)
        finally:
            sock.close()

    (t0,) = fetch([("t", 0, 0)])  # handed over (cold); t-0's first ranges are cached now
    reads.clear()
    both = fetch([("t", 0, 0), ("t", 1, 0)])  # t-0 answered on the loop, t-1 would wait: handed
    assert (served.on_loop("handed"), served.on_loop("answered")) == (2, 0)
    assert reads.count((0, 0)) == 1 and reads.count((1, 0)) == 1  # t-0's read on the loop was kept
    (t1,) = fetch([("t", 1, 0)])
    assert both == [t0, t1] and t0 and t1


def test_list_offsets_of_the_special_offsets_are_answered_on_the_loop(served: Served) -> None:
    specials = [-1, -2, -4, -5]
    sock = connect(served.listener.port)
    try:
        got = served.list_offsets(sock, specials)
        again = served.list_offsets(sock, specials)
    finally:
        sock.close()
    assert (served.on_loop("answered", "list_offsets"), served.on_loop("handed", "list_offsets")) == (2, 0)
    assert got == again == [served.expected(ts) for ts in specials]
    assert got[1][1] == 0 and got[3][1] > 0  # the earliest offset, and something tiered


def test_a_list_offsets_that_looks_in_the_store_is_answered_whole_in_the_pool(served: Served) -> None:
    other = served.fresh()  # not the listener's: its caches stay cold
    try:
        first = other.reader("t", 0).lookup_offset(0).batch
    finally:
        other.close()
    assert first is not None
    asked = [-1, first.max_timestamp]  # the second: a timestamp lookup in the store's first segment
    sock = connect(served.listener.port)
    try:
        got = served.list_offsets(sock, asked)
    finally:
        sock.close()
    assert (served.on_loop("answered", "list_offsets"), served.on_loop("handed", "list_offsets")) == (0, 1)
    assert got == [served.expected(ts) for ts in asked] and got[1][0] == 0 and got[1][1] >= 0
