"""Leadership sources (docs/cluster.md): always, static, kraft (the real brokers' metadata logs in
the fixtures, and logs written here with leaders moving), auto, node ids from meta.properties,
config errors naming the key. kafka-admin: tests/cluster/test_kafka_admin.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from rlm.cluster import leadership_mode, leadership_source
from rlm.cluster.leadership import KraftSource
from rlm.config import Settings, settings_from_mapping
from rlm.errors import ConfigError
from rlm.formats.checkpoint import parse_leader_epoch_checkpoint
from rlm.formats.naming import parse_partition_dir
from rlm.formats.records import RecordSpec
from rlm.logdir.kraft import METADATA_LOG_DIR
from rlm.testing.kraft import MetadataLogBuilder
from rlm.tiering.expire.policy import TopicPolicyResolver

ARTHUR = "ArthurArutunyan04__Backend_labs"
ITUMELENG = "ItumelengMogase__Real-Time-Data-Pipeline-for-Patient-Admissions"


def settings(log_dirs: list[Path] | Path, **cluster: Any) -> Settings:
    dirs = [log_dirs] if isinstance(log_dirs, Path) else log_dirs
    topics = {k: cluster.pop(k) for k in ("metadata_log_dir", "follow_kafka_configs") if k in cluster}
    if "metadata_log_dir" in topics:
        topics["metadata_log_dir"] = str(topics["metadata_log_dir"])
    return settings_from_mapping(
        {"log": {"dirs": [str(d) for d in dirs]}, "cluster": cluster, "topics": topics}
    )


def broker_dir(root: Path, node_id: int, key: str = "node.id") -> Path:
    """A log dir whose meta.properties names ``node_id`` (as Kafka writes it)."""
    log_dir = root / f"broker-{node_id}"
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "meta.properties").write_text(
        f"#\n#Mon Nov 23 22:00:00 UTC 2026\ncluster.id=test\n{key}={node_id}\nversion=1\n"
    )
    return log_dir


# --- always / static ------------------------------------------------------------------------------


def test_always_leads_everything(tmp_path: Path) -> None:
    source = leadership_source(settings(tmp_path, leadership="always"))
    source.refresh()
    answer = source.leadership("orders", 7)
    assert (answer.role, answer.source, answer.leader_epoch) == ("leader", "always", None)
    assert source.node_id is None and answer.leader is None  # no meta.properties: not needed
    assert source.describe() == {"source": "always", "node_id": None, "error": None}
    named = leadership_source(settings(broker_dir(tmp_path, 4), leadership="always"))
    assert named.node_id == 4 and named.leadership("orders", 0).leader == 4


def test_static_table(tmp_path: Path) -> None:
    s = settings(
        broker_dir(tmp_path, 2),
        leadership="static",
        leaders={"orders-0": 2, "orders-1": 1, "my.topic_x-12": 2},
    )
    source = leadership_source(s)
    assert source.name == "static" and source.node_id == 2
    led = source.leadership("orders", 0)
    assert (led.role, led.leader, led.leader_epoch, led.source) == ("leader", 2, None, "static")
    other = source.leadership("orders", 1)
    assert (other.role, other.leader) == ("follower", 1)
    assert source.leadership("my.topic_x", 12).role == "leader"
    unlisted = source.leadership("orders", 2)  # not listed: not led here
    assert (unlisted.role, unlisted.leader) == ("follower", None)
    assert unlisted.detail is not None and "orders-2" in unlisted.detail
    assert source.describe() == {
        "source": "static",
        "node_id": 2,
        "error": None,
        "partitions": 3,
        "led_here": 2,
    }
    # Every broker reading the same table: exactly one leader per listed partition.
    roles = [
        leadership_source(settings(tmp_path, leadership="static", node_id=n, leaders=s.cluster.leaders))
        .leadership("orders", 1)
        .role
        for n in (1, 2, 3)
    ]
    assert roles == ["leader", "follower", "follower"]


def test_static_env_override_and_node_id_override(tmp_path: Path) -> None:
    from rlm.config import load_settings

    path = tmp_path / "rlm.toml"
    path.write_text(
        f'[log]\ndirs = ["{broker_dir(tmp_path, 1)}"]\n[cluster]\nleadership = "static"\n'
        '[cluster.leaders]\n"Orders-0" = 1\n'
    )
    s = load_settings(
        path,
        environ={"RLM_CLUSTER__NODE_ID": "3", "RLM_CLUSTER__LEADERS": '{"Orders-0" = 3, "Orders-1" = 1}'},
    )
    assert s.cluster.node_id == 3 and s.cluster.leaders == {"Orders-0": 3, "Orders-1": 1}
    source = leadership_source(s)  # the configured node id wins over meta.properties' 1
    assert source.leadership("Orders", 0).role == "leader"
    assert source.leadership("Orders", 1).role == "follower"


# --- node ids -------------------------------------------------------------------------------------


def test_node_id_from_meta_properties(tmp_path: Path, fixtures_dir: Path) -> None:
    leaders = {"a-0": 7}
    assert (
        leadership_source(settings(broker_dir(tmp_path, 7), leadership="static", leaders=leaders))
        .leadership("a", 0)
        .role
        == "leader"
    )
    zk = broker_dir(tmp_path / "zk", 5, key="broker.id")  # ZooKeeper mode writes broker.id
    assert leadership_source(settings(zk, leadership="static", leaders=leaders)).node_id == 5
    # The real brokers' meta.properties (KRaft node.id=1; ZooKeeper broker.id=1).
    for name in (ARTHUR, ITUMELENG, "berkayakcay__toy-node-log-collector"):
        real = fixtures_dir / "kafka-logs" / name
        assert leadership_source(settings(real, leadership="static", leaders=leaders)).node_id == 1


def test_node_id_required_but_missing_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cluster\.node_id is unset and no meta\.properties"):
        leadership_source(settings(tmp_path, leadership="static", leaders={"a-0": 1}))
    (tmp_path / "meta.properties").write_text("node.id=one\n")
    with pytest.raises(ConfigError, match=r"cluster\.node_id .*'one', not an integer"):
        leadership_source(settings(tmp_path, leadership="static", leaders={"a-0": 1}))
    MetadataLogBuilder(tmp_path).close()  # auto → kraft needs the node id as well
    (tmp_path / "meta.properties").unlink()
    with pytest.raises(ConfigError, match=r"cluster\.node_id.*leadership = 'kraft'"):
        leadership_source(settings(tmp_path))


# --- config errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cluster", "key"),
    [
        ({"leadership": "static"}, "cluster.leaders"),
        ({"leadership": "static", "leaders": {}}, "cluster.leaders"),
        ({"leadership": "kafka-admin"}, "cluster.bootstrap_servers"),
        (
            {
                "leadership": "kafka-admin",
                "bootstrap_servers": ["kafka:9092"],
                "security_protocol": "SASL_SSL",
            },
            "cluster.sasl_username",
        ),
        (
            {
                "leadership": "kafka-admin",
                "bootstrap_servers": "kafka:9092",
                "security_protocol": "SASL_PLAINTEXT",
                "sasl_username": "rlm",
            },
            "cluster.sasl_password_file",
        ),
        ({"leadership": "zookeeper"}, "cluster.leadership"),
        ({"node_id": -1}, "cluster.node_id"),
        ({"node_id": "1"}, "cluster.node_id"),
        ({"bootstrap_servers": ["kafka"]}, "cluster.bootstrap_servers"),
        ({"bootstrap_servers": ["kafka:99999"]}, "cluster.bootstrap_servers"),
        ({"security_protocol": "TLS"}, "cluster.security_protocol"),
        ({"sasl_mechanism": "GSSAPI"}, "cluster.sasl_mechanism"),
        ({"metadata_refresh_ms": 0}, "cluster.metadata_refresh_ms"),
        ({"leaders": {"orders": 1}}, 'cluster.leaders."orders"'),
        ({"leaders": {"bad/topic-0": 1}}, 'cluster.leaders."bad/topic-0"'),
        ({"leaders": {"orders-0": "one"}}, 'cluster.leaders."orders-0"'),
        ({"leaders": ["orders-0"]}, "cluster.leaders"),
        ({"node": 1}, "cluster.node"),
    ],
)
def test_config_errors_name_the_key(tmp_path: Path, cluster: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        settings(tmp_path, **cluster)
    # The key itself, not a longer one it prefixes (cluster.node vs cluster.node_id).
    assert re.search(re.escape(key) + r"(?![\w.])", str(info.value)), str(info.value)


def test_config_keys_are_read(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    s = settings(
        tmp_path,
        node_id=3,
        leadership="kafka-admin",
        bootstrap_servers=["[::1]:9092", "k2:9093"],
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="rlm",
        sasl_password_file=str(secret),
        ssl_cafile=str(tmp_path / "ca.pem"),
        metadata_refresh_ms=5000,
    )
    c = s.cluster
    assert (c.node_id, c.leadership, c.bootstrap_servers) == (3, "kafka-admin", ("[::1]:9092", "k2:9093"))
    assert (c.security_protocol, c.sasl_mechanism, c.sasl_username) == ("SASL_SSL", "SCRAM-SHA-512", "rlm")
    assert (c.sasl_password_file, c.ssl_cafile, c.metadata_refresh_ms) == (secret, tmp_path / "ca.pem", 5000)
    defaults = Settings().cluster
    assert (defaults.leadership, defaults.node_id, defaults.metadata_refresh_ms) == ("auto", None, 30_000)


# --- auto -----------------------------------------------------------------------------------------


def test_auto_picks_kraft_when_a_metadata_log_exists(tmp_path: Path) -> None:
    plain = broker_dir(tmp_path, 1)
    assert leadership_mode(settings(plain)) == "always"
    assert leadership_source(settings(plain)).name == "always"
    second = broker_dir(tmp_path, 2)
    MetadataLogBuilder(second).close()  # __cluster_metadata-0 in the second log dir
    assert (second / METADATA_LOG_DIR).is_dir()
    s = settings([tmp_path / "broker-1", second])
    assert leadership_mode(s) == "kraft"
    source = leadership_source(s)
    assert isinstance(source, KraftSource) and source.directory == second / METADATA_LOG_DIR
    assert source.node_id == 1  # the first log dir's meta.properties
    # [topics] metadata_log_dir counts even before the broker created it (never "always" then).
    elsewhere = settings(plain, metadata_log_dir=tmp_path / "meta" / METADATA_LOG_DIR)
    assert leadership_mode(elsewhere) == "kraft"
    assert leadership_source(elsewhere).leadership("a", 0).role == "unknown"
    # An explicit choice is never overridden by auto's rule.
    assert leadership_mode(settings(second, leadership="always")) == "always"


def test_explicit_kraft_without_a_metadata_log_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cluster\.leadership.*topics\.metadata_log_dir"):
        leadership_source(settings(broker_dir(tmp_path, 1), leadership="kraft"))


# --- kraft: the real brokers' metadata logs -------------------------------------------------------


def _local_epochs(log_dir: Path) -> dict[tuple[str, int], int]:
    """The last leader epoch in each partition's leader-epoch-checkpoint on the broker's disk."""
    out = {}
    for part in log_dir.iterdir():
        checkpoint = part / "leader-epoch-checkpoint"
        if part.name != METADATA_LOG_DIR and checkpoint.is_file():
            entries = parse_leader_epoch_checkpoint(checkpoint.read_bytes()).entries
            if entries:
                out[parse_partition_dir(part.name)] = entries[-1].epoch
    return out


def test_kraft_on_itumeleng_fixture(fixtures_dir: Path) -> None:
    """The broker (node 1, a single-broker cluster) led every partition at shutdown; the epoch the
    controller recorded is the one the broker's own leader-epoch-checkpoint ends with."""
    log_dir = fixtures_dir / "kafka-logs" / ITUMELENG
    source = leadership_source(settings(log_dir))  # auto: the fixture has __cluster_metadata-0
    assert source.name == "kraft" and source.node_id == 1
    source.refresh()
    local = _local_epochs(log_dir)
    assert len(local) == 6
    for (topic, partition), epoch in local.items():
        answer = source.leadership(topic, partition)
        assert (answer.role, answer.leader, answer.leader_epoch, answer.source) == (
            "leader",
            1,
            epoch,
            "kraft",
        ), (topic, partition)
    assert local[("_schemas", 0)] == 38
    created = source.leadership("patient_admissions", 4)  # only in the newest snapshot, never moved
    assert (created.role, created.leader, created.leader_epoch) == ("leader", 1, 0)
    missing = source.leadership("patient_admissions", 5)
    assert missing.role == "unknown" and "partition not in the metadata image" in (missing.detail or "")
    assert source.describe()["metadata_offset"] == 60499 and source.describe()["error"] is None


