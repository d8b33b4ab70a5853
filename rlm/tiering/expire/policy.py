"""Which topics rlm tiers and with which retention on each tier: the one place that decides.

Selection, first rule that applies (docs/topic-policy.md §2): ``[topics] exclude`` patterns,
internal logs (``__``-prefixed names and the KRaft log: never tiered unless an ``include`` pattern
starting with ``__`` names them), ``include``; then, from Kafka's topic configs when
``follow_kafka_configs`` is on, ``remote.storage.enable=true`` (Kafka's own tiered storage tiers the
topic: left to it) or ``=false`` (off); the first matching ``[topics.overrides]``'s ``enabled``;
compacted topics only with ``archive_compacted``.

Retention (docs/topic-policy.md §1, ``rlm/tiering/expire/retention_sources.py``): the broker's
``retention.*`` is *local* retention, shown but never applied to the remote tier; remote retention
is rlm's (override, then ``[tiering]``), except a topic's own ``retention.*`` when it also sets
``local.retention.*`` (KIP-405's split, meant by the operator): that limit covers the whole log, so
size retention counts the local bytes not yet tiered too.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from rlm.config import Settings, TopicOverride
from rlm.errors import RlmError
from rlm.formats import naming
from rlm.logdir.discovery import PartitionDir, cleaned_partitions, list_segments
from rlm.logdir.kraft import (
    METADATA_LOG_DIR,
    KraftMetadataLog,
    MetadataImage,
    find_metadata_log,
    read_node_id,
)
from rlm.tiering.expire.retention_sources import (
    BYTES,
    DEFAULT,
    DIMENSIONS,
    KAFKA,
    MS,
    OVERRIDE,
    Setting,
    legacy_remote,
    local_retention,
    looser,
    remote_retention,
)
from rlm.tiering.local import PartitionContext

__all__ = [
    "Setting",
    "TopicPolicy",
    "TopicPolicyResolver",
    "retention_limits",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TopicPolicy:
    """The policy in force for one topic. ``reason_code`` (metric label) and ``reason`` say why a
    topic is not tiered (``None`` when it is). ``retention_*`` are the remote tier's limits (what
    rlm deletes), ``local_retention_*`` what the broker keeps locally (shown, never applied)."""

    topic: str
    tiered: bool
    reason_code: str | None
    reason: str | None
    enabled: Setting
    retention_ms: Setting
    retention_bytes: Setting
    cleanup_policy: Setting
    local_retention_ms: Setting
    local_retention_bytes: Setting
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
        """True when size retention counts local-only bytes as well: only a topic's own
        ``retention.bytes`` read as KIP-405's whole-log limit (docs/topic-policy.md §1)."""
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
            "local_retention_ms": self.local_retention_ms.as_dict(),
            "local_retention_bytes": self.local_retention_bytes.as_dict(),
            "cleanup_policy": self.cleanup_policy.as_dict(),
            "archive_compacted": self.archive_compacted,
        }


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
        self._warned: set[tuple[str, str, int, int]] = set()  # upgrade warnings already logged
        self._refreshed: float | None = None
        self._lock = threading.Lock()
        # policy() per topic, valid while the image and the cleaned topics it was resolved from are
        # the ones in force: asked on every Fetch, resolving costs more than the read's lookup.
        self._memo: tuple[tuple[MetadataImage | None, frozenset[str]], dict[str, TopicPolicy]] = (
            (None, frozenset()),
            {},
        )
        #: topic → the policy last handed out: a new resolution equal to it hands it out again, so
        #: what compares policies per partition (the metrics' publish, the idle fingerprint's
        #: policy_key) finds the same object across images instead of comparing every field.
        #: Kept to the topics of the last :meth:`classify` (deleted topics are forgotten).
        self._last: dict[str, TopicPolicy] = {}

    def refreshed_image(self) -> MetadataImage | None:
        """The KRaft metadata image after a :meth:`refresh` (None without a metadata log)."""
        self.refresh()
        return self.image

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
                self.image, self.error = self._log.poll(), None
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
        self._last = dict(by_topic)  # the topics of this discovery only
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
        """``topic``'s policy as the settings, the metadata image and the cleaned topics now
        say. Memoized until :meth:`refresh` brings another image (a poll that changes anything
        returns a new one: rlm/logdir/kraft.py) or other cleaned topics; a resolution equal to
        the policy last handed out hands that object out again."""
        image, cleaned = self.image, self.cleaned
        (seen_image, seen_cleaned), memo = self._memo
        if seen_image is not image or seen_cleaned != cleaned:
            memo = {}  # a racing thread may still fill the old dict: it is dropped with it
            self._memo = ((image, cleaned), memo)
        found = memo.get(topic)
        if found is None:
            found = self._resolve(topic)
            last = self._last.get(topic)
            if last == found:
                found = last
            else:
                self._last[topic] = found
            memo[topic] = found
        return found

    def _resolve(self, topic: str) -> TopicPolicy:
        image = self.image if self.follow else None
        cfg = image.topic_configs.get(topic, {}) if image is not None else {}
        override = self._override(topic)
        enabled = self._enabled(cfg, override)
        cleanup = self._cleanup(topic, cfg, image)
        archive = bool(override and override.archive_compacted)
        kafka_tiered = _kafka_tiers(cfg)
        # Kafka deletes by retention only under cleanup.policy "delete": a compact-only topic's
        # retention.* never applies to it, so nor to its archive.
        deletes = "delete" in str(cleanup.value).split(",")
        remote = {
            dim: remote_retention(
                dim, cfg, override, int(getattr(self.settings.tiering, dim.rlm_key)), deletes=deletes
            )
            for dim in DIMENSIONS
        }
        local = {
            dim: local_retention(
                dim,
                cfg,
                lambda key: self._broker_value(image, key),
                cleanup=cleanup,
                kafka_tiered=kafka_tiered,
                follow=self.follow,
            )
            for dim in DIMENSIONS
        }
        policy = TopicPolicy(
            topic,
            False,
            None,
            None,
            enabled,
            retention_ms=remote[MS],
            retention_bytes=remote[BYTES],
            cleanup_policy=cleanup,
            local_retention_ms=local[MS],
            local_retention_bytes=local[BYTES],
            archive_compacted=archive,
            topic_id=image.topics_by_name[topic].topic_id
            if image is not None and topic in image.topics_by_name
            else None,
        )
        reason = self._selection(topic) or _decision(policy, kafka_tiered)
        if reason is None:
            self._warn_if_tighter(policy, cfg, override, image)
            return dataclasses.replace(policy, tiered=True)
        return dataclasses.replace(policy, reason_code=reason[0], reason=reason[1])

    def _enabled(self, cfg: dict[str, str], override: TopicOverride | None) -> Setting:
        """Whether rlm tiers the topic: the topic's ``remote.storage.enable`` (true = Kafka tiers it
        itself, false = off), then the override's ``enabled``, then yes."""
        if "remote.storage.enable" in cfg:
            text = cfg["remote.storage.enable"]
            if _kafka_tiers(cfg):
                return Setting(
                    False, KAFKA, f"remote.storage.enable={text} on the topic: Kafka tiers it itself"
                )
            return Setting(False, KAFKA, f"remote.storage.enable={text} on the topic")
        if override is not None and override.enabled is not None:
            return Setting(override.enabled, OVERRIDE, f"override {override.pattern!r} enabled")
        return Setting(True, DEFAULT, "every selected topic is tiered")

    def _broker_value(self, image: MetadataImage | None, key: str) -> tuple[str, str] | None:
        """(value, origin) of a broker-level config: this broker's own, then the cluster default."""
        if image is None:
            return None
        for name, label in ((self.node_id, f"broker {self.node_id}"), ("", "cluster default")):
            if name is not None and key in image.broker_configs.get(name, {}):
                return image.broker_configs[name][key], label
        return None

    def _warn_if_tighter(
        self,
        policy: TopicPolicy,
        cfg: dict[str, str],
        override: TopicOverride | None,
        image: MetadataImage | None,
    ) -> None:
        """Log once when a tiered topic's remote limit is tighter than the one rlm applied before
        Kafka's retention became local retention (docs/topic-policy.md §5): the one case where the
        upgrade itself could delete remote data, which an override set beforehand prevents."""
        deletes = "delete" in str(policy.cleanup_policy.value).split(",")
        for dim, setting in ((MS, policy.retention_ms), (BYTES, policy.retention_bytes)):
            default = int(getattr(self.settings.tiering, dim.rlm_key))
            before = legacy_remote(
                dim, cfg, override, lambda key: self._broker_value(image, key), default, deletes=deletes
            )
            key = (policy.topic, dim.rlm_key, before, int(setting.value))
            if looser(before, int(setting.value)) and key not in self._warned:
                self._warned.add(key)
                log.warning(
                    "%s: remote %s is %d (%s); before Kafka's retention was read as local retention "
                    "rlm applied %d: set that in an override to keep it (docs/topic-policy.md §5)",
                    policy.topic,
                    dim.rlm_key,
                    setting.value,
                    setting.origin,
                    before,
                )

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


