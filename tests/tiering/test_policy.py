"""Topic policy (docs/topic-policy.md): selection patterns, internal logs, overrides, Kafka's topic
and broker configs from a KRaft metadata log (written here with config changes over time, and the
fixtures' real one), and the engine honouring them: what is uploaded, per-topic remote retention,
status rows and metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlm.cli.generate import generate_log_dir
from rlm.config import Settings, load_settings, settings_from_mapping
from rlm.errors import ConfigError
from rlm.formats import metadata as md
from rlm.formats.checkpoint import format_offset_checkpoint
from rlm.logdir.discovery import PartitionDir
from rlm.logdir.writer import LogWriter
from rlm.storage.local import LocalBackend
from rlm.testing.configs import write_config
from rlm.testing.kraft import metadata_writer, write_records
from rlm.testing.store_check import StoreCheck, check_store
from rlm.tiering.expire.policy import TopicPolicyResolver
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.manager import RemoteLogManager

ARTHUR = "ArthurArutunyan04__Backend_labs"
IDS = {
    "orders": "0CM0rYlfQiqSTCH-x54Zhw",
    "payments": "h21Hd1FxRjC-20k1lF5oYA",
    "audit": "FSJPF87NQN-J95EDLRWirw",
    "state": "TvQoTq0KRHWWLKQ64d1gfw",
}


def _settings(log_dir: Path, **topics: Any) -> Settings:
    return settings_from_mapping({"log": {"dirs": [str(log_dir)]}, "topics": topics})


def _topic_cfg(topic: str, key: str, value: str | None) -> md.ConfigRecord:
    return md.ConfigRecord(md.RESOURCE_TOPIC, topic, key, value)


def _kraft(log_dir: Path, *configs: md.ConfigRecord) -> LogWriter:
    writer = metadata_writer(log_dir)
    write_records(
        writer,
        [[md.TopicRecord(t, i), md.PartitionRecord(i, 0, (1,), (1,), 1, 0, 0)] for t, i in IDS.items()]
        + [list(configs)],
    )
    return writer


# -- selection -----------------------------------------------------------------------------------


def test_patterns_and_internal_logs(tmp_path: Path) -> None:
    r = TopicPolicyResolver(
        _settings(tmp_path, include=["orders*", "_*", "__transaction_state"], exclude=["*.tmp"])
    )
    assert r.policy("orders").tiered and r.policy("orders-eu").tiered
    assert r.policy("_schemas").tiered  # one underscore: an ordinary topic
    tmp = r.policy("orders.tmp")
    assert not tmp.tiered and tmp.reason == "excluded by [topics] exclude pattern '*.tmp'"
    other = r.policy("payments")
    assert (other.tiered, other.reason_code, other.source) == (False, "include", "selection")
    # "_*" matches __consumer_offsets but does not name it: internal logs need a pattern with "__".
    offsets = r.policy("__consumer_offsets")
    assert (offsets.tiered, offsets.reason_code) == (False, "internal")
    assert "KRaft metadata log" in str(r.policy("__cluster_metadata").reason)
    assert r.policy("__transaction_state").tiered  # named explicitly
    assert not r.policy("__anything_new").tiered  # any __ name is internal


def test_overrides_first_match_wins_and_config_errors(tmp_path: Path) -> None:
    r = TopicPolicyResolver(
        _settings(
            tmp_path,
            overrides={
                "orders-eu": {"retention_ms": 5, "enabled": True},
                "orders*": {"retention_ms": 60_000, "retention_bytes": 1_000},
                "*": {"enabled": False},
            },
        )
    )
    assert r.follow is False  # no metadata log in the log dir
    eu, orders, other = r.policy("orders-eu"), r.policy("orders"), r.policy("payments")
    assert (eu.retention_ms.value, eu.retention_ms.origin) == (5, "override 'orders-eu' retention_ms")
    assert eu.retention_bytes.source == "default" and eu.retention_bytes.value == -1
    assert (orders.retention_ms.value, orders.retention_bytes.value) == (60_000, 1_000)
    assert orders.tiered and orders.enabled.source == "default"
    assert (other.tiered, other.reason_code, other.source) == (False, "override-disabled", "override")
    with pytest.raises(ConfigError, match=r'topics.overrides."x".retention_sec'):
        _settings(tmp_path, overrides={"x": {"retention_sec": 1}})
    with pytest.raises(ConfigError, match=r'topics.overrides."x".enabled = 1: must be true or false'):
        _settings(tmp_path, overrides={"x": {"enabled": 1}})


# -- Kafka's configs -------------------------------------------------------------------------------


def _broker_3_with_topic_and_broker_configs(tmp_path: Path) -> LogWriter:
    """Broker 3's log dir whose metadata log gives orders KIP-405's split (local.retention.ms 10 min,
    retention.ms 1 h), leaves audit to Kafka's own tiered storage, makes state compacted, with
    cluster defaults (2 h, 777 bytes) and broker 3's own 999 bytes."""
    (tmp_path / "meta.properties").write_text("#\nnode.id=3\nversion=1\n")
    return _kraft(
        tmp_path,
        _topic_cfg("orders", "local.retention.ms", "600000"),
        _topic_cfg("orders", "retention.ms", "3600000"),
        _topic_cfg("audit", "remote.storage.enable", "true"),
        _topic_cfg("audit", "local.retention.bytes", "100"),
        _topic_cfg("state", "cleanup.policy", "compact,delete"),
        md.ConfigRecord(md.RESOURCE_BROKER, "", "log.retention.hours", "2"),
        md.ConfigRecord(md.RESOURCE_BROKER, "", "log.retention.bytes", "777"),
        md.ConfigRecord(md.RESOURCE_BROKER, "3", "log.retention.bytes", "999"),
    )


