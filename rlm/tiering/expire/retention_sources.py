"""Where each tier's retention comes from (docs/topic-policy.md §1).

Beside a broker without Kafka's own tiered storage, the broker deletes its local segments by the
topic's ``retention.*`` (then its broker-level ``log.retention.*``): that is **local** retention,
the operator's disk budget, and it never bounds what rlm keeps. rlm's **remote** retention comes
from rlm's settings only — the first matching ``[topics.overrides]`` table, then ``[tiering]``
(unlimited by default) — with one exception: a topic that also sets ``local.retention.*`` was
configured with KIP-405's meaning ("this much local, the rest remote"), so that topic's own
``retention.*`` of the same dimension is its whole-log limit and ranks between the override and
``[tiering]``. Values are milliseconds or bytes per partition; ``-1`` is unlimited.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlm.config import TopicOverride

__all__ = [
    "BYTES",
    "DEFAULT",
    "DIMENSIONS",
    "KAFKA",
    "MS",
    "OVERRIDE",
    "BrokerLookup",
    "Dimension",
    "Setting",
    "int_config",
    "legacy_remote",
    "local_retention",
    "looser",
    "remote_retention",
]

log = logging.getLogger(__name__)

KAFKA, OVERRIDE, DEFAULT = "kafka", "override", "default"

#: ``(key) -> (value text, "broker 3" | "cluster default")`` of a broker-level config, or None.
BrokerLookup = Callable[[str], "tuple[str, str] | None"]


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
class Dimension:
    """Retention by time or by size: the Kafka keys that name it and rlm's key."""

    topic_key: str  # retention.ms
    local_key: str  # local.retention.ms (KIP-405's local part)
    rlm_key: str  # retention_ms ([tiering] and overrides)
    broker_keys: tuple[tuple[str, int], ...]  # (log.retention.*, unit in this dimension), first wins
    broker_local_key: str  # log.local.retention.ms
    kafka_default: int  # Kafka's own default when no config sets it
    default_key: str  # how Kafka's documentation names that default


MS = Dimension(
    "retention.ms",
    "local.retention.ms",
    "retention_ms",
    (("log.retention.ms", 1), ("log.retention.minutes", 60_000), ("log.retention.hours", 3_600_000)),
    "log.local.retention.ms",
    168 * 3_600_000,
    "log.retention.hours=168",
)
BYTES = Dimension(
    "retention.bytes",
    "local.retention.bytes",
    "retention_bytes",
    (("log.retention.bytes", 1),),
    "log.local.retention.bytes",
    -1,
    "log.retention.bytes=-1",
)
DIMENSIONS = (MS, BYTES)

#: KIP-405's "the same as retention.*" for local.retention.*: not a split of the log.
_SAME_AS_WHOLE = -2


def int_config(text: str, key: str) -> int | None:
    """``text`` as an integer; None (and a warning) when a Kafka config is not one."""
    try:
        return int(text)
    except ValueError:
        log.warning("Kafka config %s=%r is not an integer; ignored", key, text)
        return None


def _topic_value(cfg: dict[str, str], key: str) -> int | None:
    return int_config(cfg[key], key) if key in cfg else None


def _broker_retention(dim: Dimension, broker: BrokerLookup) -> Setting | None:
    """The broker-level ``log.retention.*`` (``.ms`` before ``.minutes`` before ``.hours``)."""
    for key, unit in dim.broker_keys:
        found = broker(key)
        if found is not None and (value := int_config(found[0], key)) is not None:
            return Setting(value * unit if value >= 0 else -1, KAFKA, f"{key} ({found[1]})")
    return None


