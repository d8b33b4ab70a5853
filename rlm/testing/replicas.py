"""Replicas of the same partitions in several brokers' log dirs (tests, benches, demos of cluster mode).

A :class:`ReplicaSet` plays a small Kafka cluster's replication on disk, writing every file with
:class:`rlm.logdir.writer.LogWriter`: one log dir per broker (``<root>/broker-<id>``, with
``meta.properties`` naming ``node.id``), every partition replicated on every broker. What Kafka
guarantees, and what cluster mode (docs/cluster.md) relies on, holds by construction:

* **Byte-identical batches.** The leader builds each batch once (its base offset = its log end,
  ``partitionLeaderEpoch`` = the current leader epoch); every in-sync follower appends those very
  bytes (``append_raw(..., assign_offsets=False)``, as a follower's fetcher does), so each replica's
  ``leader-epoch-checkpoint`` is derived from the batches exactly like Kafka's epoch cache.
* **Independent roll points.** Each broker has its own ``segment.bytes`` (the base value grown by a
  third per broker index), so segments of the same offsets start at different base offsets.
* **Checkpoints** as a broker writes them: ``replication-offset-checkpoint`` (the high watermark,
  the log end of every in-sync replica), ``recovery-point-offset-checkpoint``,
  ``log-start-offset-checkpoint``, per partition ``partition.metadata`` (one topic id on every
  broker) and ``leader-epoch-checkpoint``.
* **Leader changes** bump the leader epoch (KRaft does so exactly when the leader changes). With
  ``kraft=True`` each broker's log dir also holds ``__cluster_metadata-0`` (written with
  :mod:`rlm.testing.kraft`): a TopicRecord and PartitionRecords, then a PartitionChangeRecord per
  leader or ISR change, so the leader and epoch a KRaft reader sees match the batches.
* **Unclean election.** :meth:`ReplicaSet.isolate` drops a replica from the ISR (its log stops at
  offset T); the others go on under the old epoch; :meth:`ReplicaSet.unclean_elect` makes the
  isolated replica leader under a higher epoch from T (its checkpoint ends ``(E_new, T)``) while the
  others still hold the old-epoch batches from T (the diverged tail).
  :meth:`ReplicaSet.rejoin` is the follower's truncation: the replica's log is cut back to where
  it agrees with the leader and then copies the leader's batches (the partition directory's
  segment files are rewritten by replaying its own history up to that point, so every surviving
  segment keeps its bytes and name, like Kafka's ``truncateTo``). Stop the replica's sidecar
  before rejoining it: a broker truncates while it starts following.

Deterministic for a seed: record timestamps come from a counter, never from the wall clock.
Not thread-safe.
"""

from __future__ import annotations

import base64
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rlm.formats import metadata as md
from rlm.formats import naming
from rlm.formats.compression import Compression
from rlm.formats.records import RecordSpec, build_batch, iter_batches
from rlm.logdir.writer import LogWriter
from rlm.testing.kraft import metadata_writer, write_records

__all__ = ["Batch", "Replica", "ReplicaSet", "ReplicatedPartition", "read_batches", "write_meta_properties"]

#: Record time starts here (2025-01-01T00:00:00Z) so the bytes do not depend on the wall clock.
EPOCH_MS = 1_735_689_600_000
#: Codecs the generated batches use (both decodable by kafka-python without optional libraries).
CODECS = (Compression.NONE, Compression.GZIP)
#: The suffixes a truncation rewrites (what LogWriter writes per segment).
_SEGMENT_SUFFIXES = (naming.LOG, naming.INDEX, naming.TIME_INDEX)


@dataclass(frozen=True, slots=True)
class Batch:
    """One record batch as the leader wrote it: Kafka's bytes, offsets ``[base, last]``, epoch."""

    data: bytes
    base_offset: int
    last_offset: int
    leader_epoch: int


_Roll = None  # a roll in a replica's history


