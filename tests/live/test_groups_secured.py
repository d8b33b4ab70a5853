"""Consumer groups relayed to a secured cluster (docs/kafka-listener.md §6, "Secured clusters"): a
live broker with SASL_PLAINTEXT (PLAIN, SCRAM-SHA-256), SASL_SSL (SCRAM-SHA-512) and SSL listeners
beside its PLAINTEXT one. rlm reaches the cluster only on the secured listener its ``[cluster]``
names, with the mechanism and credentials there; a kafka-python consumer with a group id reads
through rlm and commits, and the broker (asked over PLAINTEXT) has the offsets. A wrong password
and a CA that did not sign the broker's certificate answer COORDINATOR_NOT_AVAILABLE, and rlm's
log names the keys to fix."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.consumer import (
    HeartbeatRequest,
    HeartbeatResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)

from rlm.testing.daemon import free_port
from rlm.testing.kafka_cluster import KafkaCluster, wait_until
from rlm.testing.secrets import write_secret
from rlm.testing.sidecar import Sidecar, run_sidecar
from tests.http.certs import make_pki
from tests.kafka.helpers import call
from tests.kafkaservers import BROKER_CONFIG, require_kafka
from tests.live.helpers import broker_end, committed_at_broker, produce

pytestmark = [pytest.mark.kafka_live, pytest.mark.integration]

TOPIC = "secured"
USER, PASSWORD = "rlm", "s3cret-for-rlm"
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
NOT_AVAILABLE = 15


@dataclass
class Secured:
    cluster: KafkaCluster
    ports: dict[str, int]  # listener name → port
    ca: Path  # the CA that signed the broker's certificate
    other_ca: Path  # a CA that did not
    work: Path
    end: int  # the topic's end offset (partition 0)

    def listener(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"


def _jaas(mechanism: str) -> str:
    if mechanism == "PLAIN":
        return f'org.apache.kafka.common.security.plain.PlainLoginModule required user_{USER}="{PASSWORD}";'
    return "org.apache.kafka.common.security.scram.ScramLoginModule required;"  # users from format


def _secured_config(cluster: KafkaCluster, ports: dict[str, int], keystore: Path) -> dict[str, object]:
    """server.properties keys adding SASL_PLAINTEXT, SASL_SSL and SSL listeners to the one node
    (PLAINTEXT stays the inter-broker listener)."""
    node = cluster.nodes[0]
    secured = ",".join(f"{name}://127.0.0.1:{port}" for name, port in ports.items())
    return {
        "listeners": f"PLAINTEXT://127.0.0.1:{node.broker_port},{secured},"
        f"CONTROLLER://127.0.0.1:{node.controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.broker_port},{secured}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,"
        + ",".join(f"{name}:{name}" for name in ports),
        "sasl.enabled.mechanisms": ",".join(MECHANISMS),
        **{
            f"listener.name.{name.lower()}.{m.lower()}.sasl.jaas.config": _jaas(m)
            for name in ("SASL_PLAINTEXT", "SASL_SSL")
            for m in MECHANISMS
        },
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": keystore,  # the key, then its certificate
    }


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    require_kafka()
    home = tmp_path_factory.mktemp("kafka-secured")
    pki, other = make_pki(home / "pki"), make_pki(home / "other-pki", ca_name="not the broker's CA")
    keystore = write_secret(home / "broker.pem", pki.key.read_bytes() + pki.cert.read_bytes())
    config: dict[str, object] = dict(BROKER_CONFIG)
    scram = tuple(
        arg for m in MECHANISMS[1:] for arg in ("--add-scram", f"{m}=[name={USER},password={PASSWORD}]")
    )
    cluster = KafkaCluster(home, size=1, broker_config=config, format_args=scram)
    ports = {name: free_port() for name in ("SASL_PLAINTEXT", "SASL_SSL", "SSL")}
    config.update(_secured_config(cluster, ports, keystore))  # read when the node is formatted
    try:
        cluster.start()
        cluster.create_topic(TOPIC)
        produce(cluster.bootstrap, TOPIC, 300, partition=0, value_bytes=100)
        yield Secured(cluster, ports, pki.ca, other.ca, home, broker_end(cluster.bootstrap, TOPIC, 0))
    finally:
        cluster.close()


def _sidecar(s: Secured, name: str, cluster: dict[str, Any], kafka: dict[str, Any] | None = None) -> Any:
    """rlm beside the node, relaying groups to the ``[cluster]`` described."""
    work = s.work / name
    sections = {"kafka": {"idle_timeout_ms": 30_000, **(kafka or {})}}
    return run_sidecar(
        s.cluster.nodes[0],
        work / "store",
        work / "rlm",
        topics={"include": [TOPIC]},
        cluster=cluster,
        sections=sections,
    )


def _cluster_keys(
    s: Secured, protocol: str, mechanism: str, *, password: str = PASSWORD, ca: Path | None = None
) -> dict[str, Any]:
    keys: dict[str, Any] = {"bootstrap_servers": [s.listener(protocol)], "security_protocol": protocol}
    if protocol.startswith("SASL_"):
        secret = write_secret(s.work / f"password-{protocol}-{mechanism}-{len(password)}", password + "\n")
        keys.update(sasl_mechanism=mechanism, sasl_username=USER, sasl_password_file=str(secret))
    if protocol.endswith("SSL"):
        keys["ssl_cafile"] = str(ca or s.ca)
    return keys


def _consume_and_commit(rlm: Sidecar, group: str, end: int) -> list[int]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        bootstrap_servers=rlm.kafka_bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=200,
    )
    offsets: list[int] = []
    try:
        consumer.subscribe([TOPIC])

        def done() -> bool:
            for batch in consumer.poll(timeout_ms=500).values():
                offsets.extend(m.offset for m in batch)
            return len(offsets) >= end

        wait_until(done, timeout=90, what=f"{end} records through rlm with group {group}")
        consumer.commit()
    finally:
        consumer.close(autocommit=False)
    return offsets


@pytest.mark.parametrize(
    ("protocol", "mechanism"),
    [
        ("SASL_PLAINTEXT", "PLAIN"),
        ("SASL_PLAINTEXT", "SCRAM-SHA-256"),
        ("SASL_SSL", "SCRAM-SHA-512"),
        ("SSL", ""),
    ],
)
def test_groups_are_relayed_over_the_secured_listener(
    secured: Secured, protocol: str, mechanism: str
) -> None:
    group = f"secured-{protocol}-{mechanism}".lower()
    keys = _cluster_keys(secured, protocol, mechanism)
    with _sidecar(secured, group, keys) as rlm:
        offsets = _consume_and_commit(rlm, group, secured.end)
        log = rlm.daemon.log_text()
    assert offsets == list(range(secured.end))
    assert committed_at_broker(secured.cluster.bootstrap, group, TOPIC) == {0: secured.end}
    for trouble in ("refused rlm", "does not verify", "cannot reach", "did not answer"):
        assert trouble not in log, log  # (the cluster's own 15 while it creates its offsets topic is fine)


def _answers_not_available(rlm: Sidecar, group: str) -> None:
    port = int(rlm.kafka_bootstrap.rsplit(":", 1)[1])
    beat = call(port, HeartbeatRequest(group_id=group, generation_id=1, member_id="m"), 4, HeartbeatResponse)
    assert beat.error_code == NOT_AVAILABLE
    g = OffsetFetchRequest.OffsetFetchRequestGroup
    fetch = OffsetFetchRequest(groups=[g(group_id=group, member_id=None, member_epoch=-1, topics=None)])
    assert [x.error_code for x in call(port, fetch, 9, OffsetFetchResponse).groups] == [NOT_AVAILABLE]


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_a_wrong_password_answers_not_available_and_names_the_keys(secured: Secured, mechanism: str) -> None:
    keys = _cluster_keys(secured, "SASL_PLAINTEXT", mechanism, password="not-the-password")
    keys.pop("bootstrap_servers")  # groups only: the log start check would refuse every read
    kafka = {"coordinator_bootstrap": [secured.listener("SASL_PLAINTEXT")]}
    with _sidecar(secured, f"wrong-{mechanism}", keys, kafka) as rlm:
        _answers_not_available(rlm, "wrong-password")
        log = rlm.daemon.log_text()
    assert (
        f"refused rlm's SASL {mechanism} authentication as 'rlm' "
        "(cluster.sasl_username, cluster.sasl_password_file)"
    ) in log, log
    assert "WARNING" in log.split("refused rlm's SASL", 1)[0].rsplit("\n", 1)[-1]


def test_a_certificate_the_ca_did_not_sign_answers_not_available(secured: Secured) -> None:
    keys = _cluster_keys(secured, "SSL", "", ca=secured.other_ca)
    keys.pop("bootstrap_servers")
    with _sidecar(secured, "wrong-ca", keys, {"coordinator_bootstrap": [secured.listener("SSL")]}) as rlm:
        _answers_not_available(rlm, "wrong-ca")
        log = rlm.daemon.log_text()
    assert "has a TLS certificate that does not verify against cluster.ssl_cafile" in log, log
