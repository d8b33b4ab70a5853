"""Retention in a sidecar (docs/topic-policy.md §1): the broker's ``retention.*`` is local
retention and never deletes remote data; ``local.retention.*`` on a topic makes its own
``retention.*`` the whole-log limit; a topic Kafka tiers itself is left to Kafka; an upgrade
deletes nothing because the meaning changed (docs/topic-policy.md §5). Metadata logs written with
rlm.testing.kraft, partitions with LogWriter, the real engine and CLI over the local store."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from rlm.config import load_settings, settings_from_mapping
from rlm.formats import metadata as md
from rlm.logdir.discovery import list_segments
from rlm.logdir.writer import LogWriter
from rlm.storage.local import LocalBackend
from rlm.testing.configs import write_config
from rlm.testing.daemon import rlm_cli
from rlm.testing.kraft import metadata_writer, write_records
from rlm.tiering.expire.policy import TopicPolicyResolver
from rlm.tiering.expire.retention import plan_retention
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.store import object_keys
from rlm.tiering.store.manifest import SegmentManifest
from tests.lookup.edges import write_log_start_checkpoint
from tests.lookup.helpers import BruteLog, delete_local_segments, write_generated
from tests.tiering.helpers import roll_after_last

ARTHUR = "ArthurArutunyan04__Backend_labs"
TOPIC_ID = "0CM0rYlfQiqSTCH-x54Zhw"
YEAR_MS = 365 * 86_400_000


def _topic(key: str, value: str | None, topic: str = "t") -> md.ConfigRecord:
    return md.ConfigRecord(md.RESOURCE_TOPIC, topic, key, value)


def _cluster(key: str, value: str) -> md.ConfigRecord:
    return md.ConfigRecord(md.RESOURCE_BROKER, "", key, value)


def _resolver(tmp_path: Path, *configs: md.ConfigRecord, **topics: Any) -> TopicPolicyResolver:
    writer = metadata_writer(tmp_path)
    write_records(writer, [[md.TopicRecord("t", TOPIC_ID)], list(configs)])
    writer.close()
    r = TopicPolicyResolver(
        settings_from_mapping(
            {"log": {"dirs": [str(tmp_path)]}, "topics": topics, "tiering": {"retention_ms": 5}}
        )
    )
    r.refresh()
    return r


# -- the resolver ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "configs",
    [
        [_topic("retention.ms", "1"), _topic("retention.bytes", "1")],
        [_cluster("log.retention.ms", "1"), _cluster("log.retention.bytes", "1")],
        [_cluster("log.retention.hours", "0"), _topic("retention.bytes", "0")],
        [_topic("retention.ms", "1"), _topic("local.retention.ms", "-2"), _topic("retention.bytes", "1")],
    ],
    ids=["topic", "cluster", "hours-and-zero", "local-minus-2"],
)
def test_kafka_retention_is_local_retention(tmp_path: Path, configs: list[md.ConfigRecord]) -> None:
    """Whatever Kafka sets (topic or broker level, without a real local.retention split), the
    remote limits are rlm's; Kafka's values are shown as the broker's local retention."""
    pol = _resolver(tmp_path, *configs).policy("t")
    assert pol.tiered
    assert pol.retention_ms.as_dict() == {"value": 5, "source": "default", "from": "[tiering] retention_ms"}
    assert (pol.retention_bytes.value, pol.retention_bytes.source) == (-1, "default")
    assert pol.as_dict()["retention_bytes_scope"] == "remote"
    assert (pol.local_retention_ms.source, pol.local_retention_bytes.source) == ("kafka", "kafka")
    assert pol.local_retention_ms.value in (0, 1) and pol.local_retention_bytes.value in (0, 1)


