"""Which topics are tiered and with which remote retention: the one place that decides.

Sources, in precedence order (docs/topic-policy.md):

1. ``[topics] exclude`` patterns, then internal logs (``__``-prefixed names and the KRaft log: never
   tiered unless an ``include`` pattern starting with ``__`` names them), then ``include``.
2. Kafka's topic configs from the KRaft metadata log when ``follow_kafka_configs`` is on:
   ``remote.storage.enable`` (when any topic sets it to true, topics that do not set it are not
   tiered), ``retention.ms``, ``retention.bytes``, ``cleanup.policy``.
3. The first ``[topics.overrides."<glob>"]`` matching the topic.
4. Kafka's broker-level configs (this broker's, then the cluster-wide default): ``log.retention.*``,
   ``log.cleanup.policy``.
5. rlm's defaults (``[tiering] retention_ms`` / ``retention_bytes``; tiered; ``delete``).

Compacted topics (``cleanup.policy`` contains ``compact``) are not tiered unless
``archive_compacted`` is set for them. Retention set by Kafka applies, as in Kafka, to the whole
log: size retention counts the local bytes not yet tiered too; rlm's own limits count remote bytes.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from rlm.config import Settings, TopicOverride
from rlm.errors import RlmError
from rlm.formats import naming
from rlm.logdir.kraft import (
    METADATA_LOG_DIR,
    KraftMetadataLog,
    MetadataImage,
    find_metadata_log,
    read_node_id,
)
from rlm.logdir.scan import (
    EligibilityPolicy,
    LogDirCheckpoints,
    PartitionDir,
    cleaned_partitions,
    list_segments,
)
from rlm.tiering.state import PartitionContext, Progress
from rlm.tiering.visibility import partition_offsets

__all__ = [
    "PolicyMetrics",
    "Setting",
    "TopicPolicy",
    "TopicPolicyResolver",
    "excluded_row",
    "retention_limits",
]

log = logging.getLogger(__name__)

KAFKA, OVERRIDE, DEFAULT = "kafka", "override", "default"
_RETENTION_MS_BROKER = (
    ("log.retention.ms", 1),
    ("log.retention.minutes", 60_000),
    ("log.retention.hours", 3_600_000),
)


@dataclass(frozen=True, slots=True)
class Setting:
    """One value of the policy and where it came from: ``source`` is ``kafka``, ``override`` or
    ``default``; ``origin`` says exactly which key or pattern."""

    value: Any
    source: str
    origin: str

    def as_dict(self) -> dict[str, Any]:
        return {"value": self.value, "source": self.source, "from": self.origin}


@dataclass(frozen=True, slots=True)
class TopicPolicy:
    """The policy in force for one topic. ``reason_code`` (metric label) and ``reason`` say why a
    topic is not tiered (``None`` when it is)."""

    topic: str
    tiered: bool
    reason_code: str | None
    reason: str | None
    enabled: Setting
    retention_ms: Setting
    retention_bytes: Setting
    cleanup_policy: Setting
    archive_compacted: bool
    topic_id: str | None = None

    @property
    def compacted(self) -> bool:
        return "compact" in str(self.cleanup_policy.value).split(",")

    @property
    def source(self) -> str:
        """Where the tier / not-tier decision came from: ``selection`` ([topics] patterns and the
        internal rule), ``kafka``, ``override`` or ``default``."""
        if self.reason_code in ("exclude", "include", "internal"):
            return "selection"
        if self.reason_code == "compacted":
            return str(self.cleanup_policy.source)
        return str(self.enabled.source)

    @property
    def whole_log_size(self) -> bool:
        """True when size retention counts local-only bytes as well (Kafka's retention.bytes)."""
        return self.retention_bytes.source == KAFKA

    def as_dict(self) -> dict[str, Any]:
        return {
            "tiered": self.tiered,
            "source": self.source,
            "reason": self.reason,
            "topic_id": self.topic_id,
            "enabled": self.enabled.as_dict(),
            "retention_ms": self.retention_ms.as_dict(),
            "retention_bytes": self.retention_bytes.as_dict(),
            "retention_bytes_scope": "whole log" if self.whole_log_size else "remote",
            "cleanup_policy": self.cleanup_policy.as_dict(),
            "archive_compacted": self.archive_compacted,
        }


def _int_config(text: str, key: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        log.warning("Kafka config %s=%r is not an integer; ignored", key, text)
        return None


class TopicPolicyResolver:
    """Resolves :class:`TopicPolicy` per topic from the settings and, when followed, the KRaft log.

    :meth:`refresh` polls the metadata log (incremental; cheap when nothing changed). A metadata
    log that fails to read keeps the last image that did, and the error shows in :attr:`error`.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        t = settings.topics
        self.metadata_dir = t.metadata_log_dir or find_metadata_log(settings.log.dirs)
        self.follow = (
            t.follow_kafka_configs if t.follow_kafka_configs is not None else (self.metadata_dir is not None)
        )
        self._log = KraftMetadataLog(self.metadata_dir) if self.follow and self.metadata_dir else None
        self.node_id = read_node_id(settings.log.dirs)
        self.image: MetadataImage | None = None
        self.error: str | None = None
        self.cleaned: frozenset[str] = frozenset()  # topics Kafka's log cleaner compacts
        self._opt_in = False  # some topic sets remote.storage.enable=true
        self._refreshed: float | None = None
        self._lock = threading.Lock()

    def refresh(self, *, max_age_s: float = 0.0) -> None:
        """Re-read what is new: the metadata log, and each log dir's cleaner checkpoint; skipped
        when the last refresh is younger than ``max_age_s`` (the read path's per-request calls)."""
        with self._lock:
            now = time.monotonic()
            if self._refreshed is not None and now - self._refreshed < max_age_s:
                return
            self._refreshed = now
            cleaned: set[str] = set()
            for log_dir in self.settings.log.dirs:
                try:
                    cleaned.update(topic for topic, _ in cleaned_partitions(log_dir))
                except RlmError as err:
                    log.warning("%s (ignored)", err)
            self.cleaned = frozenset(cleaned)
            if self._log is None:
                return
            try:
                image = self._log.poll()
                if image is not self.image:  # "tier only those": known once per image, not per topic
                    self._opt_in = any(
                        c.get("remote.storage.enable", "").strip().lower() == "true"
                        for c in image.topic_configs.values()
                    )
                self.image, self.error = image, None
            except RlmError as err:
                if self.error != str(err):
                    log.error("KRaft metadata log: %s (keeping the last image read)", err)
                self.error = str(err)

    # -- resolution ------------------------------------------------------------------------------

    def classify(
        self, parts: list[PartitionDir]
    ) -> tuple[
        list[PartitionDir], list[tuple[PartitionDir, TopicPolicy]], dict[tuple[str, int], TopicPolicy]
    ]:
        """``parts`` split into the tiered ones and the others (with their policy), plus every
        partition's policy (resolved once per topic)."""
        by_topic: dict[str, TopicPolicy] = {}
        policies: dict[tuple[str, int], TopicPolicy] = {}
        tiered: list[PartitionDir] = []
        excluded: list[tuple[PartitionDir, TopicPolicy]] = []
        for part in parts:
            if part.topic not in by_topic:
                by_topic[part.topic] = self.policy(part.topic)
            pol = policies[(part.topic, part.partition)] = by_topic[part.topic]
            if pol.tiered:
                tiered.append(part)
            else:
                excluded.append((part, pol))
        return tiered, excluded, policies

    def _override(self, topic: str) -> TopicOverride | None:
        overrides = self.settings.topics.overrides
        return next((o for o in overrides if fnmatch.fnmatchcase(topic, o.pattern)), None)

    def _selection(self, topic: str) -> tuple[str, str] | None:
        """(reason code, reason) when the patterns or the internal rule exclude ``topic``."""
        t = self.settings.topics
        hit = next((p for p in t.exclude if fnmatch.fnmatchcase(topic, p)), None)
        if hit is not None:
            return "exclude", f"excluded by [topics] exclude pattern {hit!r}"
        internal = topic.startswith("__") or naming.is_internal_topic(topic)
        matches = [p for p in t.include if fnmatch.fnmatchcase(topic, p)]
        if internal and not any(p.startswith("__") for p in matches):
            what = "the KRaft metadata log" if f"{topic}-0" == METADATA_LOG_DIR else "an internal topic"
            return "internal", f"{what}: never tiered unless an include pattern starting with __ names it"
        if not matches:
            return "include", "not matched by any [topics] include pattern"
        return None

    def policy(self, topic: str) -> TopicPolicy:
        image = self.image if self.follow else None
        topic_cfg = image.topic_configs.get(topic, {}) if image is not None else {}
        override = self._override(topic)
        enabled = self._enabled(topic, topic_cfg, override, image)
        cleanup = self._cleanup(topic, topic_cfg, image)
        archive = bool(override and override.archive_compacted)
        reason = self._selection(topic)
        if reason is None and not enabled.value:
            code = "override-disabled" if enabled.source == OVERRIDE else "kafka-disabled"
            reason = code, f"tiering disabled: {enabled.origin}"
        # Kafka deletes by retention only under cleanup.policy "delete": a compact-only topic's
        # retention.* (and the broker's log.retention.*) never apply to it, so nor to its archive.
        kafka_retention = None if "delete" not in str(cleanup.value).split(",") else image
        topic_retention = topic_cfg if kafka_retention is not None else {}
        policy = TopicPolicy(
            topic,
            False,
            None,
            None,
            enabled,
            self._retention(topic_retention, override, kafka_retention, "retention.ms", "retention_ms"),
            self._retention(topic_retention, override, kafka_retention, "retention.bytes", "retention_bytes"),
            cleanup,
            archive,
            image.topics_by_name[topic].topic_id
            if image is not None and topic in image.topics_by_name
            else None,
        )
        if reason is None and policy.compacted and not archive:
            reason = (
                "compacted",
                (
                    f"compacted topic (cleanup.policy={cleanup.value}, {cleanup.origin}); "
                    "set archive_compacted to tier it as an archive"
                ),
            )
        if reason is None:
            return dataclasses.replace(policy, tiered=True)
        return dataclasses.replace(policy, reason_code=reason[0], reason=reason[1])

    def _enabled(
        self, topic: str, cfg: dict[str, str], override: TopicOverride | None, image: MetadataImage | None
    ) -> Setting:
        if "remote.storage.enable" in cfg:
            value = cfg["remote.storage.enable"].strip().lower() == "true"
            return Setting(value, KAFKA, f"remote.storage.enable={cfg['remote.storage.enable']} on the topic")
        if override is not None and override.enabled is not None:
            return Setting(override.enabled, OVERRIDE, f"override {override.pattern!r} enabled")
        if image is not None and self._opt_in:
            return Setting(
                False,
                KAFKA,
                "remote.storage.enable is not set on this topic while other "
                "topics set it (only those are tiered)",
            )
        return Setting(True, DEFAULT, "every selected topic is tiered")

    def _broker_value(self, image: MetadataImage | None, key: str) -> tuple[str, str] | None:
        """(value, origin) of a broker-level config: this broker's own, then the cluster default."""
        if image is None:
            return None
        for name, label in ((self.node_id, f"broker {self.node_id}"), ("", "cluster default")):
            if name is not None and key in image.broker_configs.get(name, {}):
                return image.broker_configs[name][key], label
        return None

    def _retention(
        self,
        cfg: dict[str, str],
        override: TopicOverride | None,
        image: MetadataImage | None,
        kafka_key: str,
        rlm_key: str,
    ) -> Setting:
        if kafka_key in cfg and (value := _int_config(cfg[kafka_key], kafka_key)) is not None:
            return Setting(value, KAFKA, f"{kafka_key} on the topic")
        if override is not None and getattr(override, rlm_key) is not None:
            return Setting(getattr(override, rlm_key), OVERRIDE, f"override {override.pattern!r} {rlm_key}")
        broker_keys = _RETENTION_MS_BROKER if kafka_key == "retention.ms" else (("log.retention.bytes", 1),)
        for key, unit in broker_keys:
            found = self._broker_value(image, key)
            if found is not None and (value := _int_config(found[0], key)) is not None:
                return Setting(value * unit if value >= 0 else -1, KAFKA, f"{key} ({found[1]})")
        return Setting(getattr(self.settings.tiering, rlm_key), DEFAULT, f"[tiering] {rlm_key}")

    def _cleanup(self, topic: str, cfg: dict[str, str], image: MetadataImage | None) -> Setting:
        if "cleanup.policy" in cfg:
            return Setting(cfg["cleanup.policy"], KAFKA, "cleanup.policy on the topic")
        if topic in self.cleaned:
            return Setting("compact", KAFKA, "Kafka's log cleaner compacts it (cleaner-offset-checkpoint)")
        found = self._broker_value(image, "log.cleanup.policy")
        if found is not None:
            return Setting(found[0], KAFKA, f"log.cleanup.policy ({found[1]})")
        return Setting("delete", DEFAULT, "no cleanup.policy known (Kafka's default)")

    def describe(self) -> dict[str, Any]:
        """Where Kafka configs come from, for status."""
        return {
            "follow_kafka_configs": self.follow,
            "metadata_log": str(self.metadata_dir) if self.metadata_dir else None,
            "metadata_offset": self.image.offset if self.image is not None else None,
            "metadata_error": self.error,
            "metadata_gaps": list(self.image.gaps) if self.image is not None else [],
        }


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
            "Remote retention by time in force (-1 = unlimited)",
            labels,
            registry=registry,
        )
        self.retention_bytes = Gauge(
            "rlm_topic_policy_retention_bytes",
            "Remote retention by size in force (-1 = unlimited)",
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
                return  # every discovery publishes: ~4 gauge updates per partition saved when unchanged
            self._published = dict(policies)
            for key in set(self._seen) - set(policies):
                self._drop(key)
            counts: dict[str, int] = {}
            for (topic, partition), pol in policies.items():
                self._set(
                    self.tiered, (topic, partition), (topic, str(partition), pol.source), int(pol.tiered)
                )
                for gauge, setting in (
                    (self.retention_ms, pol.retention_ms),
                    (self.retention_bytes, pol.retention_bytes),
                ):
                    self._set(
                        gauge, (topic, partition), (topic, str(partition), setting.source), setting.value
                    )
                if pol.reason_code is not None:
                    counts[pol.reason_code] = counts.get(pol.reason_code, 0) + 1
            for code in {
                "exclude",
                "internal",
                "include",
                "override-disabled",
                "kafka-disabled",
                "compacted",
            }:
                self.excluded.labels(reason=code).set(counts.get(code, 0))

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


def retention_limits(pol: TopicPolicy, ctx: PartitionContext) -> dict[str, int]:
    """``apply_retention`` keywords for a partition. Kafka's retention.bytes limits the whole log,
    so the local bytes above the highest tiered offset count towards it; rlm's own limits count
    remote bytes only."""
    local_only = 0
    if pol.whole_log_size:
        highest = ctx.progress.highest_tiered_offset
        local_only = sum(s.size for s in list_segments(ctx.part) if s.base_offset > highest)
    return {
        "retention_ms": int(pol.retention_ms.value),
        "retention_bytes": int(pol.retention_bytes.value),
        "local_only_bytes": local_only,
    }


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