def _assert_sources_per_tier(r: TopicPolicyResolver) -> None:
    """Remote limits come from the override, the KIP-405 hint or [tiering]; local ones from the
    topic, this broker, the cluster default or Kafka's default (docs/topic-policy.md §1)."""
    orders, payments, audit, state = (r.policy(t) for t in ("orders", "payments", "audit", "state"))
    assert orders.tiered and orders.enabled.source == "default" and orders.topic_id == IDS["orders"]
    # orders sets local.retention.ms: its own retention.ms is the whole-log (remote) limit; the
    # override, which sets only retention_bytes, leaves it.
    assert (orders.retention_ms.value, orders.retention_ms.source) == (3_600_000, "kafka")
    assert "local.retention.ms=600000" in orders.retention_ms.origin
    assert (orders.retention_bytes.value, orders.retention_bytes.source) == (5, "override")
    # Locally the broker (without Kafka's tiered storage) applies retention.ms, not local.retention.ms.
    assert orders.local_retention_ms.as_dict() == {
        "value": 3_600_000,
        "source": "kafka",
        "from": "retention.ms on the topic",
    }
    assert (orders.local_retention_bytes.value, orders.local_retention_bytes.origin) == (
        999,
        "log.retention.bytes (broker 3)",
    )
    # payments: the broker's values are local only; remote is the override's 42 ms and
    # [tiering]'s unlimited size. No "tier only those" rule: it is tiered.
    assert (payments.tiered, payments.enabled.source) == (True, "default")
    assert (payments.retention_ms.value, payments.retention_ms.source) == (42, "override")
    assert (payments.retention_bytes.value, payments.retention_bytes.source) == (-1, "default")
    assert (payments.local_retention_ms.value, payments.local_retention_ms.origin) == (
        7_200_000,
        "log.retention.hours (cluster default)",
    )
    assert not payments.whole_log_size and payments.as_dict()["retention_bytes_scope"] == "remote"
    # audit: Kafka tiers it itself (its local part is local.retention.bytes): left to Kafka.
    assert (audit.tiered, audit.reason_code, audit.source) == (False, "kafka-tiered", "kafka")
    assert "left to Kafka" in str(audit.reason)
    assert audit.local_retention_bytes.as_dict() == {
        "value": 100,
        "source": "kafka",
        "from": "local.retention.bytes on the topic (Kafka tiers it)",
    }
    assert audit.local_retention_ms.origin == "log.retention.hours (cluster default)"  # -2: as retention
    assert (state.tiered, state.reason_code) == (False, "compacted")


