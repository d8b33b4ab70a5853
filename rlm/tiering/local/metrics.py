"""Prometheus metrics of the tiering engine, named after Kafka's tiered-storage metrics.

Kafka exposes meters such as ``RemoteCopyBytesPerSec``; Prometheus computes rates itself, so each
meter is a ``_total`` counter here (``rate(rlm_remote_copy_bytes_total[1m])`` is Kafka's
``RemoteCopyBytesPerSec``). Every metric's help text names the Kafka metric it mirrors. Labels:
``topic`` and ``partition``. Each :class:`TieringMetrics` has its own registry so several
managers (tests) never collide.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric

from rlm.logdir.indexcheck import rebuild_counts
from rlm.storage.metering import RequestMeter
from rlm.tiering.store import parse_root

__all__ = ["TieringMetrics"]

_TP = ("topic", "partition")


class _QuarantineFacts(Protocol):
    @property
    def base_offset(self) -> int: ...
    @property
    def file(self) -> str: ...
    @property
    def position(self) -> int | None: ...
    @property
    def cause(self) -> str: ...


class _IndexRebuilds:
    """``rlm_local_index_rebuilds_total``: broker index file versions that failed their check and
    were rebuilt from the ``.log``, counted once each by :func:`rlm.logdir.indexcheck.note_rebuilt`
    (whoever found it: a copy, a lookup, a reader)."""

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "rlm_local_index_rebuilds",
            "Broker .index/.timeindex files that failed Kafka's sanity "
            "check and were rebuilt from the .log (Kafka logs 'Found a corrupted index file' and "
            "rebuilds it)",
            labels=(*_TP, "index"),
        )
        for (topic, partition, kind), count in sorted(rebuild_counts().items()):
            family.add_metric([topic, str(partition), kind], count)
        yield family


class TieringMetrics:
    """The tiering engine's metrics in one registry, declared by concern; the order of declaration
    is the order of a ``/metrics`` scrape."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._declare_copy(self.registry)
        self._declare_delete(self.registry)
        self._declare_remote_log(self.registry)
        self._declare_segment_health(self.registry)
        self._declare_tasks(self.registry)
        self._declare_passes(self.registry)
        self._declare_pins(self.registry)
        self._declare_deleted_topics(self.registry)
        #: The metrics the status page's history totals over every partition (history.py), and a
        #: count of the times a partition's series of one of them was handed out to be updated
        #: (PartitionContext.series): while it stands, the totals stand, and the history does not
        #: walk every partition's series again (at 10 000 partitions a walk is ~0.4 s of CPU).
        self.totalled = frozenset(
            (
                self.copy_bytes,
                self.copy_requests,
                self.copy_errors,
                self.copy_lag_bytes,
                self.copy_lag_segments,
                self.remote_log_size,
            )
        )
        self.totals_version = 0

    def _declare_deleted_topics(self, r: CollectorRegistry) -> None:
        """Deleted topics' remote data waiting for ``tiering.deleted_topic_grace_ms``
        (rlm.tiering.expire.deleted_topics, docs/topic-identity.md; Kafka's own RLM deletes a deleted
        topic's remote data at once, so it has no such metric). Set by each GC."""
        self.deleted_topic_partitions = Gauge(
            "rlm_deleted_topic_partitions_waiting",
            "Partitions of deleted topics whose remote data waits for tiering.deleted_topic_grace_ms "
            "(or is kept by tiering.keep_old_incarnations), as the last GC found them",
            registry=r,
        )
        self.deleted_topic_bytes = Gauge(
            "rlm_deleted_topic_bytes_waiting",
            "Bytes of remote data those partitions still hold in the store",
            registry=r,
        )
        self.deleted_topic_next_delete = Gauge(
            "rlm_deleted_topic_next_delete_timestamp_seconds",
            "When the next deleted topic's remote data goes (epoch seconds); +Inf when none waits",
            registry=r,
        )
        self.deleted_topic_next_delete.set(float("inf"))

    def _declare_pins(self, r: CollectorRegistry) -> None:
        """What rlm holds of the broker's files per log dir (rlm.tiering.local.pin_ledger; Kafka's own
        RLM never lets retention delete an untiered segment, so it has no such metric)."""
        self.pinned_bytes = Gauge(
            "rlm_pinned_bytes",
            "Bytes of broker segment files rlm holds with hard links in this log dir (pins on "
            "sight and copies in flight, each inode once), bounded by tiering.max_pinned_bytes",
            ("log_dir",),
            registry=r,
        )
        self.pinned_segments = Gauge(
            "rlm_pinned_segments",
            "Segments pinned on sight in this log dir (rolled, committed, not yet tiered)",
            ("log_dir",),
            registry=r,
        )
        self.pin_bound_reached = Gauge(
            "rlm_pin_bound_reached",
            "1 while tiering.max_pinned_bytes keeps a pending segment of this log dir from being "
            "pinned (the broker may delete it before it is tiered), else 0",
            ("log_dir",),
            registry=r,
        )
        self.pin_refused = Counter(
            "rlm_pin_refused",
            "Pending segments tiering.max_pinned_bytes kept from being pinned on sight",
            ("log_dir",),
            registry=r,
        )

    def _declare_copy(self, r: CollectorRegistry) -> None:
        """Kafka's RemoteCopy* meters and lags."""
        self.copy_bytes = Counter(
            "rlm_remote_copy_bytes",
            "Bytes copied to remote storage (Kafka: RemoteCopyBytesPerSec)",
            _TP,
            registry=r,
        )
        self.copy_requests = Counter(
            "rlm_remote_copy_requests", "Segments copied (Kafka: RemoteCopyRequestsPerSec)", _TP, registry=r
        )
        self.copy_errors = Counter(
            "rlm_remote_copy_errors", "Failed segment copies (Kafka: RemoteCopyErrorsPerSec)", _TP, registry=r
        )
        self.copy_lag_bytes = Gauge(
            "rlm_remote_copy_lag_bytes",
            "Bytes of eligible segments not yet remote (Kafka: RemoteCopyLagBytes)",
            _TP,
            registry=r,
        )
        self.copy_lag_segments = Gauge(
            "rlm_remote_copy_lag_segments",
            "Eligible segments not yet remote (Kafka: RemoteCopyLagSegments)",
            _TP,
            registry=r,
        )

    def _declare_delete(self, r: CollectorRegistry) -> None:
        """Kafka's RemoteDelete* meters and lags (retention)."""
        self.delete_requests = Counter(
            "rlm_remote_delete_requests",
            "Remote segments deleted by retention (Kafka: RemoteDeleteRequestsPerSec)",
            _TP,
            registry=r,
        )
        self.delete_errors = Counter(
            "rlm_remote_delete_errors",
            "Failed remote deletes (Kafka: RemoteDeleteErrorsPerSec)",
            _TP,
            registry=r,
        )
        self.delete_lag_bytes = Gauge(
            "rlm_remote_delete_lag_bytes",
            "Remote bytes past retention, not yet deleted (Kafka: RemoteDeleteLagBytes)",
            _TP,
            registry=r,
        )
        self.delete_lag_segments = Gauge(
            "rlm_remote_delete_lag_segments",
            "Remote segments past retention (Kafka: RemoteDeleteLagSegments)",
            _TP,
            registry=r,
        )

    def _declare_remote_log(self, r: CollectorRegistry) -> None:
        """The size of the remote log and how far the log store may delete local data."""
        self.remote_log_size = Gauge(
            "rlm_remote_log_size_bytes",
            "Bytes of committed remote segments (Kafka: RemoteLogSizeBytes)",
            _TP,
            registry=r,
        )
        self.remote_segments = Gauge(
            "rlm_remote_log_metadata_count",
            "Committed remote segments (Kafka: RemoteLogMetadataCount)",
            _TP,
            registry=r,
        )
        self.highest_tiered = Gauge(
            "rlm_highest_tiered_offset",
            "Highest offset safe in remote storage: the store may delete local data up to it",
            _TP,
            registry=r,
        )

    def _declare_segment_health(self, r: CollectorRegistry) -> None:
        """Segments deleted before their copy, quarantined ones, rebuilt broker indexes
        (docs/broker-files.md)."""
        self.skipped_deleted = Counter(
            "rlm_segments_deleted_before_copy",
            "Eligible segments the log store deleted before rlm copied them",
            _TP,
            registry=r,
        )
        self.retention_margin = Gauge(
            "rlm_retention_margin_seconds",
            "Seconds until the broker's local retention may delete the oldest segment not yet "
            "tiered that it still has (negative: overdue; +Inf: no deadline; docs/topic-policy.md §8)",
            _TP,
            registry=r,
        )
        self.gap_offsets = Gauge(
            "rlm_gap_offsets",
            "Offsets no tier holds: the broker deleted them before rlm tiered them "
            "(the recorded gaps, docs/visibility.md)",
            _TP,
            registry=r,
        )
        self.quarantined = Gauge(
            "rlm_segments_quarantined",
            "Rolled segments whose .log is empty, "
            "torn or fails CRC verification; they block tiering of their "
            "partition",
            _TP,
            registry=r,
        )
        self.quarantine_info = Gauge(
            "rlm_segment_quarantine_info",
            "1 per quarantined segment: its "
            ".log file, the byte position of the damage and the cause "
            "(empty, torn_tail, corrupt)",
            (*_TP, "base_offset", "file", "position", "cause"),
            registry=r,
        )
        r.register(_IndexRebuilds())

    def _declare_tasks(self, r: CollectorRegistry) -> None:
        """Slow copies, GC deletions and the durations of copies and passes."""
        self.slow_copies = Counter(
            "rlm_copy_watchdog_slow", "Copies that took far longer than their size warrants", _TP, registry=r
        )
        self.orphans_deleted = Counter(
            "rlm_gc_orphan_objects_deleted", "Objects of abandoned attempts deleted by GC", _TP, registry=r
        )
        self.copy_seconds = Histogram(
            "rlm_remote_copy_task_seconds",
            "Duration of one segment copy (Kafka: RemoteLogManager copy task time)",
            _TP,
            registry=r,
            buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900),
        )
        self.task_seconds = Histogram(
            "rlm_partition_task_seconds",
            "Duration of one partition pass (copy + retention)",
            _TP,
            registry=r,
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120, 600),
        )

    def _declare_passes(self, r: CollectorRegistry) -> None:
        """Store requests per partition, idle passes and state loads."""
        # Store requests by operation and partition (docs/store-requests.md), counted by the
        # MeteringBackend the manager puts over its store.
        self.requests = RequestMeter(r, attribute=_partition_of_key)
        # Unlabeled: per-partition series would cost more than the passes they count.
        self.idle_passes = Counter(
            "rlm_partition_passes_idle",
            "Partition passes skipped because nothing "
            "the pass reads changed since a clean pass (docs/operations.md)",
            registry=r,
        )
        self.recoveries = Counter(
            "rlm_partition_recoveries",
            "Partition state loads at start or after a "
            "failed pass: source=local (trusted local files, no store request) or "
            "store (full recovery; docs/remote-state.md)",
            ("source",),
            registry=r,
        )

    def labels(self, topic: str, partition: int) -> dict[str, str]:
        return {"topic": topic, "partition": str(partition)}

    @staticmethod
    def _quarantine_labels(labels: dict[str, str], q: _QuarantineFacts) -> dict[str, str]:
        position = "" if q.position is None else str(q.position)
        return {
            **labels,
            "base_offset": str(q.base_offset),
            "file": q.file,
            "position": position,
            "cause": q.cause,
        }

    def quarantine_set(self, labels: dict[str, str], q: _QuarantineFacts) -> None:
        self.quarantine_info.labels(**self._quarantine_labels(labels, q)).set(1)

    def quarantine_clear(self, labels: dict[str, str], q: _QuarantineFacts) -> None:
        with contextlib.suppress(KeyError):  # never set in this registry (e.g. another manager)
            self.quarantine_info.remove(*self._quarantine_labels(labels, q).values())


def _partition_of_key(key: str) -> tuple[str, int] | None:
    """The partition whose root ``key`` lies under (docs/store-requests.md), else None."""
    root = parse_root(key)
    return (root.topic, root.partition) if root is not None else None