def _kafka_tiers(cfg: dict[str, str]) -> bool:
    """The topic sets ``remote.storage.enable=true``: a broker accepts that only when it runs
    Kafka's own tiered storage, which then tiers the topic."""
    return cfg.get("remote.storage.enable", "").strip().lower() == "true"


def _decision(policy: TopicPolicy, kafka_tiered: bool) -> tuple[str, str] | None:
    """(reason code, reason) when Kafka's configs or an override keep rlm from tiering the topic
    (the selection patterns passed it); None when rlm tiers it."""
    enabled = policy.enabled
    if kafka_tiered:
        return "kafka-tiered", (
            f"left to Kafka: {enabled.origin} (Kafka's own tiered storage); rlm does not tier it twice"
        )
    if not enabled.value:
        code = "override-disabled" if enabled.source == OVERRIDE else "kafka-disabled"
        return code, f"tiering disabled: {enabled.origin}"
    if policy.compacted and not policy.archive_compacted:
        cleanup = policy.cleanup_policy
        return "compacted", (
            f"compacted topic (cleanup.policy={cleanup.value}, {cleanup.origin}); "
            "set archive_compacted to tier it as an archive"
        )
    return None


def retention_limits(pol: TopicPolicy, ctx: PartitionContext) -> dict[str, int]:
    """``apply_retention`` keywords for a partition: the remote limits. A topic's own
    ``retention.bytes`` read as KIP-405's whole-log limit counts the local bytes above the highest
    tiered offset too; every other limit counts remote bytes only (docs/topic-policy.md §1)."""
    local_only = 0
    if pol.whole_log_size:
        highest = ctx.progress.highest_tiered_offset
        local_only = sum(s.size for s in list_segments(ctx.part) if s.base_offset > highest)
    return {
        "retention_ms": int(pol.retention_ms.value),
        "retention_bytes": int(pol.retention_bytes.value),
        "local_only_bytes": local_only,
    }