@pytest.mark.parametrize(
    ("configs", "topics", "remote_ms", "remote_bytes"),
    [
        # KIP-405's split on the topic: its own retention.* of that dimension is the whole log.
        ([_topic("local.retention.ms", "60000"), _topic("retention.ms", "3600000")], {}, 3_600_000, -1),
        (
            [
                _topic("local.retention.bytes", "1"),
                _topic("retention.bytes", "100"),
                _topic("retention.ms", "1"),
            ],
            {},
            5,
            100,
        ),
        # The hint without the topic's own retention.*: a broker default was set for its disks.
        ([_topic("local.retention.ms", "10"), _cluster("log.retention.ms", "1")], {}, 5, -1),
        # rlm's override names remote retention explicitly and wins over the hint.
        (
            [_topic("local.retention.ms", "10"), _topic("retention.ms", "1")],
            {"overrides": {"t": {"retention_ms": 7}}},
            7,
            -1,
        ),
        # Compact only: Kafka deletes nothing by retention, so the hint bounds nothing either.
        (
            [
                _topic("cleanup.policy", "compact"),
                _topic("local.retention.ms", "10"),
                _topic("retention.ms", "1"),
            ],
            {"overrides": {"t": {"archive_compacted": True}}},
            5,
            -1,
        ),
        # A value that is not an integer is ignored (with a warning), not guessed.
        ([_topic("local.retention.ms", "10"), _topic("retention.ms", "soon")], {}, 5, -1),
    ],
    ids=["ms", "bytes-only", "no-topic-value", "override-wins", "compact-only", "garbage"],
)
def test_local_retention_hint(
    tmp_path: Path, configs: list[md.ConfigRecord], topics: dict[str, Any], remote_ms: int, remote_bytes: int
) -> None:
    pol = _resolver(tmp_path, *configs, **topics).policy("t")
    assert pol.tiered and (pol.retention_ms.value, pol.retention_bytes.value) == (remote_ms, remote_bytes)
    assert pol.whole_log_size == (pol.retention_bytes.source == "kafka")
    if pol.retention_ms.source == "kafka":
        assert (
            pol.retention_ms.origin
            == "retention.ms on the topic (whole log: the topic sets local.retention.ms=60000)"
        )


def test_a_topic_kafka_tiers_is_left_to_kafka(tmp_path: Path) -> None:
    r = _resolver(
        tmp_path,
        _topic("remote.storage.enable", "true"),
        _topic("local.retention.ms", "60000"),
        _topic("retention.ms", "3600000"),
        _cluster("log.local.retention.bytes", "4096"),
        overrides={"t": {"enabled": True}},  # cannot make rlm tier what Kafka tiers
    )
    pol = r.policy("t")
    assert (pol.tiered, pol.reason_code, pol.source) == (False, "kafka-tiered", "kafka")
    assert pol.reason == (
        "left to Kafka: remote.storage.enable=true on the topic: Kafka tiers it itself "
        "(Kafka's own tiered storage); rlm does not tier it twice"
    )
    # On a broker that tiers by itself the local part is local.retention.* (topic, then broker).
    assert (pol.local_retention_ms.value, pol.local_retention_bytes.value) == (60_000, 4096)
    assert pol.local_retention_bytes.origin == "log.local.retention.bytes (cluster default; Kafka tiers it)"
    # Other topics are tiered: there is no "tier only those" rule any more.
    assert r.policy("other").tiered


def test_a_limit_tighter_than_before_is_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The one case an upgrade could delete more (docs/topic-policy.md §5): Kafka's looser value
    used to win over rlm's. The operator is told, once, with the value to put in an override."""
    r = _resolver(tmp_path, _topic("retention.ms", str(YEAR_MS)))
    with caplog.at_level(logging.WARNING, logger="rlm.tiering.expire.policy"):
        assert r.policy("t").retention_ms.value == 5
        r.policy("t")
    warned = [rec.getMessage() for rec in caplog.records if "before Kafka's retention" in rec.getMessage()]
    assert warned == [
        f"t: remote retention_ms is 5 ([tiering] retention_ms); before Kafka's retention was read as "
        f"local retention rlm applied {YEAR_MS}: set that in an override to keep it "
        "(docs/topic-policy.md §5)"
    ]
    caplog.clear()
    quiet = _resolver(tmp_path / "x", _topic("retention.ms", "1"))  # looser now: nothing to say
    with caplog.at_level(logging.WARNING, logger="rlm.tiering.expire.policy"):
        quiet.policy("t")
    assert not caplog.records


# -- the engine, across an upgrade ------------------------------------------------------------------


