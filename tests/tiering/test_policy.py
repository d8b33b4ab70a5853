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
from rlm.logdir.writer import LogWriter
from rlm.storage.local import LocalBackend
from rlm.testing.configs import write_config
from rlm.testing.kraft import metadata_writer, write_records
from rlm.testing.store_check import StoreCheck, check_store
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.metrics import TieringMetrics
from rlm.tiering.policy import TopicPolicyResolver

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
    """Broker 3's log dir whose metadata log enables orders (retention.ms 1h), audit and the
    compacted state, with cluster defaults (2 h, 777 bytes) and broker 3's own 999 bytes."""
    (tmp_path / "meta.properties").write_text("#\nnode.id=3\nversion=1\n")
    return _kraft(
        tmp_path,
        _topic_cfg("orders", "remote.storage.enable", "true"),
        _topic_cfg("orders", "retention.ms", "3600000"),
        _topic_cfg("audit", "remote.storage.enable", "true"),
        _topic_cfg("state", "cleanup.policy", "compact,delete"),
        _topic_cfg("state", "remote.storage.enable", "true"),
        md.ConfigRecord(md.RESOURCE_BROKER, "", "log.retention.hours", "2"),
        md.ConfigRecord(md.RESOURCE_BROKER, "", "log.retention.bytes", "777"),
        md.ConfigRecord(md.RESOURCE_BROKER, "3", "log.retention.bytes", "999"),
    )


def _assert_sources_rank_topic_override_broker_cluster(r: TopicPolicyResolver) -> None:
    """Each key's value comes from the first source that sets it: topic, override, broker, cluster."""
    orders, payments, audit, state = (r.policy(t) for t in ("orders", "payments", "audit", "state"))
    assert orders.tiered and orders.enabled.source == "kafka" and orders.topic_id == IDS["orders"]
    # The topic's own config beats the override; the override beats the broker default.
    assert (orders.retention_ms.value, orders.retention_ms.source) == (3_600_000, "kafka")
    assert (orders.retention_bytes.value, orders.retention_bytes.source) == (5, "override")
    assert (audit.retention_ms.value, audit.retention_ms.source) == (42, "override")
    # This broker's own config beats the cluster-wide default; hours are converted.
    assert (audit.retention_bytes.value, audit.retention_bytes.origin) == (
        999,
        "log.retention.bytes (broker 3)",
    )
    assert audit.whole_log_size and not orders.whole_log_size
    # payments sets no remote.storage.enable while other topics do: only those are tiered.
    assert (payments.tiered, payments.reason_code, payments.source) == (False, "kafka-disabled", "kafka")
    assert (payments.retention_ms.value, payments.retention_ms.origin) == (
        7_200_000,
        "log.retention.hours (cluster default)",
    )
    assert (state.tiered, state.reason_code) == (False, "compacted")


def test_kafka_configs_over_time(tmp_path: Path) -> None:
    writer = _broker_3_with_topic_and_broker_configs(tmp_path)
    r = TopicPolicyResolver(
        _settings(
            tmp_path,
            overrides={"orders": {"retention_ms": 1, "retention_bytes": 5}, "audit": {"retention_ms": 42}},
        )
    )
    assert r.follow is True and r.node_id == "3"
    r.refresh()
    _assert_sources_rank_topic_override_broker_cluster(r)
    # Changes over time: a deleted key falls back to the next source, a topic turned off stops.
    write_records(
        writer,
        [
            [
                _topic_cfg("orders", "retention.ms", None),
                _topic_cfg("audit", "remote.storage.enable", "false"),
                md.ConfigRecord(md.RESOURCE_BROKER, "3", "log.retention.bytes", None),
            ]
        ],
    )
    r.refresh()
    orders, audit = r.policy("orders"), r.policy("audit")
    assert (orders.retention_ms.value, orders.retention_ms.source) == (1, "override")
    assert (audit.tiered, audit.reason_code) == (False, "kafka-disabled")
    assert audit.retention_bytes.value == 777
    # The topic deleted: its configs go with it; re-created with a new id, it starts afresh.
    write_records(
        writer, [[md.RemoveTopicRecord(IDS["orders"]), md.TopicRecord("orders", "AAAAAAAAAAAAAAAAAAAAAQ")]]
    )
    r.refresh()
    again = r.policy("orders")
    assert again.topic_id == "AAAAAAAAAAAAAAAAAAAAAQ" and again.retention_ms.source == "override"
    assert again.enabled.source == "kafka" and not again.tiered  # state still sets it, orders not
    writer.close()
    # Not following: the same log dir, Kafka's configs ignored.
    off = TopicPolicyResolver(_settings(tmp_path, follow_kafka_configs=False))
    off.refresh()
    assert off.policy("payments").tiered and off.policy("state").tiered
    assert off.policy("orders").topic_id is None


