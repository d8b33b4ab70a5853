"""kafka-admin leadership against a fake broker at the wire-protocol level (tests/cluster/fake_kafka.py).

What this proves: kafka-python's real KafkaAdminClient, configured by rlm, bootstraps over TCP
(ApiVersions, SASL PLAIN with the password from the file), sends Metadata, and rlm turns the
answer into leaders and leader epochs; refreshes are rate-limited; an unreachable cluster or a
rejected login is "unknown" (never an exception) and recovers. What it does not prove: that a real
Kafka broker answers the same way (no broker can be run here), TLS, SCRAM, or Metadata versions
other than the one negotiated (v12).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from rlm.cluster import leadership_source
from rlm.cluster.kafka_admin import KafkaAdminSource, admin_client_config, parse_metadata
from rlm.config import Settings, settings_from_mapping
from rlm.errors import ConfigError
from rlm.testing.daemon import free_port
from rlm.testing.secrets import write_secret
from tests.cluster.fake_kafka import FakeKafkaBroker


class Clock:
    """A monotonic clock the test moves (seconds)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def admin_settings(*servers: str, **cluster: Any) -> Settings:
    values: dict[str, Any] = {
        "leadership": "kafka-admin",
        "node_id": 2,
        "metadata_refresh_ms": 1000,
        "bootstrap_servers": list(servers),
        **cluster,
    }
    return settings_from_mapping({"cluster": values})


def test_leaders_and_epochs_from_metadata() -> None:
    with FakeKafkaBroker() as broker:
        broker.set_leader("orders", 0, 2, 5)
        broker.set_leader("orders", 1, 1, 7)
        broker.set_leader("offline", 0, -1, 3)
        broker.set_leader("offline", 1, -1, 2, replicas=(2,))  # only replica here: led here
        clock = Clock()
        source = KafkaAdminSource(admin_settings(broker.address).cluster, 2, clock=clock)
        before = source.leadership("orders", 0)
        assert before.role == "unknown" and "no Metadata response yet" in (before.detail or "")
        source.refresh()
        led = source.leadership("orders", 0)
        assert (led.role, led.leader, led.leader_epoch, led.source) == ("leader", 2, 5, "kafka-admin")
        other = source.leadership("orders", 1)
        assert (other.role, other.leader, other.leader_epoch) == ("follower", 1, 7)
        offline = source.leadership("offline", 0)
        assert (offline.role, offline.leader, offline.leader_epoch) == ("follower", None, 3)
        sole = source.leadership("offline", 1)
        assert (sole.role, sole.leader, sole.leader_epoch) == ("leader", None, 2)
        missing = source.leadership("orders", 9)
        assert missing.role == "unknown" and missing.detail == "partition not in the cluster metadata"
        # At most one Metadata request per period, however often the manager refreshes.
        asked = broker.metadata_requests()
        assert asked >= 1
        source.refresh()
        clock.now += 0.5
        source.refresh()
        assert broker.metadata_requests() == asked
        broker.set_leader("orders", 0, 3, 6)  # leadership moved to broker 3
        assert source.leadership("orders", 0).role == "leader"  # the last answer stands until then
        clock.now += 0.5
        source.refresh()
        moved = source.leadership("orders", 0)
        assert (moved.role, moved.leader, moved.leader_epoch) == ("follower", 3, 6)
        assert broker.metadata_requests() == asked + 1
        described = source.describe()
        assert [described[k] for k in ("error", "partitions", "requests", "failures")] == [None, 4, 2, 0]
        assert described["bootstrap_servers"] == [broker.address]
        source.close()


def test_built_by_the_factory_and_topic_errors() -> None:
    with FakeKafkaBroker() as broker:
        broker.set_leader("orders", 0, 2, 1)
        broker.cluster.topic_errors["secret"] = 29  # TOPIC_AUTHORIZATION_FAILED
        source = leadership_source(admin_settings(broker.address))
        assert isinstance(source, KafkaAdminSource) and source.node_id == 2
        source.refresh()
        assert source.leadership("orders", 0).role == "leader"
        denied = source.leadership("secret", 0)
        assert denied.role == "unknown"
        assert denied.detail == "topic error in the Metadata response: error code 29"
        source.close()