def local_retention(
    dim: Dimension,
    cfg: dict[str, str],
    broker: BrokerLookup,
    *,
    cleanup: Setting,
    kafka_tiered: bool,
    follow: bool,
) -> Setting:
    """What the broker keeps locally, as far as its configs in the metadata log tell: the topic's
    ``retention.*``, then the broker's ``log.retention.*``, then Kafka's default. A compact-only
    topic is never deleted by retention; a topic Kafka tiers itself keeps ``local.retention.*``."""
    if "delete" not in str(cleanup.value).split(","):
        return Setting(
            -1, cleanup.source, f"cleanup.policy={cleanup.value}: the broker deletes nothing by retention"
        )
    if kafka_tiered and (part := _kip405_local(dim, cfg, broker)) is not None:
        return part
    value = _topic_value(cfg, dim.topic_key)
    if value is not None:
        return Setting(value, KAFKA, f"{dim.topic_key} on the topic")
    found_setting = _broker_retention(dim, broker)
    if found_setting is not None:
        return found_setting
    why = "Kafka configs are not followed" if not follow else "unless server.properties sets it"
    return Setting(dim.kafka_default, DEFAULT, f"Kafka's default {dim.default_key} ({why})")


def _kip405_local(dim: Dimension, cfg: dict[str, str], broker: BrokerLookup) -> Setting | None:
    """KIP-405's local part of a topic Kafka tiers itself: the topic's ``local.retention.*``, then
    the broker's ``log.local.retention.*``; None when neither sets one (-2, the default, means
    "as ``retention.*``")."""
    value = _topic_value(cfg, dim.local_key)
    if value is not None and value != _SAME_AS_WHOLE:
        return Setting(value, KAFKA, f"{dim.local_key} on the topic (Kafka tiers it)")
    found = broker(dim.broker_local_key)
    value = int_config(found[0], dim.broker_local_key) if found is not None else None
    if found is not None and value is not None and value != _SAME_AS_WHOLE:
        return Setting(value, KAFKA, f"{dim.broker_local_key} ({found[1]}; Kafka tiers it)")
    return None


def _whole_log_hint(dim: Dimension, cfg: dict[str, str]) -> Setting | None:
    """The topic's ``retention.*`` as a whole-log limit, when the same topic sets the dimension's
    ``local.retention.*`` too (other than -2): only then did the operator clearly mean KIP-405's
    split, and only the topic's own value (a broker default was set for the broker's disks)."""
    local = _topic_value(cfg, dim.local_key)
    whole = _topic_value(cfg, dim.topic_key)
    if local is None or local == _SAME_AS_WHOLE or whole is None:
        return None
    return Setting(
        whole, KAFKA, f"{dim.topic_key} on the topic (whole log: the topic sets {dim.local_key}={local})"
    )


def remote_retention(
    dim: Dimension,
    cfg: dict[str, str],
    override: TopicOverride | None,
    default: int,
    *,
    deletes: bool,
) -> Setting:
    """rlm's remote retention: the override, then the KIP-405 hint (only when ``deletes``: Kafka
    applies no retention to a compact-only topic), then ``[tiering]``'s ``default``."""
    if override is not None and getattr(override, dim.rlm_key) is not None:
        return Setting(
            getattr(override, dim.rlm_key), OVERRIDE, f"override {override.pattern!r} {dim.rlm_key}"
        )
    hint = _whole_log_hint(dim, cfg) if deletes else None
    if hint is not None:
        return hint
    return Setting(default, DEFAULT, f"[tiering] {dim.rlm_key}")


def legacy_remote(
    dim: Dimension,
    cfg: dict[str, str],
    override: TopicOverride | None,
    broker: BrokerLookup,
    default: int,
    *,
    deletes: bool,
) -> int:
    """The remote limit rlm applied before docs/topic-policy.md §1 (Kafka's topic config, override,
    Kafka's broker config, ``[tiering]``): compared with the new one only to warn on upgrade."""
    value = _topic_value(cfg, dim.topic_key) if deletes else None
    if value is not None:
        return value
    if override is not None and getattr(override, dim.rlm_key) is not None:
        return int(getattr(override, dim.rlm_key))
    found = _broker_retention(dim, broker) if deletes else None
    return int(found.value) if found is not None else default


def looser(a: int, b: int) -> bool:
    """True when limit ``a`` keeps strictly more than limit ``b`` (-1 = unlimited)."""
    return b >= 0 and (a < 0 or a > b)
