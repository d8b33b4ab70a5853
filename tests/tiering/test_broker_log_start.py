"""The broker's live log start, asked before a read serves (docs/visibility.md "Before the checkpoint
reaches disk"). Generated partitions (LogWriter), the real tiering engine and readers; the cluster
is a recording stand-in for kafka-python's ListOffsets (the live broker:
tests/live/test_delete_records.py)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import pytest
from kafka.errors import KafkaConnectionError, UnknownTopicOrPartitionError

from rlm.cluster.log_starts import RETRY_S, BrokerLogStarts
from rlm.config.brokers import ClusterSettings
from rlm.errors import OffsetOutOfRangeError
from rlm.logdir.discovery import list_segments
from rlm.storage.local import LocalBackend
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read.readers import TieredReaders
from tests.lookup.helpers import delete_local_segments, settings_for, write_generated

Key = tuple[str, int]


class Cluster:
    """Answers ListOffsets earliest from ``starts``; records every request; ``down`` fails them all."""

    def __init__(self, starts: dict[Key, int]) -> None:
        self.starts = starts
        self.asked: list[list[Key]] = []
        self.down = False
        self.now = 100.0

    def list(self, keys: list[Key]) -> Mapping[Key, int]:
        self.asked.append(list(keys))
        if self.down:
            raise KafkaConnectionError("connection refused")
        unknown = [k for k in keys if k not in self.starts]
        if unknown:
            raise UnknownTopicOrPartitionError(f"not known: {unknown}")
        return {k: self.starts[k] for k in keys}

    def clock(self) -> float:
        """Time passes a microsecond per look, as a real clock would between two reads."""
        self.now += 1e-6
        return self.now

    def source(self, max_age_ms: int = 0) -> BrokerLogStarts:
        cluster = ClusterSettings(bootstrap_servers=("b:9092",), log_start_max_age_ms=max_age_ms)
        return BrokerLogStarts(cluster, lister=self.list, clock=self.clock)


def _tiered(tmp_path: Path, cluster: Cluster, max_age_ms: int = 0) -> tuple[TieredReaders, list[int]]:
    """t-0 tiered whole, its first local segments deleted (offsets 0.. only in the store)."""
    logs, store = tmp_path / "logs", tmp_path / "store"
    write_generated(logs, "t", 0, batches=120, seed=5, segment_bytes=8_000)
    settings = settings_for([logs], options={"root": str(store)}, eligibility="high-watermark")
    manager = RemoteLogManager(settings, LocalBackend(root=str(store)))
    assert all(r.error is None and r.copied for r in manager.run_once())
    delete_local_segments(logs / "t-0", keep_last=3)
    readers = TieredReaders(
        settings,
        LocalBackend(root=str(store)),
        progress=manager.live_progress,
        log_starts=cluster.source(max_age_ms),
    )
    return readers, [s.base_offset for s in list_segments(logs / "t-0")]


def test_a_log_start_inside_a_local_segment_hides_both_tiers_at_once(tmp_path: Path) -> None:
    cluster = Cluster({})
    readers, bases = _tiered(tmp_path, cluster)
    cluster.starts[("t", 0)] = bases[0]  # the broker's retention: the store's offsets stay served
    found = readers.reader("t", 0).lookup_offset(0)
    assert found.found and found.tier == "remote" and found.offset == 0
    point = bases[1] + 3  # DeleteRecords inside a local segment; no checkpoint says so yet
    cluster.starts[("t", 0)] = point
    reader = readers.reader("t", 0)
    for offset in (0, bases[0], point - 1):
        assert not reader.lookup_offset(offset).found
        with pytest.raises(OffsetOutOfRangeError):
            reader.fetch(offset, 1 << 20)
    assert reader.lookup_timestamp(-2).offset == point
    assert reader.lookup_timestamp(0).offset == point
    assert reader.lookup_offset(point).offset == point
    fetched = reader.fetch(point, 1 << 20)  # the batch holding the point; decoded from it on
    assert next(r.offset for r in fetched.records(fetched.batches[0])) == point
    assert readers.offsets_for_times(0)[0].offset == point


def test_a_log_start_at_a_segment_base_is_left_to_the_checkpoint(tmp_path: Path) -> None:
    cluster = Cluster({})
    readers, bases = _tiered(tmp_path, cluster)
    cluster.starts[("t", 0)] = bases[1]  # retention between its increment and its rename looks so
    found = readers.reader("t", 0).lookup_offset(0)
    assert found.found and found.offset == 0


def test_one_request_per_read_none_at_the_end_and_the_max_age_reuses(tmp_path: Path) -> None:
    cluster = Cluster({})
    readers, _ = _tiered(tmp_path, cluster)
    cluster.starts[("t", 0)] = 0
    reader = readers.reader("t", 0)
    end = reader.offsets().visible_end_offset
    assert end is not None and len(cluster.asked) == 1
    reader.lookup_offset(5)
    reader.fetch(5, 1 << 20)
    assert len(cluster.asked) == 1  # the reader's answer stands for its read
    assert readers.reader("t", 0).fetch(end, 1 << 20).batches == []
    assert len(cluster.asked) == 1  # a consumer waiting at the end costs no request
    readers.reader("t", 0).lookup_offset(5)
    assert len(cluster.asked) == 2  # max age 0: a new read asks again

    cluster = Cluster({("t", 0): 0})
    readers, _ = _tiered(tmp_path / "aged", cluster, max_age_ms=1000)
    for _ in range(3):
        readers.reader("t", 0).lookup_offset(5)
    cluster.now += 0.5
    readers.reader("t", 0).lookup_offset(5)
    assert len(cluster.asked) == 1
    cluster.now += 1.0
    readers.reader("t", 0).lookup_offset(5)
    assert len(cluster.asked) == 2


def test_a_request_asks_for_its_partitions_together_and_a_refused_one_alone() -> None:
    cluster = Cluster({("a", 0): 5, ("a", 1): 7})
    source = cluster.source()
    batch = (("a", 0), ("a", 1), ("gone", 0))
    since = source.now()
    assert source.log_start(("a", 1), since, batch) == 7
    assert cluster.asked == [[("a", 1), ("a", 0), ("gone", 0)], [("a", 1)], [("a", 0)], [("gone", 0)]]
    assert source.log_start(("a", 0), since, batch) == 5
    assert source.log_start(("gone", 0), since, batch) is None  # the files decide
    assert len(cluster.asked) == 4
    cluster.now += 1
    assert source.log_start(("gone", 0), source.now()) is None  # refused: not asked again for a while
    assert len(cluster.asked) == 4
    cluster.now += RETRY_S
    source.log_start(("gone", 0), source.now())
    assert len(cluster.asked) == 5


def test_an_unreachable_cluster_is_one_line_and_the_files_decide_meanwhile(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = Cluster({("a", 0): 5})
    source = cluster.source()
    cluster.down = True
    with caplog.at_level(logging.INFO, logger="rlm.cluster.log_starts"):
        assert source.log_start(("a", 0), source.now()) is None
        cluster.now += 1
        assert source.log_start(("a", 0), source.now()) is None
        assert len(cluster.asked) == 1  # backing off: reads do not wait on a dead cluster
        cluster.now += RETRY_S
        assert source.log_start(("a", 0), source.now()) is None
        cluster.down = False
        cluster.now += RETRY_S
        assert source.log_start(("a", 0), source.now()) == 5
    lines = [r.getMessage() for r in caplog.records]
    assert len([m for m in lines if "cannot ask b:9092: KafkaConnectionError" in m]) == 1, lines
    assert any("the cluster answers again" in m for m in lines), lines
    assert source.describe()["failures"] == 2 and source.describe()["error"] is None