def test_archive_compacted_per_pattern(tmp_path: Path) -> None:
    _kraft(
        tmp_path,
        _topic_cfg("state", "cleanup.policy", "compact"),
        _topic_cfg("state", "retention.ms", "1000"),
        _topic_cfg("audit", "retention.ms", "1000"),
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
    # Compact only: Kafka never deletes by retention, so neither the topic's nor the broker's
    # retention applies to the archive; with "compact,delete" they do.
    assert (state.retention_ms.source, state.retention_bytes.source) == ("default", "default")
    audit = r.policy("audit")
    assert audit.tiered and (audit.retention_ms.value, audit.retention_bytes.value) == (1000, 5)
    plain = TopicPolicyResolver(_settings(tmp_path))
    plain.refresh()
    assert "cleanup.policy=compact" in str(plain.policy("state").reason)


def test_real_fixture_metadata_log(fixtures_dir: Path) -> None:
    r = TopicPolicyResolver(_settings(fixtures_dir / "kafka-logs" / ARTHUR))
    r.refresh()
    created = r.policy("oms_order_created")
    assert created.tiered and created.retention_ms.as_dict() == {
        "value": 86_400_000,
        "source": "kafka",
        "from": "retention.ms on the topic",
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
    assert {f"{r.topic}-{r.partition}" for r in results} == {"orders-0", "audit-0"}
    assert all(r.error is None and r.copied and r.deleted for r in results)
    # Nothing else reached the store: not the topic Kafka does not enable, nothing internal.
    assert {i.key.split("/", 1)[0] for i in backend.list("")} == {"orders-0", "audit-0"}
    check, audit = _assert_retention_bytes_applied(logs, backend)
    _assert_status_and_metrics_name_the_sources(mgr)

    # Later the broker sets retention.ms=1 on audit: the next pass deletes all of its remote data
    # (the generated records are from 2025), and the metric now names Kafka as the source.
    write_records(writer, [[_topic_cfg("audit", "retention.ms", "1")]])
    before = len(check.partitions["orders-0"].manifests)
    assert {r.topic: len(r.deleted) for r in mgr.run_once()} == {"orders": 0, "audit": len(audit)}
    after = check_store([logs], backend, complete=False).partitions
    assert after["audit-0"].manifests == [] and len(after["orders-0"].manifests) == before
    labels = {"topic": "audit", "partition": "0"}
    assert _sample(mgr, "rlm_topic_policy_retention_ms", {**labels, "source": "kafka"}) == 1
    assert _sample(mgr, "rlm_topic_policy_retention_ms", {**labels, "source": "default"}) is None
    writer.close()


def _kafka_and_override_policies(tmp_path: Path) -> tuple[Path, LogWriter, LocalBackend, RemoteLogManager]:
    """A log dir whose metadata log enables orders (retention.bytes 30000) and audit, while rlm's
    override gives audit retention_bytes 20000; payments is not enabled, __consumer_offsets internal.
    Returns (log dir, the metadata log's writer, the store, the manager)."""
    logs = tmp_path / "logs"
    # orders comes second: its high watermark lags, so its last rolled segment stays local-only.
    generate_log_dir(
        logs,
        [("audit", 1), ("orders", 1), ("payments", 1), ("__consumer_offsets", 1)],
        seed=3,
        records=500,
        segment_bytes=8 * 1024,
    )
    writer = _kraft(
        logs,
        _topic_cfg("orders", "remote.storage.enable", "true"),
        _topic_cfg("orders", "retention.bytes", "30000"),
        _topic_cfg("audit", "remote.storage.enable", "true"),
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
    """orders keeps Kafka's whole-log limit, audit the override's remote-only one; returns the
    store check and audit's remote segment sizes."""
    check = check_store([logs], backend, not_tiered=frozenset({"payments"}))
    assert not check.unreferenced
    # orders: Kafka's retention.bytes over the whole log (remote + the local bytes not yet tiered).
    orders = [m["size_bytes"] for m in check.partitions["orders-0"].manifests]
    sizes = [p.stat().st_size for p in sorted((logs / "orders-0").glob("*.log"))]
    tiered = len(check.partitions["orders-0"].eligible_bases)
    local_only = sum(sizes[tiered:])  # the lagging rolled segment and the active one
    assert sum(orders) + local_only >= 30_000 > sum(orders[1:]) + local_only
    # A remote-only limit would keep more segments here: the assertion tells the two rules apart.
    assert len(orders) < _kept(sizes[:tiered], 30_000, 0)
    assert len(orders) == _kept(sizes[:tiered], 30_000, local_only)
    # audit: the override's limit counts remote bytes only.
    audit = [m["size_bytes"] for m in check.partitions["audit-0"].manifests]
    assert sum(audit) >= 20_000 > sum(audit[1:])
    return check, audit


def _assert_status_and_metrics_name_the_sources(mgr: RemoteLogManager) -> None:
    rows = {f"{r['topic']}-{r['partition']}": r for r in mgr.status()}
    assert set(rows) == {"orders-0", "payments-0", "audit-0", "__consumer_offsets-0", "__cluster_metadata-0"}
    assert rows["orders-0"]["policy"]["retention_bytes"] == {
        "value": 30_000,
        "source": "kafka",
        "from": "retention.bytes on the topic",
    }
    assert rows["orders-0"]["policy"]["retention_bytes_scope"] == "whole log"
    assert rows["audit-0"]["policy"]["retention_bytes"]["source"] == "override"
    assert rows["payments-0"]["tiered"] is False and rows["payments-0"]["remote_segments"] == 0
    assert "only those are tiered" in rows["payments-0"]["excluded_reason"]
    assert rows["payments-0"]["log_end_offset"] == rows["orders-0"]["log_end_offset"] > 0
    assert rows["orders-0"]["kafka_configs"]["follow_kafka_configs"] is True
    for topic, tiered_value in (("orders", 1), ("payments", 0)):
        labels = {"topic": topic, "partition": "0", "source": "kafka"}
        assert _sample(mgr, "rlm_topic_policy_tiered", labels) == tiered_value
    assert _sample(mgr, "rlm_partitions_excluded", {"reason": "internal"}) == 2
    assert _sample(mgr, "rlm_partitions_excluded", {"reason": "kafka-disabled"}) == 1
    assert (
        _sample(
            mgr,
            "rlm_topic_policy_retention_bytes",
            {"topic": "audit", "partition": "0", "source": "override"},
        )
        == 20_000
    )


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


def test_real_kraft_log_drives_tiering_and_retention(fixtures_dir: Path, tmp_path: Path) -> None:
    """Arthur's broker: its own metadata log says oms_order_* keep 1 day (retention.ms=86400000)."""
    import shutil

    from tests.tiering.helpers import roll_after_last

    logs = tmp_path / ARTHUR
    shutil.copytree(fixtures_dir / "kafka-logs" / ARTHUR, logs)
    for part in sorted(p for p in logs.iterdir() if p.is_dir() and any(p.glob("*.log"))):
        roll_after_last(part)
    # The broker was stopped when the fixture was taken: its metadata log names no leaders.
    cfg = write_config(
        tmp_path / "c.toml",
        [logs],
        root=tmp_path / "store",
        eligibility="rolled",
        cluster={"leadership": "always"},
    )
    backend = LocalBackend(root=str(tmp_path / "store"))
    newest = 1766802778446  # the last record of oms_order_created-1
    clock = [newest + 3_600_000]  # an hour later: within the topic's day

    def manager() -> RemoteLogManager:
        return RemoteLogManager(
            load_settings(cfg), backend, metrics=TieringMetrics(), clock_ms=lambda: clock[0]
        )

    results = {f"{r.topic}-{r.partition}": r for r in manager().run_once()}
    assert set(results) == {"oms_order_created-1"} | {f"oms_order_status_changed-{i}" for i in range(5)}
    assert all(r.copied and not r.deleted and r.error is None for r in results.values())
    # Nothing internal reached the store (remote prefixes are <topic>-<partition>[=<topic id>]).
    assert {i.key.split("/", 1)[0].split("=")[0] for i in backend.list("")} == set(results)
    # A day after each partition's newest record, Kafka's retention.ms deletes its remote segments.
    clock[0] = newest + 86_400_000 + 1
    mgr = manager()
    deleted = {f"{r.topic}-{r.partition}": r.deleted for r in mgr.run_once()}
    assert deleted["oms_order_created-1"] == [81908]
    # oms_order_status_changed-1's newest record is 220 ms younger (fixtures README): not yet.
    assert deleted["oms_order_status_changed-1"] == []
    clock[0] = 1766802778666 + 86_400_000 + 1
    assert {f"{r.topic}-{r.partition}": r.deleted for r in manager().run_once()}[
        "oms_order_status_changed-1"
    ] == [21236]
    row = next(r for r in mgr.status() if r["topic"] == "oms_order_created")
    assert row["remote_segments"] == 0 and row["highest_tiered_offset"] == 94645
    assert row["policy"]["retention_ms"]["from"] == "retention.ms on the topic"