def write_meta_properties(log_dir: Path, node_id: int, cluster_id: str) -> Path:
    """``meta.properties`` as a KRaft broker writes it (version 1, node.id, cluster.id, directory.id)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    directory_id = base64.urlsafe_b64encode(random.Random(node_id).randbytes(16)).rstrip(b"=").decode()
    text = (
        f"#\n#Written by rlm.testing.replicas\ncluster.id={cluster_id}\ndirectory.id={directory_id}\n"
        f"node.id={node_id}\nversion=1\n"
    )
    path = log_dir / "meta.properties"
    path.write_text(text, encoding="utf-8")
    return path


@dataclass
class Replica:
    """One broker's copy of a partition: its writer and the history replayed on truncation."""

    broker: int
    log_dir: Path
    segment_bytes: int
    topic_id: str
    writer: LogWriter
    batches: list[Batch] = field(default_factory=list)
    #: Batches and rolls (``None``) in the order applied: what a truncation replays.
    history: list[Batch | None] = field(default_factory=list)
    in_sync: bool = True

    @property
    def path(self) -> Path:
        return self.writer.path

    @property
    def log_end_offset(self) -> int:
        return self.writer.log_end_offset

    @property
    def closed_end(self) -> int:
        """The last offset in a closed (rolled) segment, -1 if none: what is eligible at HW = LEO."""
        return self.writer.segment_base_offsets[-1] - 1

    def append(self, batch: Batch) -> None:
        self.writer.append_raw(batch.data, assign_offsets=False)
        self.batches.append(batch)
        self.history.append(batch)

    def roll(self) -> None:
        self.writer.roll()
        self.history.append(_Roll)

    def commit(self, high_watermark: int) -> None:
        """Flush the active segment and write the log dir's checkpoints with this high watermark."""
        self.writer.high_watermark = high_watermark
        self.writer.flush()
        self.writer.write_checkpoints()


def _new_writer(log_dir: Path, topic: str, partition: int, segment_bytes: int, topic_id: str) -> LogWriter:
    # index_interval_bytes small: a few index entries per (small) segment, as with real sizes.
    return LogWriter(
        log_dir,
        topic,
        partition,
        segment_bytes=segment_bytes,
        index_interval_bytes=256,
        clock=lambda: EPOCH_MS,
        topic_id=topic_id,
    )