def test_kafka_configs_over_time(tmp_path: Path) -> None:
    writer = _broker_3_with_topic_and_broker_configs(tmp_path)
    r = TopicPolicyResolver(
        _settings(
            tmp_path,
            overrides={
                "orders": {"retention_bytes": 5},
                "audit": {"enabled": True},  # cannot make rlm tier what Kafka tiers
                "payments": {"retention_ms": 42},
            },
        )
    )
    assert r.follow is True and r.node_id == "3"
    r.refresh()
    _assert_sources_per_tier(r)
    orders_0 = [PartitionDir(tmp_path, "orders", 0, tmp_path / "orders-0")]
    first = r.classify(orders_0)[2][("orders", 0)]
    assert r.classify(orders_0)[2][("orders", 0)] is first  # unchanged: the same policy object
    # Changes over time: the hint removed, orders' retention.ms is local only again; audit no
    # longer tiered by Kafka but turned off; a deleted broker key falls back to the cluster default.
    write_records(
        writer,
        [
            [
                _topic_cfg("orders", "local.retention.ms", None),
                _topic_cfg("audit", "remote.storage.enable", "false"),
                md.ConfigRecord(md.RESOURCE_BROKER, "3", "log.retention.bytes", None),
            ]
        ],
    )
    r.refresh()
    changed = r.classify(orders_0)[2][("orders", 0)]
    assert changed != first and (changed.retention_ms.value, changed.retention_ms.source) == (-1, "default")
    orders, audit = r.policy("orders"), r.policy("audit")
    assert (orders.retention_ms.value, orders.retention_ms.source) == (-1, "default")
    assert orders.local_retention_ms.value == 3_600_000
    assert (audit.tiered, audit.reason_code) == (False, "kafka-disabled")
    assert audit.local_retention_bytes.value == 777  # local.retention.* counts only where Kafka tiers
    # The topic deleted: its configs go with it; re-created with a new id, it starts afresh.
    write_records(
        writer, [[md.RemoveTopicRecord(IDS["orders"]), md.TopicRecord("orders", "AAAAAAAAAAAAAAAAAAAAAQ")]]
    )
    r.refresh()
    again = r.policy("orders")
    assert again.topic_id == "AAAAAAAAAAAAAAAAAAAAAQ" and again.local_retention_ms.source == "kafka"
    assert again.local_retention_ms.origin == "log.retention.hours (cluster default)"
    assert again.tiered and again.enabled.source == "default"  # no "tier only those" rule
    writer.close()
    # Not following: the same log dir, Kafka's configs ignored; local retention is Kafka's default.
    off = TopicPolicyResolver(_settings(tmp_path, follow_kafka_configs=False))
    off.refresh()
    assert off.policy("audit").tiered and off.policy("state").tiered
    assert off.policy("orders").topic_id is None
    assert off.policy("orders").local_retention_ms.as_dict() == {
        "value": 604_800_000,
        "source": "default",
        "from": "Kafka's default log.retention.hours=168 (Kafka configs are not followed)",
    }


def test_a_policy_answered_again_follows_what_refresh_brings(tmp_path: Path) -> None:
    """policy() is memoized per metadata image and cleaned topics (the read path asks it on every
    Fetch): the log cleaner taking a topic on, or leaving it, shows at the next refresh."""
    r = TopicPolicyResolver(_settings(tmp_path, follow_kafka_configs=False))
    r.refresh()
    assert r.policy("orders").cleanup_policy.value == "delete"
    assert r.policy("orders") is r.policy("orders")  # one resolution while nothing changed
    (tmp_path / "cleaner-offset-checkpoint").write_text(format_offset_checkpoint({("orders", 0): 0}))
    assert r.policy("orders").cleanup_policy.value == "delete"  # not refreshed yet
    r.refresh()
    assert r.policy("orders").cleanup_policy.value == "compact"
    assert r.policy("state").cleanup_policy.value == "delete"
    (tmp_path / "cleaner-offset-checkpoint").write_text(format_offset_checkpoint({}))
    r.refresh()
    assert r.policy("orders").cleanup_policy.value == "delete"


