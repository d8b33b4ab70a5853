"""The read side as a service: partition readers by name, offsets-for-times, for the CLI and HTTP.

Topic names are validated with Kafka's rules before they touch the file system (no path
traversal: ``..``, ``/`` and friends are refused), and only partitions discovered in the
configured log dirs can be read. Progress (highest tiered offset, remote log start) comes from a
live manager when one runs in the same process, else from what the daemon persisted.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rlm.cluster.log_starts import BrokerHighWatermarks, BrokerLogStarts, LogStartQuery
from rlm.config import Settings
from rlm.config.brokers import asks_log_starts
from rlm.errors import InvalidArgumentError, LogDirError, PartitionNotFoundError
from rlm.formats.checkpoint import EpochEntry
from rlm.formats.naming import is_served_topic, validate_topic
from rlm.fsutil import FileMemo, Signature
from rlm.logdir.checkpoint_cache import CheckpointCache
from rlm.logdir.discovery import PartitionDir, discover_partitions, known_partition_dir
from rlm.storage.api import StorageBackend
from rlm.tiering.converge import persisted_progress
from rlm.tiering.expire import TopicPolicyResolver
from rlm.tiering.local import Progress
from rlm.tiering.read.cache import RemoteRangeCache
from rlm.tiering.read.epochs import LeaderEpochs
from rlm.tiering.read.lookup import PartitionReader
from rlm.tiering.read.readahead import ReadAheadLimits, ReaderResources
from rlm.tiering.store import StoreProtection

__all__ = ["OffsetForTime", "ProgressSource", "TieredReaders", "check_partition_number", "check_topic_name"]

ProgressSource = Callable[[PartitionDir], Progress]

#: Partition directories a reader service remembers per log dir (then it starts over).
_MAX_KNOWN_DIRS = 65_536


@dataclass(frozen=True, slots=True)
class OffsetForTime:
    topic: str
    partition: int
    offset: int  # the reset target: first visible offset with timestamp >= ts, else the HW
    timestamp: int | None  # that record's timestamp; None when no record is that recent
    tier: str | None


def check_topic_name(topic: str) -> str:
    """A topic name a client sent, if Kafka allows it (else InvalidArgumentError on ``topic``)."""
    try:
        return validate_topic(topic)
    except LogDirError as err:
        raise InvalidArgumentError(err.reason, field="topic") from None


def check_partition_number(partition: int) -> int:
    """A partition number a client sent, if in [0, 2³¹−1] (else InvalidArgumentError on ``partition``)."""
    if not 0 <= partition <= 2**31 - 1:
        raise InvalidArgumentError(f"partition {partition} must be in [0, 2^31-1]", field="partition")
    return partition


class TieredReaders:
    def __init__(
        self,
        settings: Settings,
        backend: StorageBackend,
        *,
        progress: ProgressSource | None = None,
        cache: RemoteRangeCache | None = None,
        policies: TopicPolicyResolver | None = None,
        protection: StoreProtection | None = None,
        checkpoints: CheckpointCache | None = None,
        log_starts: BrokerLogStarts | None = None,
        high_watermarks: BrokerHighWatermarks | None = None,
    ) -> None:
        """``policies``: the daemon passes its manager's resolver (kept fresh by the passes), so one
        process reads the metadata log once; a one-shot command gets its own. ``protection``: the
        daemon passes its manager's (one key ring per process); else built from the settings.
        ``checkpoints``: the daemon passes its manager's cache of parsed log-dir checkpoints.
        ``log_starts``: where readers ask the broker's live log start; by default built from
        ``[cluster]`` when it names brokers (docs/visibility.md "Before the checkpoint reaches disk").
        ``high_watermarks``: the daemon passes its manager's, whose recent answers to the copy
        readers use as a newer visible end (never asking themselves)."""
        self.settings = settings
        self.resources = ReaderResources(
            backend,
            cache or RemoteRangeCache(settings.tiering.remote_cache_bytes),
            eligibility=settings.log.eligibility,
            limits=ReadAheadLimits.from_settings(settings.tiering),
            protection=protection or StoreProtection.from_settings(settings.remote),
            checkpoints=checkpoints or CheckpointCache(),
            broker_hw=high_watermarks.recent if high_watermarks is not None else None,
        )
        if log_starts is None and asks_log_starts(settings.cluster):
            log_starts = BrokerLogStarts(settings.cluster)
        self.log_starts = log_starts
        self._progress = progress or self._persisted_progress
        self.policies = policies or TopicPolicyResolver(settings)
        # Asked on every request: read again only when the file changed (docs/read-path.md).
        self._progress_files = FileMemo(Progress.load)
        self._epochs = LeaderEpochs(settings.tiering)
        # log dir -> partition dir name -> (partition.metadata signature, the PartitionDir read with it)
        self._dirs: dict[str, dict[str, tuple[Signature, PartitionDir]]] = {}

    def close(self) -> None:
        """Stop the connection to the cluster, if one was opened (the read-ahead threads are daemons)."""
        if self.log_starts is not None:
            self.log_starts.close()

    def log_start_query(self, batch: Sequence[tuple[str, int]] = ()) -> LogStartQuery | None:
        """One request's question to the broker about log starts, asked from now on; ``batch``:
        every (topic, partition) the request reads, asked together. None without brokers to ask."""
        if self.log_starts is None:
            return None
        return LogStartQuery(self.log_starts, self.log_starts.now(), tuple(batch))

    def _reader(self, part: PartitionDir, query: LogStartQuery | None = None) -> PartitionReader:
        """A reader; compacted topics answer tiered offsets from the remote tier (docs/topic-policy.md)."""
        reader = PartitionReader(part, self.resources, self._progress(part), query or self.log_start_query())
        self.policies.refresh(max_age_s=1.0)
        reader.remote_first = self.policies.policy(part.topic).compacted
        return reader

    def _persisted_progress(self, part: PartitionDir) -> Progress:
        # The incarnation's own state dir; nothing tiered when it is not this log's (topic identity).
        # Progress is mutable: each reader gets a copy of the memo's
        return persisted_progress(
            self.settings.tiering, part, lambda path: dataclasses.replace(self._progress_files.get(path))
        )

    def leader_epochs(self, part: PartitionDir, log_start: int) -> list[EpochEntry]:
        """The partition's leader-epoch lineage from the one in force at ``log_start``
        (rlm/tiering/read/epochs.py)."""
        return self._epochs.lineage(part, self._progress(part), log_start)

    def leader_epoch(self, part: PartitionDir) -> int:
        """The partition's current leader epoch as rlm serves it; -1 when none is known."""
        return self._epochs.latest(part, self._progress(part))

    def serves(self, topic: str) -> bool:
        """Whether ``topic`` may be served at all: never the KRaft log, Kafka's other internal
        logs only with ``[server] serve_internal_topics`` (docs/visibility.md, "Internal topics")."""
        return is_served_topic(topic, internal=self.settings.server.serve_internal_topics)

    def partitions(self, topics: Sequence[str] | None = None) -> list[PartitionDir]:
        """The served partitions in the log dirs (of ``topics`` when given)."""
        wanted = {check_topic_name(t) for t in topics} if topics else None
        parts = discover_partitions(self.settings.log.dirs)
        return [p for p in parts if (wanted is None or p.topic in wanted) and self.serves(p.topic)]

    def reader(self, topic: str, partition: int, query: LogStartQuery | None = None) -> PartitionReader:
        """The partition's reader; ``query``: the request's (:meth:`log_start_query`), else its own.
        A topic that is not served is unknown here, as a missing one (404, UNKNOWN_TOPIC_OR_PARTITION)."""
        check_topic_name(topic)
        check_partition_number(partition)
        if not self.serves(topic):
            raise PartitionNotFoundError(f"partition {topic}-{partition} is not served (an internal topic)")
        name = f"{topic}-{partition}"
        for log_dir in self.settings.log.dirs:
            path = os.path.join(log_dir, name)
            if os.path.isdir(path):
                return self._reader(self._partition_dir(os.fspath(log_dir), (topic, partition), path), query)
        raise PartitionNotFoundError(f"partition {topic}-{partition} is not in log.dirs")

    def _partition_dir(self, log_dir: str, parsed: tuple[str, int], path: str) -> PartitionDir:
        """The partition's directory, the same while its ``partition.metadata`` is unchanged (one
        ``stat``: no Paths built, no file read per request; logdir.known_partition_dir)."""
        known = self._dirs.get(log_dir)
        if known is None or len(known) >= _MAX_KNOWN_DIRS:
            known = self._dirs[log_dir] = {}  # a bound, not an LRU
        return known_partition_dir(log_dir, parsed, path, known, known)

    def offsets_for_times(
        self, timestamp: int, topics: Sequence[str] | None = None, minus_ms: int = 0
    ) -> list[OffsetForTime]:
        """Per partition: where a consumer should resume to read from ``timestamp - minus_ms`` on
        (KIP-33 failover). A partition with no visible record that recent resumes at its visible
        end (the high watermark, docs/visibility.md), never at the log end above it."""
        if minus_ms < 0:
            raise InvalidArgumentError(f"minus {minus_ms} ms must not be negative", field="minus")
        target = timestamp - minus_ms if timestamp >= 0 else timestamp
        if timestamp >= 0 and target < 0:
            target = 0
        parts = self.partitions(topics)
        query = self.log_start_query([(p.topic, p.partition) for p in parts])
        return [self._offset_for_time(self._reader(part, query), target) for part in parts]

    def offset_for_time(self, topic: str, partition: int, target: int) -> OffsetForTime:
        """One partition's row of :meth:`offsets_for_times` (``target`` already has the margin
        subtracted): the first visible offset with timestamp >= target, else the visible end."""
        return self._offset_for_time(self.reader(topic, partition), target)

    @staticmethod
    def _offset_for_time(reader: PartitionReader, target: int) -> OffsetForTime:
        part = reader.part
        found = reader.lookup_timestamp(target)
        if found.found and found.offset is not None:
            return OffsetForTime(part.topic, part.partition, found.offset, found.timestamp, found.tier)
        end = found.ranges.visible_end_offset
        return OffsetForTime(part.topic, part.partition, end if end is not None else 0, None, None)