def test_kraft_on_arthur_fixture(fixtures_dir: Path) -> None:
    """Arthur's single broker shut down cleanly: the controller moved leadership off it (leader -1)
    and bumped each epoch once past the broker's own last epoch. It holds the only replica, so it
    still leads (nobody else can copy); a node that is not the replica does not."""
    log_dir = fixtures_dir / "kafka-logs" / ARTHUR
    source = leadership_source(settings(log_dir, leadership="kraft"))
    stranger = leadership_source(settings(log_dir, leadership="kraft", node_id=2))
    source.refresh()
    stranger.refresh()
    local = _local_epochs(log_dir)
    assert len(local) == 7
    for (topic, partition), epoch in local.items():
        answer = source.leadership(topic, partition)
        assert (answer.role, answer.leader, answer.leader_epoch) == ("leader", None, epoch + 1)
        assert answer.detail == "the partition has no leader; this node holds its only replica"
        other = stranger.leadership(topic, partition)
        assert (other.role, other.leader, other.leader_epoch) == ("follower", None, epoch + 1)
        assert other.detail == "the partition has no leader (offline)"
    assert source.leadership("nope", 0).detail == "topic not in the metadata image (offset 7319)"


# --- kraft: logs written here, leaders moving -----------------------------------------------------


def test_kraft_follows_leader_changes_on_three_brokers(tmp_path: Path) -> None:
    dirs = [broker_dir(tmp_path, n) for n in (1, 2, 3)]
    meta = MetadataLogBuilder(dirs)  # each broker's own replica of the metadata log
    meta.create_topic("orders", [(1, 2, 3), (2, 3, 1)])
    sources = [leadership_source(settings(d)) for d in dirs]
    assert [s.name for s in sources] == ["kraft"] * 3 and [s.node_id for s in sources] == [1, 2, 3]

    def roles(partition: int) -> list[tuple[str, int | None, int | None]]:
        out = []
        for source in sources:
            source.refresh()
            a = source.leadership("orders", partition)
            out.append((a.role, a.leader, a.leader_epoch))
        return out

    assert roles(0) == [("leader", 1, 0), ("follower", 1, 0), ("follower", 1, 0)]
    assert roles(1) == [("follower", 2, 0), ("leader", 2, 0), ("follower", 2, 0)]
    meta.move_leader("orders", 0, 2, isr=(2, 3))
    assert roles(0) == [("follower", 2, 1), ("leader", 2, 1), ("follower", 2, 1)]
    meta.move_leader("orders", 0, 3)
    assert roles(0) == [("follower", 3, 2), ("follower", 3, 2), ("leader", 3, 2)]
    assert roles(1) == [("follower", 2, 0), ("leader", 2, 0), ("follower", 2, 0)]  # untouched
    meta.move_leader("orders", 0, -1)  # offline: nobody leads, the epoch still moves
    assert roles(0) == [("follower", None, 3)] * 3
    meta.move_leader("orders", 0, 1)
    assert roles(0) == [("leader", 1, 4), ("follower", 1, 4), ("follower", 1, 4)]
    # A partition whose only replica is broker 2: without a leader, broker 2 still leads it.
    meta.create_topic("solo", [(2,)])
    meta.move_leader("solo", 0, -1, isr=(2,))
    for source in sources:
        source.refresh()
    solo = [(s.leadership("solo", 0).role, s.leadership("solo", 0).leader_epoch) for s in sources]
    assert solo == [("follower", 1), ("leader", 1), ("follower", 1)]
    unknown = sources[0].leadership("orders", 2)
    assert unknown.role == "unknown" and unknown.leader is None
    assert unknown.detail is not None and "partition not in the metadata image" in unknown.detail
    meta.delete_topic("orders")
    sources[0].refresh()
    gone = sources[0].leadership("orders", 0)
    assert gone.role == "unknown" and "topic not in the metadata image" in (gone.detail or "")
    meta.close()