def test_archive_compacted_per_pattern(tmp_path: Path) -> None:
    _kraft(
        tmp_path,
        _topic_cfg("state", "cleanup.policy", "compact"),
        _topic_cfg("state", "retention.ms", "1000"),
        _topic_cfg("state", "local.retention.ms", "10"),
        _topic_cfg("audit", "retention.ms", "1000"),
        _topic_cfg("audit", "local.retention.ms", "10"),
        _topic_cfg("audit", "cleanup.policy", "compact,delete"),
        md.ConfigRecord(md.RESOURCE_BROKER, "", "log.retention.bytes", "5"),
    ).close()
    r = TopicPolicyResolver(
        _settings(
            tmp_path, overrides={"st*": {"archive_compacted": True}, "audit": {"archive_compacted": True}}
        )
    )
    r.refresh()
    state = r.policy("state")
    assert state.tiered and state.compacted and state.archive_compacted
    # Compact only: Kafka never deletes by retention, locally or (even with the local.retention.ms
    # hint) as a whole-log limit: the archive keeps rlm's own limits.
    assert (state.retention_ms.source, state.retention_bytes.source) == ("default", "default")
    assert state.local_retention_ms.value == -1 and "deletes nothing" in state.local_retention_ms.origin
    # compact,delete: the hint makes audit's retention.ms the whole-log limit; the broker's
    # log.retention.bytes stays local (no local.retention.bytes on the topic).
    audit = r.policy("audit")
    assert audit.tiered and (audit.retention_ms.value, audit.retention_bytes.value) == (1000, -1)
    assert (audit.local_retention_ms.value, audit.local_retention_bytes.value) == (1000, 5)
    plain = TopicPolicyResolver(_settings(tmp_path))
    plain.refresh()
    assert "cleanup.policy=compact" in str(plain.policy("state").reason)


def test_real_fixture_metadata_log(fixtures_dir: Path) -> None:
    r = TopicPolicyResolver(_settings(fixtures_dir / "kafka-logs" / ARTHUR))
    r.refresh()
    created = r.policy("oms_order_created")
    # The broker's retention.ms (a day) is its local retention; remote is [tiering]'s unlimited.
    assert created.tiered and created.local_retention_ms.as_dict() == {
        "value": 86_400_000,
        "source": "kafka",
        "from": "retention.ms on the topic",
    }
    assert created.retention_ms.as_dict() == {
        "value": -1,
        "source": "default",
        "from": "[tiering] retention_ms",
    }
    assert created.cleanup_policy.value == "delete" and created.topic_id == "0CM0rYlfQiqSTCH-x54Zhw"
    assert r.policy("__consumer_offsets").reason_code == "internal"
    assert r.describe()["metadata_offset"] == 7319 and r.describe()["metadata_error"] is None


# -- the engine ----------------------------------------------------------------------------------


def _kept(sizes: list[int], limit: int, extra: int) -> int:
    """Segments Kafka's size rule keeps of ``sizes`` (oldest first) with ``extra`` bytes counted."""
    remaining, kept = sum(sizes) + extra, len(sizes)
    for size in sizes:
        if remaining - size < limit:
            break
        remaining, kept = remaining - size, kept - 1
    return kept


def _sample(mgr: RemoteLogManager, name: str, labels: dict[str, str]) -> float | None:
    return mgr.shared.metrics.registry.get_sample_value(name, labels)


def test_engine_tiers_what_the_policy_selects_with_per_topic_retention(tmp_path: Path) -> None:
    logs, writer, backend, mgr = _kafka_and_override_policies(tmp_path)
    results = mgr.run_once()
    assert {f"{r.topic}-{r.partition}" for r in results} == {"orders-0", "audit-0", "payments-0"}
    assert all(r.error is None and r.copied for r in results)
    # orders' whole-log limit and audit's override cut them; payments' retention.bytes=1 is the
    # broker's local budget: it deletes nothing remote.
    deleted = {r.topic: len(r.deleted) for r in results}
    assert deleted["orders"] > 0 and deleted["audit"] > 0 and deleted["payments"] == 0
    # Nothing else reached the store: not the topic Kafka tiers itself, nothing internal.
    assert {i.key.split("/", 1)[0] for i in backend.list("")} == {"orders-0", "audit-0", "payments-0"}
    check, audit = _assert_retention_bytes_applied(logs, backend)
    _assert_status_and_metrics_name_the_sources(mgr)

    # Later the broker sets retention.ms=1 on audit and payments (the generated records are from
    # 2025): it deletes their local segments, never their remote ones.
    write_records(
        writer, [[_topic_cfg("audit", "retention.ms", "1"), _topic_cfg("payments", "retention.ms", "1")]]
    )
    assert {r.topic: len(r.deleted) for r in mgr.run_once()} == {"orders": 0, "audit": 0, "payments": 0}
    # Then audit sets local.retention.ms too: KIP-405's split, so its retention.ms=1 now covers the
    # whole log and all of audit's remote data goes.
    before = {p: len(c.manifests) for p, c in check.partitions.items()}
    write_records(writer, [[_topic_cfg("audit", "local.retention.ms", "0")]])
    assert {r.topic: len(r.deleted) for r in mgr.run_once()} == {
        "orders": 0,
        "audit": len(audit),
        "payments": 0,
    }
    after = check_store([logs], backend, complete=False).partitions
    assert after["audit-0"].manifests == []
    assert len(after["orders-0"].manifests) == before["orders-0"]
    assert len(after["payments-0"].manifests) == before["payments-0"]
    labels = {"topic": "audit", "partition": "0"}
    assert _sample(mgr, "rlm_topic_policy_retention_ms", {**labels, "source": "kafka"}) == 1
    assert _sample(mgr, "rlm_topic_policy_retention_ms", {**labels, "source": "default"}) is None
    payments = {"topic": "payments", "partition": "0", "source": "kafka"}
    assert _sample(mgr, "rlm_topic_policy_local_retention_ms", payments) == 1
    assert _sample(mgr, "rlm_topic_policy_retention_ms", {**payments, "source": "default"}) == -1
    writer.close()


