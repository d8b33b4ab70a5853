"""The topic policy as operators see it (docs/topic-policy.md §4): per-partition gauges of the
policy in force on each tier, the count of partitions not tiered per reason, and the status row
of a partition rlm leaves alone."""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from rlm.logdir.discovery import EligibilityPolicy, LogDirCheckpoints, PartitionDir, list_segments
from rlm.tiering.expire import Setting, TopicPolicy
from rlm.tiering.local import Progress
from rlm.tiering.read import partition_offsets

__all__ = ["EXCLUDED_REASONS", "PolicyMetrics", "excluded_row"]

#: Every ``reason`` label of ``rlm_partitions_excluded`` (a reason with no partition reads 0).
EXCLUDED_REASONS = (
    "exclude",
    "internal",
    "include",
    "override-disabled",
    "kafka-disabled",
    "kafka-tiered",
    "compacted",
)


class PolicyMetrics:
    """Per-partition gauges of the policy in force (labels include its source) and a count of
    excluded partitions per reason. A label set that no longer applies is removed."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ("topic", "partition", "source")
        self.tiered = Gauge(
            "rlm_topic_policy_tiered",
            "1 when the partition is tiered, 0 when the "
            "policy excludes it; source = where the decision came from",
            labels,
            registry=registry,
        )
        self.retention_ms = Gauge(
            "rlm_topic_policy_retention_ms",
            "Remote retention by time in force (-1 = unlimited); Kafka: retention.ms of a tiered topic",
            labels,
            registry=registry,
        )
        self.retention_bytes = Gauge(
            "rlm_topic_policy_retention_bytes",
            "Remote retention by size in force (-1 = unlimited); Kafka: retention.bytes of a tiered topic",
            labels,
            registry=registry,
        )
        self.local_retention_ms = Gauge(
            "rlm_topic_policy_local_retention_ms",
            "The broker's local retention by time as its configs say (-1 = unlimited); Kafka: "
            "retention.ms, or local.retention.ms on a broker with its own tiered storage",
            labels,
            registry=registry,
        )
        self.local_retention_bytes = Gauge(
            "rlm_topic_policy_local_retention_bytes",
            "The broker's local retention by size as its configs say (-1 = unlimited); Kafka: "
            "retention.bytes, or local.retention.bytes on a broker with its own tiered storage",
            labels,
            registry=registry,
        )
        self.compacted = Gauge(
            "rlm_compacted_local_segments",
            "Local segments of a compacted topic "
            "that the log cleaner rewrote after they were tiered (the remote tier "
            "keeps the pre-compaction history)",
            ("topic", "partition"),
            registry=registry,
        )
        self.excluded = Gauge(
            "rlm_partitions_excluded",
            "Partitions in the log dirs that are not tiered, per reason",
            ("reason",),
            registry=registry,
        )
        self._seen: dict[tuple[str, int], dict[Gauge, tuple[str, ...]]] = {}
        self._lock = threading.Lock()
        self._published: dict[tuple[str, int], TopicPolicy] | None = None

    def publish(self, policies: dict[tuple[str, int], TopicPolicy]) -> None:
        with self._lock:
            if policies == self._published:
                return  # every discovery publishes: ~6 gauge updates per partition saved when unchanged
            self._published = dict(policies)
            for key in set(self._seen) - set(policies):
                self._drop(key)
            counts: dict[str, int] = {}
            for (topic, partition), pol in policies.items():
                self._set(
                    self.tiered, (topic, partition), (topic, str(partition), pol.source), int(pol.tiered)
                )
                for gauge, setting in self._settings(pol):
                    self._set(
                        gauge, (topic, partition), (topic, str(partition), setting.source), setting.value
                    )
                if pol.reason_code is not None:
                    counts[pol.reason_code] = counts.get(pol.reason_code, 0) + 1
            for code in EXCLUDED_REASONS:
                self.excluded.labels(reason=code).set(counts.get(code, 0))

    def _settings(self, pol: TopicPolicy) -> tuple[tuple[Gauge, Setting], ...]:
        return (
            (self.retention_ms, pol.retention_ms),
            (self.retention_bytes, pol.retention_bytes),
            (self.local_retention_ms, pol.local_retention_ms),
            (self.local_retention_bytes, pol.local_retention_bytes),
        )

    def _set(self, gauge: Gauge, key: tuple[str, int], labels: tuple[str, ...], value: float) -> None:
        seen = self._seen.setdefault(key, {})
        old = seen.get(gauge)
        if old is not None and old != labels:
            gauge.remove(*old)
        seen[gauge] = labels
        gauge.labels(*labels).set(value)

    def _drop(self, key: tuple[str, int]) -> None:
        for gauge, labels in self._seen.pop(key, {}).items():
            gauge.remove(*labels)


def excluded_row(
    part: PartitionDir,
    pol: TopicPolicy,
    progress: Progress,
    checkpoints: LogDirCheckpoints,
    kafka: dict[str, Any],
    eligibility: EligibilityPolicy = "high-watermark",
) -> dict[str, Any]:
    """The status row of a partition the policy leaves alone: the same keys as a tiered one, from
    local facts and the persisted progress (the store is not asked), plus why it is not tiered."""
    segments = list_segments(part)
    offsets = partition_offsets(part, progress, segments, checkpoints, eligibility)
    return {
        "topic": part.topic,
        "partition": part.partition,
        "log_start_offset": offsets.log_start_offset,
        "local_log_start_offset": offsets.local_log_start_offset,
        "high_watermark": offsets.high_watermark,
        "log_end_offset": offsets.log_end_offset,
        "highest_tiered_offset": offsets.highest_tiered_offset,
        "remote_log_start_offset": offsets.remote_log_start_offset,
        "remote_segments": 0,
        "remote_bytes": 0,
        "copy_lag_segments": 0,
        "copy_lag_bytes": 0,
        "quarantined": {},
        "last_error": None,
        "eligible_end_offset": None,
        "copy_lag_age_ms": 0,
        "local_segments": len(segments),
        "local_bytes": sum(s.size for s in segments),
        "tiered": False,
        "excluded_reason": pol.reason,
        "compaction": [],
        "policy": pol.as_dict(),
        "kafka_configs": kafka,
        "visible_end_offset": offsets.visible_end_offset,  # docs/visibility.md
        "high_watermark_source": offsets.high_watermark_source,
        "delete_records_offset": offsets.delete_records_offset,
    }
