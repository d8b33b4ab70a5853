"""The Fetch response bound, as Kafka's broker keeps it (docs/kafka-listener.md §5.1): the response
holds at most min(request ``max_bytes``, ``kafka.fetch_max_bytes``) of records, except that the
first partition with data gets one whole batch however large ("minOneMessage"); every later
partition is limited by its ``partition_max_bytes`` and what is left. Reads are bounded at the
source: a fetch asking 2^31−1 bytes of a large segment allocates about the bound, not the segment.

In-process ``KafkaApi.fetch`` over real segments written by LogWriter (local tier only)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka.record.memory_records import MemoryRecords

from rlm.config import load_settings
from rlm.formats.records import RecordSpec
from rlm.kafka.api import KafkaApi
from rlm.logdir.writer import LogWriter
from rlm.storage.local import LocalBackend
from rlm.testing.kafka_wire import fetch_request
from rlm.tiering.read.readers import TieredReaders
from tests.kafka.helpers import toml_config

T0 = 1_760_000_000_000
KIB = 1024
MAX = 2**31 - 1
SMALL = 8  # records of 1 KiB per batch: a batch of a little over 8 KiB


@dataclass
class Served:
    api: KafkaApi
    batch: int  # the size of one small batch, bytes


def _write(logs: Path, topic: str, partition: int, sizes: list[int]) -> list[int]:
    """One batch per entry of ``sizes`` (records of 1 KiB each); the batches' byte sizes."""
    out = []
    with LogWriter(logs, topic, partition, clock=lambda: T0) as w:
        for i, n in enumerate(sizes):
            info = w.append([RecordSpec(T0 + i, b"k%d" % j, bytes([j % 251]) * KIB) for j in range(n)])
            out.append(info.size)
        w.high_watermark = w.log_end_offset
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("bounds")
    logs = root / "logs"
    batch = {size for p in range(4) for size in _write(logs, "many", p, [SMALL] * 30)}
    assert len(batch) == 1  # every small batch has the same size
    _write(logs, "big", 0, [100] + [SMALL] * 10)  # a first batch of ~100 KiB
    _write(logs, "seg", 0, [256] * 64)  # 16 MiB in one segment
    config = toml_config(root / "rlm.toml", [logs], root / "store", {"listen": "127.0.0.1:0"})
    readers = TieredReaders(load_settings(config), LocalBackend(root=str(root / "store")))
    yield Served(KafkaApi(readers), batch.pop())
    readers.close()


def _sizes(answer: Any) -> list[list[int]]:
    return [[len(p.records or b"") for p in t.partitions] for t in answer.body.responses]


def _whole_batches(records: bytes) -> int:
    """The number of whole batches in ``records`` (kafka-python's parser: the independent codec)."""
    mem, n = MemoryRecords(bytes(records)), 0
    while mem.next_batch() is not None:
        n += 1
    return n


def test_the_request_max_bytes_bounds_the_first_partition(served: Served) -> None:
    """Fails before #31: the first partition with data got its partition_max_bytes (1 MiB) and the
    request's max_bytes (3 batches) was ignored."""
    req = fetch_request([("many", 0, 0)], max_bytes=3 * served.batch, partition_max_bytes=1 << 20)
    got = served.api.fetch(req, 12, "t")
    assert got.record_bytes == 3 * served.batch
    assert _whole_batches(got.body.responses[0].partitions[0].records) == 3


def test_a_large_max_bytes_is_capped_by_fetch_max_bytes(served: Served) -> None:
    """Fails before #31: no fetch_max_bytes; a request of 2^31−1 got all 30 batches."""
    req = fetch_request([("many", 0, 0)], max_bytes=MAX, partition_max_bytes=MAX)
    got = served.api.fetch(req, 12, "t", fetch_max_bytes=5 * served.batch)
    assert got.record_bytes == 5 * served.batch
    everything = served.api.fetch(req, 12, "t")
    assert everything.record_bytes == 30 * served.batch  # within the bound: the whole partition


def test_the_first_batch_may_exceed_every_limit_once(served: Served) -> None:
    """minOneMessage: the first partition with data gets its first batch whole, however small the
    limits, so a consumer always progresses; nothing more, and no later partition gets anything."""
    req = fetch_request([("big", 0, 0), ("many", 0, 0)], max_bytes=10, partition_max_bytes=10)
    got = served.api.fetch(req, 12, "t")
    big, many = _sizes(got)
    assert big[0] > 100 * KIB and _whole_batches(got.body.responses[0].partitions[0].records) == 1
    assert many == [0] and got.record_bytes == big[0]
    # an empty partition first does not use the exception up: the next one with data gets it
    at_end = fetch_request([("many", 1, 30 * SMALL), ("big", 0, 0)], max_bytes=10, partition_max_bytes=10)
    assert _sizes(served.api.fetch(at_end, 12, "t")) == [[0], big]


def test_partitions_share_the_response_bound(served: Served) -> None:
    """Fails before #31 (the first partition took 1 MiB): four partitions, a response bound of 7
    batches, partition_max_bytes 1 MiB — 7 batches in all, in request order."""
    parts = [("many", p, 0) for p in range(4)]
    req = fetch_request(parts, max_bytes=7 * served.batch + 100, partition_max_bytes=1 << 20)
    got = served.api.fetch(req, 12, "t")
    assert _sizes(got) == [[7 * served.batch, 0, 0, 0]]
    # partition_max_bytes 3 batches: 3 + 3 + 1 (what is left) + 0
    req = fetch_request(parts, max_bytes=7 * served.batch + 100, partition_max_bytes=3 * served.batch)
    got = served.api.fetch(req, 12, "t")
    assert _sizes(got) == [[3 * served.batch, 3 * served.batch, served.batch, 0]]
    assert got.record_bytes <= 7 * served.batch + 100


def test_a_huge_fetch_allocates_about_the_bound_not_the_segment(served: Served) -> None:
    """Fails before #31: a Fetch of max_bytes 1 MiB, partition_max_bytes 2^31−1 over a 16 MiB
    segment copied all of it. Bounded at 1 MiB, the read allocates ~1 MiB (+ one 256 KiB batch) of
    Python memory; with fetch_max_bytes 1 MiB the same for a request of 2^31−1."""
    _assert_bounded_read(served.api, 1 << 20)
    _assert_bounded_read(served.api, MAX, fetch_max_bytes=1 << 20)


def _assert_bounded_read(api: KafkaApi, max_bytes: int, **bound: int) -> None:
    req = fetch_request([("seg", 0, 0)], max_bytes=max_bytes, partition_max_bytes=MAX)
    tracemalloc.start()
    try:
        got = api.fetch(req, 12, "t", **bound)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert 0 < got.record_bytes <= 1 << 20
    assert peak < 2 << 20, f"peak {peak} bytes for a 1 MiB response"