def _kafka_and_override_policies(tmp_path: Path) -> tuple[Path, LogWriter, LocalBackend, RemoteLogManager]:
    """A log dir whose metadata log gives orders KIP-405's split (local.retention.bytes 1,
    retention.bytes 30000: the whole log), sets retention.bytes=1 (the broker's local budget) on
    audit, whose remote limit is rlm's override (20000), and on payments (remote unlimited), and
    leaves ledger to Kafka's own tiered storage; __consumer_offsets is internal.
    Returns (log dir, the metadata log's writer, the store, the manager)."""
    logs = tmp_path / "logs"
    # orders comes second: its high watermark lags, so its last rolled segment stays local-only.
    generate_log_dir(
        logs,
        [("audit", 1), ("orders", 1), ("payments", 1), ("ledger", 1), ("__consumer_offsets", 1)],
        seed=3,
        records=500,
        segment_bytes=8 * 1024,
    )
    writer = _kraft(
        logs,
        md.TopicRecord("ledger", "AAAAAAAAAAAAAAAAAAAAAg"),
        _topic_cfg("orders", "local.retention.bytes", "1"),
        _topic_cfg("orders", "retention.bytes", "30000"),
        _topic_cfg("audit", "retention.bytes", "1"),
        _topic_cfg("payments", "retention.bytes", "1"),
        _topic_cfg("ledger", "remote.storage.enable", "true"),
    )
    cfg = write_config(
        tmp_path / "c.toml",
        [logs],
        root=tmp_path / "store",
        topics={"overrides": {"audit": {"retention_bytes": 20_000}}},
        cluster={"leadership": "always"},
    )  # the metadata log here holds configs only
    backend = LocalBackend(root=str(tmp_path / "store"))
    return logs, writer, backend, RemoteLogManager(load_settings(cfg), backend, metrics=TieringMetrics())


def _assert_retention_bytes_applied(logs: Path, backend: LocalBackend) -> tuple[StoreCheck, list[int]]:
    """orders keeps its whole-log limit, audit the override's remote-only one, payments all;
    returns the store check and audit's remote segment sizes."""
    check = check_store([logs], backend, not_tiered=frozenset({"ledger"}))
    assert not check.unreferenced
    # orders: retention.bytes over the whole log (remote + the local bytes not yet tiered).
    orders = [m["size_bytes"] for m in check.partitions["orders-0"].manifests]
    sizes = [p.stat().st_size for p in sorted((logs / "orders-0").glob("*.log"))]
    tiered = len(check.partitions["orders-0"].eligible_bases)
    local_only = sum(sizes[tiered:])  # the lagging rolled segment and the active one
    assert sum(orders) + local_only >= 30_000 > sum(orders[1:]) + local_only
    # A remote-only limit would keep more segments here: the assertion tells the two rules apart.
    assert len(orders) < _kept(sizes[:tiered], 30_000, 0)
    assert len(orders) == _kept(sizes[:tiered], 30_000, local_only)
    # audit: the override's limit counts remote bytes only; Kafka's retention.bytes=1 is not applied.
    audit = [m["size_bytes"] for m in check.partitions["audit-0"].manifests]
    assert sum(audit) >= 20_000 > sum(audit[1:])
    # payments: every eligible segment is remote.
    payments = check.partitions["payments-0"]
    assert len(payments.manifests) == len(payments.eligible_bases) > 1
    return check, audit


