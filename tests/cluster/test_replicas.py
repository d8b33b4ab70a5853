"""The replica generator (rlm.testing.replicas): what the cluster e2e tests rely on holds.

Batches are compared across replicas through kafka-python (the independent codec) and as raw bytes;
the checkpoints through rlm's parsers; the KRaft log through rlm's reader.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka.record.memory_records import MemoryRecords

from rlm.formats.checkpoint import (
    EpochEntry,
    parse_leader_epoch_checkpoint,
    parse_offset_checkpoint,
)
from rlm.formats.partition_metadata import parse_partition_metadata
from rlm.logdir.discovery import list_segments
from rlm.logdir.kraft import KraftMetadataLog, read_node_id
from rlm.testing.replicas import ReplicaSet, read_batches


def _decoded(partition_dir: Path) -> list[tuple[int, int, list[tuple[int, int, bytes | None, bytes | None]]]]:
    """(base offset, leader epoch, records) of every batch, decoded by kafka-python."""
    out = []
    for log in sorted(partition_dir.glob("*.log")):
        records = MemoryRecords(log.read_bytes())
        while records.has_next():
            batch = records.next_batch()
            recs = [(r.offset, r.timestamp, r.key, r.value) for r in batch]
            out.append((batch.base_offset, batch.leader_epoch, recs))
    return out


def _epochs(partition_dir: Path) -> list[EpochEntry]:
    return parse_leader_epoch_checkpoint((partition_dir / "leader-epoch-checkpoint").read_text()).entries


def _hw(log_dir: Path, topic: str, partition: int) -> int:
    text = (log_dir / "replication-offset-checkpoint").read_text()
    return parse_offset_checkpoint(text).entries[(topic, partition)]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ReplicaSet]:
    with ReplicaSet(tmp_path, partitions=2, seed=7, segment_bytes=2048) as rs:
        rs.grow(24)
        rs.move_leader(0, 2)
        rs.grow(18)
        yield rs


def test_replicas_hold_identical_batches_with_different_roll_points(cluster: ReplicaSet) -> None:
    for p in cluster.partitions:
        dirs = [cluster.log_dirs[b] / p.name for b in cluster.brokers]
        decoded = [_decoded(d) for d in dirs]
        assert decoded[0] and decoded[0] == decoded[1] == decoded[2]
        raw = [read_batches(d) for d in dirs]
        assert raw[0] == raw[1] == raw[2] == [b.data for b in p.log]
        # Offsets are contiguous from 0 and the epochs are what the leader stamped.
        offsets = [r[0] for _, _, recs in decoded[0] for r in recs]
        assert offsets == list(range(p.log_end_offset))
        bases = [[s.base_offset for s in list_segments(d)] for d in dirs]
        assert len({tuple(b) for b in bases}) == 3, bases  # every broker rolled elsewhere
        # ... yet each ends its closed segments at the same place (the explicit rolls).
        assert {b[-1] for b in bases} == {p.log_end_offset}


def test_checkpoints_parse_and_agree(cluster: ReplicaSet) -> None:
    for broker, log_dir in cluster.log_dirs.items():
        assert read_node_id([log_dir]) == str(broker)
        for p in cluster.partitions:
            pdir = log_dir / p.name
            assert parse_partition_metadata((pdir / "partition.metadata").read_bytes()).topic_id == p.topic_id
            assert _hw(log_dir, p.topic, p.partition) == p.log_end_offset
        lso = parse_offset_checkpoint((log_dir / "log-start-offset-checkpoint").read_text())
        assert lso.entries == {}  # Kafka writes an entry only above the first segment's base
        recovery = parse_offset_checkpoint((log_dir / "recovery-point-offset-checkpoint").read_text())
        assert set(recovery.entries) == {(cluster.topic, p.partition) for p in cluster.partitions}
    p0 = cluster.partition(0)
    epochs = _epochs(cluster.log_dirs[1] / p0.name)
    assert [e.epoch for e in epochs] == [0, 1]  # one clean leader change on partition 0
    assert epochs[1].start_offset == next(b.base_offset for b in p0.log if b.leader_epoch == 1)
    assert all(_epochs(cluster.log_dirs[b] / p0.name) == epochs for b in cluster.brokers)
    assert [e.epoch for e in _epochs(cluster.log_dirs[1] / cluster.partition(1).name)] == [0]


def test_unclean_election_leaves_a_diverged_tail_and_rejoin_truncates(tmp_path: Path) -> None:
    with ReplicaSet(tmp_path, partitions=1, seed=3, segment_bytes=2048) as rs:
        p = rs.partition(0)
        rs.grow(18)
        t = rs.isolate(0, 3)
        rs.grow(12)  # only brokers 1 and 2 get these (old epoch, past T)
        old_epoch = p.leader_epoch
        old_tail = [b for b in p.log if b.base_offset >= t]
        assert old_tail and all(b.leader_epoch == old_epoch for b in old_tail)
        start = rs.unclean_elect(0, 3)
        assert start == t
        rs.grow(12)
        new_epoch = p.leader_epoch
        assert new_epoch == old_epoch + 1
        dirs = {b: rs.log_dirs[b] / p.name for b in rs.brokers}
        raw = {b: read_batches(d) for b, d in dirs.items()}
        prefix = [b.data for b in p.log if b.base_offset < t]
        assert all(r[: len(prefix)] == prefix for r in raw.values())
        assert raw[1] == raw[2] == prefix + [b.data for b in old_tail]
        new_tail = [x for x in _decoded(dirs[3]) if x[0] >= t]
        assert new_tail and {epoch for _, epoch, _ in new_tail} == {new_epoch}
        assert raw[3][len(prefix) :] != raw[1][len(prefix) :]
        assert _epochs(dirs[3])[-1] == EpochEntry(new_epoch, t)
        assert _epochs(dirs[1])[-1].epoch == old_epoch
        assert _hw(rs.log_dirs[1], p.topic, 0) > t  # the old tail was committed under the old leader

        segments_before = {s.base_offset: s.log.read_bytes() for s in list_segments(dirs[1])}
        assert rs.rejoin(0, 1) == t
        rs.grow(6)
        assert read_batches(dirs[1]) == read_batches(dirs[3]) == [b.data for b in p.log]
        assert _epochs(dirs[1]) == _epochs(dirs[3])
        # Segments wholly below T keep their names and bytes (Kafka's truncateTo).
        kept = {s.base_offset: s.log.read_bytes() for s in list_segments(dirs[1])}
        below = [base for base in segments_before if base < t and base in kept]
        assert below and all(kept[b] == segments_before[b] for b in below[:-1])
        assert _decoded(dirs[2])[-1][1] == old_epoch  # broker 2 has not rejoined yet


def test_kraft_log_names_the_leaders_and_epochs(tmp_path: Path) -> None:
    with ReplicaSet(tmp_path, partitions=2, seed=1, kraft=True) as rs:
        rs.grow(6)
        rs.move_leader(0, 3)
        rs.isolate(1, 1)
        rs.unclean_elect(1, 1)
        rs.rejoin(1, 2)
        for broker, log_dir in rs.log_dirs.items():
            image = KraftMetadataLog(log_dir / "__cluster_metadata-0").poll()
            topic = image.topics_by_name[rs.topic]
            assert topic.topic_id == rs.topic_id
            assert image.topic_configs[rs.topic] == {"cleanup.policy": "delete"}
            for p in rs.partitions:
                part = topic.partitions[p.partition]
                assert (part.leader, part.leader_epoch, part.isr) == (p.leader, p.leader_epoch, p.isr), broker
        assert rs.partition(1).isr == (1, 2)
        assert rs.partition(0).leader_epoch == 1 and rs.partition(1).leader_epoch == 1