def test_kraft_uses_the_policy_resolvers_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given ``image``/``refresh_image`` (the topic-policy resolver's), the source opens no reader
    of its own and answers from that image as the resolver polls it."""
    log_dir = broker_dir(tmp_path, 2)
    meta = MetadataLogBuilder(log_dir)
    meta.create_topic("orders", [(1, 2)])
    s = settings(log_dir)
    resolver = TopicPolicyResolver(s)

    def no_second_reader(*_: object) -> None:
        raise AssertionError("a second KraftMetadataLog was opened")

    with monkeypatch.context() as patch:
        patch.setattr("rlm.cluster.leadership.KraftMetadataLog", no_second_reader)
        source = leadership_source(s, image=lambda: resolver.image, refresh_image=resolver.refresh)
    assert source.leadership("orders", 0).role == "unknown"  # nothing read yet
    assert source.describe()["error"] == "the metadata log has not been read"
    source.refresh()
    assert (source.leadership("orders", 0).role, source.leadership("orders", 0).leader) == ("follower", 1)
    meta.move_leader("orders", 0, 2)
    source.refresh()
    answer = source.leadership("orders", 0)
    assert (answer.role, answer.leader, answer.leader_epoch) == ("leader", 2, 1)
    assert resolver.image is not None and resolver.image.offset == source.describe()["metadata_offset"]
    meta.close()


def test_the_manager_shares_the_reader_only_when_it_follows_kafka_configs(tmp_path: Path) -> None:
    """The daemon's wiring: one reader when the policy resolver reads the log anyway; kraft
    leadership reads the log itself when Kafka's topic configs are not followed."""
    from rlm.storage.local import LocalBackend
    from rlm.tiering.manager import RemoteLogManager

    log_dir = broker_dir(tmp_path, 2)
    meta = MetadataLogBuilder(log_dir)
    meta.create_topic("orders", [(2, 1)])
    backend = LocalBackend(root=str(tmp_path / "store"))
    for follow, own_reader in ((True, False), (False, True)):
        mgr = RemoteLogManager(settings(log_dir, follow_kafka_configs=follow), backend)
        source = mgr.roles.source
        assert isinstance(source, KraftSource) and (source._own is not None) is own_reader
        mgr.run_once()
        assert source.leadership("orders", 0).role == "leader"
    meta.close()


def test_kraft_unreadable_log_keeps_the_last_image(tmp_path: Path) -> None:
    log_dir = broker_dir(tmp_path, 1)
    meta = MetadataLogBuilder(log_dir)
    meta.create_topic("orders", [(1, 2)])
    source = leadership_source(settings(log_dir))
    source.refresh()
    assert source.leadership("orders", 0).role == "leader"
    # A ConfigRecord cut short is appended: the reader refuses the log from there on.
    meta.writers[0].append([RecordSpec(1_700_000_000_000, None, b"\x01\x04\x00\x02\x09ab")])
    meta.close()
    source.refresh()  # never raises into the manager
    error = source.describe()["error"]
    assert error is not None and "00000000000000000000.log" in error
    assert source.leadership("orders", 0).role == "leader"  # the last image read stays in use