def _assert_status_and_metrics_name_the_sources(mgr: RemoteLogManager) -> None:
    rows = {f"{r['topic']}-{r['partition']}": r for r in mgr.status()}
    assert set(rows) == {
        "orders-0",
        "payments-0",
        "audit-0",
        "ledger-0",
        "__consumer_offsets-0",
        "__cluster_metadata-0",
    }
    orders, audit, payments = (rows[f"{t}-0"]["policy"] for t in ("orders", "audit", "payments"))
    assert orders["retention_bytes"] == {
        "value": 30_000,
        "source": "kafka",
        "from": "retention.bytes on the topic (whole log: the topic sets local.retention.bytes=1)",
    }
    assert orders["retention_bytes_scope"] == "whole log" and audit["retention_bytes_scope"] == "remote"
    assert audit["retention_bytes"]["source"] == "override"
    assert audit["local_retention_bytes"] == {
        "value": 1,
        "source": "kafka",
        "from": "retention.bytes on the topic",
    }
    assert payments["retention_bytes"] == {
        "value": -1,
        "source": "default",
        "from": "[tiering] retention_bytes",
    }
    assert rows["payments-0"]["tiered"] is True and rows["payments-0"]["remote_segments"] > 0
    assert rows["ledger-0"]["tiered"] is False and rows["ledger-0"]["remote_segments"] == 0
    assert "left to Kafka" in rows["ledger-0"]["excluded_reason"]
    assert rows["ledger-0"]["log_end_offset"] == rows["orders-0"]["log_end_offset"] > 0
    assert rows["orders-0"]["kafka_configs"]["follow_kafka_configs"] is True
    for topic, source, tiered_value in (("orders", "default", 1), ("ledger", "kafka", 0)):
        labels = {"topic": topic, "partition": "0", "source": source}
        assert _sample(mgr, "rlm_topic_policy_tiered", labels) == tiered_value
    assert _sample(mgr, "rlm_partitions_excluded", {"reason": "internal"}) == 2
    assert _sample(mgr, "rlm_partitions_excluded", {"reason": "kafka-tiered"}) == 1
    assert _sample(mgr, "rlm_partitions_excluded", {"reason": "kafka-disabled"}) == 0
    audit_labels = {"topic": "audit", "partition": "0"}
    assert _sample(mgr, "rlm_topic_policy_retention_bytes", {**audit_labels, "source": "override"}) == 20_000
    assert _sample(mgr, "rlm_topic_policy_local_retention_bytes", {**audit_labels, "source": "kafka"}) == 1


def test_topics_keys_from_the_environment(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.toml", [tmp_path], root=tmp_path / "store")
    settings = load_settings(
        cfg,
        environ={
            "RLM_TOPICS__INCLUDE": '["orders*"]',
            "RLM_TOPICS__FOLLOW_KAFKA_CONFIGS": "false",
            "RLM_TOPICS__OVERRIDES": '{"orders-eu" = {retention_ms = 5}, "orders*" = {enabled = false}}',
        },
    )
    t = settings.topics
    assert t.include == ("orders*",) and t.follow_kafka_configs is False
    assert [(o.pattern, o.retention_ms, o.enabled) for o in t.overrides] == [
        ("orders-eu", 5, None),
        ("orders*", None, False),
    ]
    r = TopicPolicyResolver(settings)
    assert r.policy("orders-eu").tiered and not r.policy("orders").tiered


def test_the_idle_key_of_a_policy_tells_a_changed_policy_from_an_equal_one(tmp_path: Path) -> None:
    """policy_key (the idle fingerprint's) remembers the key per policy object: an equal policy
    has the same key, a changed one (a new object, as a discovery resolves it) another."""
    import dataclasses

    from rlm.tiering.idle import policy_key

    pol = TopicPolicyResolver(_settings(tmp_path)).policy("orders")
    assert policy_key(pol) == policy_key(dataclasses.replace(pol)) == policy_key(pol)
    changed = dataclasses.replace(pol, retention_ms=dataclasses.replace(pol.retention_ms, value=1))
    assert policy_key(changed) != policy_key(pol)
    assert policy_key(changed) == repr(changed)