def _tiered_log_dir(tmp_path: Path) -> tuple[LogWriter, Path, BruteLog]:
    """A partition of records from 2023 with a metadata log naming its topic, tiered by one
    ``rlm run --once``; returns (the metadata log's writer, config, the partition's records)."""
    logs = tmp_path / "logs"
    write_generated(logs, "t", 0, batches=120, seed=5, segment_bytes=8_000)
    writer = metadata_writer(logs)
    write_records(
        writer, [[md.TopicRecord("t", TOPIC_ID), md.PartitionRecord(TOPIC_ID, 0, (1,), (1,), 1, 0, 0)]]
    )
    cfg = write_config(tmp_path / "c.toml", [logs], root=tmp_path / "store", cluster={"leadership": "always"})
    done = rlm_cli("run", "--config", cfg, "--once")
    assert done.returncode == 0, done.stderr
    return writer, cfg, BruteLog.scan(logs / "t-0")


def _manifests(store: Path) -> list[SegmentManifest]:
    backend = LocalBackend(root=str(store))
    found = sorted(i.key for i in backend.list(object_keys.manifests_prefix("t", 0)))
    return [SegmentManifest.from_json(backend.read(k)) for k in found]


def test_upgrade_with_small_kafka_retention_deletes_nothing_remote(tmp_path: Path) -> None:
    """The issue's scenario: the operator sets retention.bytes (and .ms) to keep the broker's disk
    small, the broker deletes its old segments; the next pass (the first after an upgrade) keeps
    every remote segment, and offset 0 is still served, from the remote tier."""
    writer, cfg, brute = _tiered_log_dir(tmp_path)
    logs = tmp_path / "logs"
    before = _manifests(tmp_path / "store")
    assert len(before) > 3
    write_records(
        writer,
        [
            [
                _topic("retention.bytes", "1048576"),
                _topic("retention.ms", "1"),
                _cluster("log.retention.bytes", "1"),
            ]
        ],
    )
    writer.close()
    # Under the old meaning (retention.* over the whole log) this pass would delete all of them.
    local_only = sum(s.size for s in list_segments(logs / "t-0") if s.base_offset > before[-1].last_offset)
    old = plan_retention(
        before, now_ms=1 << 41, retention_ms=1, retention_bytes=1_048_576, local_only_bytes=local_only
    )
    assert len(old.expired) == len(before)
    # The broker's local retention deletes all but the active segment.
    delete_local_segments(logs / "t-0", keep_last=1)
    write_log_start_checkpoint(logs, {("t", 0): list_segments(logs / "t-0")[0].base_offset})

    done = rlm_cli("run", "--config", cfg, "--once")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["segments_deleted"] == 0
    assert [m.base_offset for m in _manifests(tmp_path / "store")] == [m.base_offset for m in before]
    found = rlm_cli("lookup", "--config", cfg, "--topic", "t", "--partition", "0", "--offset", 0)
    assert found.returncode == 0, found.stderr
    answer = json.loads(found.stdout)
    assert (answer["offset"], answer["tier"]) == (0, "remote") and brute.records[0].offset == 0
    _assert_status_shows_both_tiers(cfg)


def _assert_status_shows_both_tiers(cfg: Path) -> None:
    status = rlm_cli("status", "--config", cfg)
    assert status.returncode == 0, status.stderr
    row = next(r for r in json.loads(status.stdout) if r["topic"] == "t")
    policy = row["policy"]
    assert row["remote_log_start_offset"] == 0 and row["log_start_offset"] == 0
    assert policy["local_retention_bytes"] == {
        "value": 1_048_576,
        "source": "kafka",
        "from": "retention.bytes on the topic",
    }
    assert policy["local_retention_ms"] == {
        "value": 1,
        "source": "kafka",
        "from": "retention.ms on the topic",
    }
    assert policy["retention_bytes"] == {
        "value": -1,
        "source": "default",
        "from": "[tiering] retention_bytes",
    }
    assert policy["retention_ms"] == {"value": -1, "source": "default", "from": "[tiering] retention_ms"}
    assert policy["retention_bytes_scope"] == "remote"