# kafka-python 3's network layer can drop, unclosed, the socket of a connection whose broker
# vanished mid-session (here: the fake broker stops after answering; a transport's close waits for
# its unflushed writes, kafka/net/transport.py). The socket is the library's and garbage-collected
# at a moment of the GC's choosing: one fresh-clone run in about six failed on it. Only this test's
# lost connection (loopback, no peer left) is ignored; rlm closes its client (close_quietly).
@pytest.mark.filterwarnings(
    r"ignore:unclosed <socket\.socket fd=\d+, family=2, type=1, proto=6, "
    r"laddr=\('127\.0\.0\.1', \d+\)>$:ResourceWarning"
)
def test_unreachable_is_unknown_then_recovers() -> None:
    clock = Clock()
    port = free_port()
    source = KafkaAdminSource(admin_settings(f"127.0.0.1:{port}").cluster, 2, clock=clock)
    source.refresh()  # nothing listens: never raises
    down = source.leadership("orders", 0)
    assert down.role == "unknown" and down.leader is None
    assert down.detail is not None and down.detail.startswith("cluster metadata unavailable: ")
    error = source.describe()["error"]
    assert error is not None and error in down.detail
    assert (source.describe()["failures"], source.describe()["partitions"]) == (1, None)
    source.refresh()  # within the period: no second attempt
    assert source.describe()["requests"] == 1
    with FakeKafkaBroker(port=port) as broker:  # the cluster comes back
        broker.set_leader("orders", 0, 2, 4)
        clock.now += 1
        source.refresh()
        assert source.leadership("orders", 0).role == "leader" and source.describe()["error"] is None
        clock.now += 1
    # The broker went away after answering: the answer is forgotten, not trusted further.
    source.refresh()
    gone = source.leadership("orders", 0)
    assert gone.role == "unknown" and source.describe()["failures"] == 2
    source.close()


def test_sasl_plain_password_from_file(tmp_path: Path) -> None:
    password = tmp_path / "kafka.password"
    write_secret(password, "s3cret\n")
    sasl = {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_username": "rlm",
        "sasl_password_file": str(password),
    }
    with FakeKafkaBroker(sasl_plain=("rlm", "s3cret")) as broker:
        broker.set_leader("orders", 0, 2, 9)
        source = leadership_source(admin_settings(broker.address, **sasl))
        source.refresh()
        assert source.leadership("orders", 0).leader_epoch == 9
        assert broker.authenticated and set(broker.authenticated) == {"rlm"}
        assert "s3cret" not in repr(source.describe())
        assert isinstance(source, KafkaAdminSource)
        source.close()
        write_secret(password, "wrong")
        rejected = leadership_source(admin_settings(broker.address, **sasl))
        rejected.refresh()
        assert rejected.leadership("orders", 0).role == "unknown"
        assert rejected.describe()["error"] is not None and set(broker.authenticated) == {"rlm"}
        assert ("SaslAuthenticateRequest", 2) in broker.requests
        assert isinstance(rejected, KafkaAdminSource)
        rejected.close()


def test_password_file_problems_name_the_key(tmp_path: Path) -> None:
    sasl = {"security_protocol": "SASL_SSL", "sasl_username": "rlm"}
    with pytest.raises(ConfigError, match=r"cluster\.sasl_password_file = '.*missing': cannot be read"):
        leadership_source(admin_settings("k:9092", **sasl, sasl_password_file=str(tmp_path / "missing")))
    write_secret(tmp_path / "empty", "\n")
    with pytest.raises(ConfigError, match=r"cluster\.sasl_password_file = .*empty"):
        leadership_source(admin_settings("k:9092", **sasl, sasl_password_file=str(tmp_path / "empty")))
    (tmp_path / "shared").write_text("s3cret\n")
    (tmp_path / "shared").chmod(0o644)
    with pytest.raises(ConfigError, match=r"cluster\.sasl_password_file = .*shared': mode 0644"):
        leadership_source(admin_settings("k:9092", **sasl, sasl_password_file=str(tmp_path / "shared")))


def test_missing_kafka_python_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kafka", None)  # what an install without the extra looks like
    with pytest.raises(ConfigError, match=r"cluster\.leadership = \"kafka-admin\" needs kafka-python"):
        leadership_source(admin_settings("k:9092"))


def test_client_config(tmp_path: Path) -> None:
    s = admin_settings(
        "k1:9093",
        "k2:9093",
        security_protocol="SSL",
        ssl_cafile=str(tmp_path / "ca.pem"),
        metadata_refresh_ms=60_000,
    )
    config = admin_client_config(s.cluster, 2, {"bootstrap_timeout_ms"})
    assert config == {
        "bootstrap_servers": ["k1:9093", "k2:9093"],
        "client_id": "rlm-2",
        "security_protocol": "SSL",
        "request_timeout_ms": 10_000,
        "bootstrap_timeout_ms": 10_000,
        "ssl_cafile": str(tmp_path / "ca.pem"),
    }
    quick = admin_client_config(
        admin_settings("k:1", metadata_refresh_ms=200).cluster, 2, {"api_version_auto_timeout_ms"}
    )  # kafka-python 2's name
    assert quick["request_timeout_ms"] == quick["api_version_auto_timeout_ms"] == 1_000


def test_parse_metadata_reads_both_kafka_python_spellings() -> None:
    v3 = [
        {
            "error_code": 0,
            "name": "a",
            "partitions": [{"error_code": 0, "partition_index": 0, "leader_id": 1, "leader_epoch": 4}],
        }
    ]
    v2 = [
        {
            "error_code": 0,
            "topic": "a",
            "partitions": [  # kafka-python 2.x field names
                {"error_code": 0, "partition": 0, "leader": 1, "leader_epoch": -1}
            ],
        }
    ]
    assert parse_metadata(v3)[0][("a", 0)].leader_epoch == 4
    assert parse_metadata(v2)[0][("a", 0)].leader_epoch is None  # -1 = unknown