class ReplicatedPartition:
    """One partition on every broker; the leader's log is the lineage (:attr:`log`)."""

    def __init__(
        self,
        topic: str,
        partition: int,
        topic_id: str,
        replicas: dict[int, Replica],
        leader: int,
        rng: random.Random,
        *,
        records_per_batch: int,
        value_bytes: int,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.topic_id = topic_id
        self.replicas = replicas
        self.leader = leader
        self.leader_epoch = 0
        self.rng = rng
        self.records_per_batch = records_per_batch
        self.value_bytes = value_bytes
        self.timestamp = EPOCH_MS + 1_000 * partition
        #: Number of leader changes (clean or not) since creation.
        self.leader_changes = 0

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def log(self) -> list[Batch]:
        """The leader's batches: the lineage every replica converges to."""
        return self.replicas[self.leader].batches

    @property
    def log_end_offset(self) -> int:
        return self.replicas[self.leader].log_end_offset

    @property
    def isr(self) -> tuple[int, ...]:
        return tuple(sorted(b for b, r in self.replicas.items() if r.in_sync))

    def _next_batch(self) -> Batch:
        base = self.log_end_offset
        specs = []
        for _ in range(self.records_per_batch):
            self.timestamp += self.rng.randint(1, 20)
            key = f"key-{self.rng.randrange(1000)}".encode()
            specs.append(RecordSpec(self.timestamp, key, self.rng.randbytes(self.value_bytes)))
        data = build_batch(
            specs,
            base_offset=base,
            compression=self.rng.choice(CODECS),
            partition_leader_epoch=self.leader_epoch,
        )
        return Batch(data, base, base + len(specs) - 1, self.leader_epoch)

    def append(self, batches: int) -> None:
        """The leader appends ``batches`` batches; every in-sync follower copies them; the high
        watermark (of the leader and the in-sync followers) moves to the new log end."""
        for _ in range(batches):
            batch = self._next_batch()
            for replica in self.replicas.values():
                if replica.in_sync:
                    replica.append(batch)
        self._commit()

    def roll(self) -> None:
        """Roll the active segment of every in-sync replica (so all of the log is eligible)."""
        for replica in self.replicas.values():
            if replica.in_sync:
                replica.roll()
        self._commit()

    def _commit(self) -> None:
        end = self.log_end_offset
        for replica in self.replicas.values():
            if replica.in_sync:
                replica.commit(end)

    def divergence_point(self, broker: int) -> int:
        """The first offset where ``broker``'s log differs from the leader's (its log end if none)."""
        ours, theirs = self.replicas[broker].batches, self.log
        for n, batch in enumerate(ours):
            if n >= len(theirs) or theirs[n] != batch:
                return batch.base_offset
        return self.replicas[broker].log_end_offset

    def truncate_and_follow(self, broker: int) -> int:
        """Kafka's follower truncation: cut ``broker``'s log back to where it agrees with the leader
        (segment files rewritten from its own history, so the kept segments keep their bytes and
        names), copy the leader's batches from there, rejoin the ISR. Returns the truncation offset."""
        replica = self.replicas[broker]
        cut = self.divergence_point(broker)
        kept: list[Batch | None] = []
        for item in replica.history:
            if item is not None and item.base_offset >= cut:
                break
            kept.append(item)
        replica.writer.close()
        for path in list(replica.path.iterdir()):
            if path.name.endswith(_SEGMENT_SUFFIXES):
                path.unlink()
        replica.writer = _new_writer(
            replica.log_dir, self.topic, self.partition, replica.segment_bytes, self.topic_id
        )
        replica.batches, replica.history = [], []
        for item in kept:
            if item is None:
                replica.roll()
            else:
                replica.append(item)
        for batch in self.log[len(replica.batches) :]:
            replica.append(batch)
        replica.in_sync = True
        self._commit()
        return cut


class ReplicaSet:
    """``partitions`` partitions of ``topic`` replicated on every broker of ``brokers``.

    ``segment_bytes`` is the first broker's segment.bytes; broker i (0-based) uses
    ``segment_bytes * (3 + i) // 3``. Partition p starts led by ``brokers[p % len(brokers)]`` at
    leader epoch 0. ``kraft`` adds each broker's ``__cluster_metadata-0``.
    """

    def __init__(
        self,
        root: Path,
        *,
        brokers: Sequence[int] = (1, 2, 3),
        topic: str = "repl.t",
        partitions: int = 2,
        seed: int = 0,
        segment_bytes: int = 4096,
        kraft: bool = False,
        records_per_batch: int = 4,
        value_bytes: int = 64,
    ) -> None:
        naming.validate_topic(topic)
        self.root = Path(root)
        self.brokers = tuple(brokers)
        self.topic = topic
        rng = random.Random(seed)
        self.topic_id = md.uuid_from_bytes(rng.randbytes(16))
        self.cluster_id = md.uuid_from_bytes(rng.randbytes(16))
        self.log_dirs = {b: self.root / f"broker-{b}" for b in self.brokers}
        for broker, log_dir in self.log_dirs.items():
            write_meta_properties(log_dir, broker, self.cluster_id)
        self.partitions: list[ReplicatedPartition] = []
        for p in range(partitions):
            replicas = {}
            for i, broker in enumerate(self.brokers):
                seg = segment_bytes * (3 + i) // 3
                writer = _new_writer(self.log_dirs[broker], topic, p, seg, self.topic_id)
                replicas[broker] = Replica(broker, self.log_dirs[broker], seg, self.topic_id, writer)
            part = ReplicatedPartition(
                topic,
                p,
                self.topic_id,
                replicas,
                self.brokers[p % len(self.brokers)],
                random.Random(rng.getrandbits(64)),
                records_per_batch=records_per_batch,
                value_bytes=value_bytes,
            )
            part._commit()
            self.partitions.append(part)
        self._metadata: dict[int, LogWriter] = {}
        if kraft:
            self._metadata = {b: metadata_writer(d, clock=lambda: EPOCH_MS) for b, d in self.log_dirs.items()}
            # A dynamic topic config as a broker's metadata log carries one. Not remote.storage.enable:
            # =true means Kafka's own tiered storage tiers the topic and rlm leaves it alone
            # (docs/topic-policy.md §2).
            records: list[md.MetadataRecord] = [
                md.TopicRecord(topic, self.topic_id),
                md.ConfigRecord(md.RESOURCE_TOPIC, topic, "cleanup.policy", "delete"),
            ]
            records += [
                md.PartitionRecord(
                    self.topic_id, p.partition, self.brokers, self.brokers, p.leader, p.leader_epoch, 0
                )
                for p in self.partitions
            ]
            self._metadata_append(records)

    # -- queries -------------------------------------------------------------------------------

    def partition(self, partition: int) -> ReplicatedPartition:
        return self.partitions[partition]

    def leaders(self) -> dict[str, int]:
        """``"<topic>-<partition>" -> leader broker`` (a static ``[cluster.leaders]`` table)."""
        return {p.name: p.leader for p in self.partitions}

    @property
    def kraft(self) -> bool:
        return bool(self._metadata)

    # -- the cluster's actions -----------------------------------------------------------------

    def append(self, batches: int, partitions: Iterable[int] | None = None) -> None:
        """Each (selected) partition's leader appends ``batches`` batches; followers copy them."""
        for p in self._select(partitions):
            p.append(batches)

    def roll(self, partitions: Iterable[int] | None = None) -> None:
        for p in self._select(partitions):
            p.roll()

    def grow(self, batches: int, partitions: Iterable[int] | None = None, *, roll: bool = True) -> None:
        """Append ``batches`` batches to each (selected) partition (each broker rolls by size at its
        own points), then, with ``roll``, roll every replica: all offsets so far are in closed
        segments. Without it each replica's active segment stays open where its own rolls left it,
        so a new leader's segment straddles what the old one tiered."""
        for p in self._select(partitions):
            p.append(batches)
            if roll:
                p.roll()

    def move_leader(self, partition: int, broker: int) -> None:
        """A clean leader change to in-sync ``broker``: the leader epoch goes up by one."""
        p = self.partitions[partition]
        if not p.replicas[broker].in_sync:
            raise ValueError(f"broker {broker} is not in the ISR of {p.name}; use unclean_elect")
        self._new_leader(p, broker)

    def isolate(self, partition: int, broker: int) -> int:
        """``broker`` (not the leader) falls out of the ISR; returns its log end (T)."""
        p = self.partitions[partition]
        if broker == p.leader:
            raise ValueError(f"broker {broker} leads {p.name}")
        p.replicas[broker].in_sync = False
        self._metadata_append([md.PartitionChangeRecord(p.topic_id, p.partition, isr=p.isr)])
        return p.replicas[broker].log_end_offset

    def unclean_elect(self, partition: int, broker: int) -> int:
        """Out-of-sync ``broker`` becomes leader under a higher epoch; every other replica is left
        out of the ISR with its (now diverged) tail. Returns the new epoch's start offset."""
        p = self.partitions[partition]
        for b, replica in p.replicas.items():
            replica.in_sync = b == broker
        self._new_leader(p, broker)
        return p.log_end_offset

    def rejoin(self, partition: int, broker: int) -> int:
        """``broker`` truncates to where it agrees with the leader and follows it again (stop its
        sidecar first). Returns the truncation offset."""
        p = self.partitions[partition]
        cut = p.truncate_and_follow(broker)
        self._metadata_append([md.PartitionChangeRecord(p.topic_id, p.partition, isr=p.isr)])
        return cut

    def _new_leader(self, p: ReplicatedPartition, broker: int) -> None:
        p.leader = broker
        p.leader_epoch += 1
        p.leader_changes += 1
        self._metadata_append([md.PartitionChangeRecord(p.topic_id, p.partition, leader=broker, isr=p.isr)])
        p._commit()

    def _metadata_append(self, records: list[md.MetadataRecord]) -> None:
        for writer in self._metadata.values():
            write_records(writer, [records], timestamp=EPOCH_MS)

    def _select(self, partitions: Iterable[int] | None) -> list[ReplicatedPartition]:
        return self.partitions if partitions is None else [self.partitions[p] for p in partitions]

    def close(self) -> None:
        """Close every writer (final time-index entries, checkpoints written)."""
        for p in self.partitions:
            for replica in p.replicas.values():
                replica.writer.close()
        for writer in self._metadata.values():
            writer.close()

    def __enter__(self) -> ReplicaSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_batches(partition_dir: Path) -> list[bytes]:
    """Every batch of a partition directory's segments, in offset order, as Kafka's bytes."""
    out = []
    for log in sorted(partition_dir.glob("*" + naming.LOG)):
        data = log.read_bytes()
        out += [data[b.position : b.end_position] for b in iter_batches(data)]
    return out