def test_a_topic_rlm_tiered_that_kafka_now_tiers_keeps_its_remote_data(tmp_path: Path) -> None:
    """Before, remote.storage.enable=true made rlm tier a topic; now Kafka does. What rlm already
    holds is kept (not managed, not deleted), and the row says why."""
    writer, cfg, _ = _tiered_log_dir(tmp_path)
    before = _manifests(tmp_path / "store")
    write_records(writer, [[_topic("remote.storage.enable", "true"), _topic("retention.ms", "1")]])
    writer.close()
    done = rlm_cli("run", "--config", cfg, "--once")
    assert done.returncode == 0, done.stderr
    assert _manifests(tmp_path / "store") == before
    status = rlm_cli("status", "--config", cfg)
    row = next(r for r in json.loads(status.stdout) if r["topic"] == "t")
    assert row["tiered"] is False and row["excluded_reason"].startswith("left to Kafka")
    assert row["highest_tiered_offset"] == before[-1].last_offset


def test_real_kraft_log_drives_tiering_and_retention(fixtures_dir: Path, tmp_path: Path) -> None:
    """Arthur's broker: its own metadata log says oms_order_* keep 1 day (retention.ms=86400000) —
    on that broker, without Kafka's tiered storage, local retention. A day on, nothing remote goes;
    an override giving the remote tier the same day deletes as Kafka's whole-log rule would."""
    logs = tmp_path / ARTHUR
    shutil.copytree(fixtures_dir / "kafka-logs" / ARTHUR, logs)
    for part in sorted(p for p in logs.iterdir() if p.is_dir() and any(p.glob("*.log"))):
        roll_after_last(part)
    backend = LocalBackend(root=str(tmp_path / "store"))
    newest = 1766802778446  # the last record of oms_order_created-1
    clock = [newest + 3_600_000]  # an hour later: within the topic's day

    def manager(**topics: Any) -> RemoteLogManager:
        # The broker was stopped when the fixture was taken: its metadata log names no leaders.
        cfg = write_config(
            tmp_path / "c.toml",
            [logs],
            root=tmp_path / "store",
            eligibility="rolled",
            cluster={"leadership": "always"},
            **({"topics": topics} if topics else {}),
        )
        return RemoteLogManager(
            load_settings(cfg), backend, metrics=TieringMetrics(), clock_ms=lambda: clock[0]
        )

    results = {f"{r.topic}-{r.partition}": r for r in manager().run_once()}
    assert set(results) == {"oms_order_created-1"} | {f"oms_order_status_changed-{i}" for i in range(5)}
    assert all(r.copied and not r.deleted and r.error is None for r in results.values())
    # Nothing internal reached the store (remote prefixes are <topic>-<partition>[=<topic id>]).
    assert {i.key.split("/", 1)[0].split("=")[0] for i in backend.list("")} == set(results)
    # A day after each partition's newest record the broker's retention.ms has deleted it locally;
    # the remote tier keeps it (rlm's [tiering] retention_ms is unlimited).
    clock[0] = 1766802778666 + 86_400_000 + 1
    mgr = manager()
    assert all(not r.deleted for r in mgr.run_once())
    row = next(r for r in mgr.status() if r["topic"] == "oms_order_created")
    assert row["remote_segments"] == 1 and row["policy"]["retention_ms"]["value"] == -1
    assert row["policy"]["local_retention_ms"]["from"] == "retention.ms on the topic"
    # rlm's own override: the same day, now for the remote tier.
    clock[0] = newest + 86_400_000 + 1
    day = {"overrides": {"oms_order_*": {"retention_ms": 86_400_000}}}
    mgr = manager(**day)
    deleted = {f"{r.topic}-{r.partition}": r.deleted for r in mgr.run_once()}
    assert deleted["oms_order_created-1"] == [81908]
    # oms_order_status_changed-1's newest record is 220 ms younger (fixtures README): not yet.
    assert deleted["oms_order_status_changed-1"] == []
    clock[0] = 1766802778666 + 86_400_000 + 1
    assert {f"{r.topic}-{r.partition}": r.deleted for r in manager(**day).run_once()}[
        "oms_order_status_changed-1"
    ] == [21236]
    row = next(r for r in mgr.status() if r["topic"] == "oms_order_created")
    assert row["remote_segments"] == 0 and row["highest_tiered_offset"] == 94645
    assert row["policy"]["retention_ms"]["from"] == "override 'oms_order_*' retention_ms"
