"""Consumer groups at the listener (docs/kafka-listener.md §6), without a cluster: FindCoordinator
v0–6 names the listener itself while delegating, the relayed APIs are advertised and, with the
cluster unreachable, answer COORDINATOR_NOT_AVAILABLE in each API's shape; with ``groups =
"refuse"`` (or no bootstrap) today's refusal is kept exactly. The relay against a live broker is
tests/live/test_groups_live.py.

An in-process :class:`KafkaListener` over a real segment written by LogWriter, driven by raw
sockets with kafka-python's protocol classes (the independent codec)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.consumer import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
)

from rlm.config import load_settings, settings_from_mapping
from rlm.config.brokers import coordinator_servers
from rlm.errors import ConfigError
from rlm.formats.records import RecordSpec
from rlm.kafka.api import KafkaApi
from rlm.kafka.coordinator import Coordinator
from rlm.kafka.server import KafkaListener
from rlm.kafka.upstream import UpstreamSecurity
from rlm.logdir.writer import LogWriter
from rlm.storage.local import LocalBackend
from rlm.testing.daemon import free_port
from rlm.testing.secrets import write_secret
from rlm.tiering.read.readers import TieredReaders
from tests.kafka.helpers import (
    api_versions_of_a_future_client,
    call,
    closed_by_server,
    connect,
    toml_config,
)

T0 = 1_760_000_000_000
GROUP_AUTHORIZATION_FAILED, TXN_AUTHORIZATION_FAILED, INVALID_REQUEST, NOT_AVAILABLE = 30, 53, 42, 15
NODE = 7
Listen = Callable[[bool], KafkaListener]


@pytest.fixture
def listen(tmp_path: Path) -> Iterator[Listen]:
    """``listen(delegating)``: a started listener over partition ``w-0``, relaying groups to a
    cluster nobody listens on (a free port) when ``delegating``; stopped at the end."""
    logs = tmp_path / "logs"
    with LogWriter(logs, "w", 0, clock=lambda: T0) as w:
        w.append([RecordSpec(T0, b"k", b"v")])
        w.high_watermark = w.log_end_offset
    settings = load_settings(toml_config(tmp_path / "rlm.toml", [logs], tmp_path / "store", {}))
    readers = TieredReaders(settings, LocalBackend(root=str(tmp_path / "store")))
    started: list[KafkaListener] = []

    def start(delegating: bool) -> KafkaListener:
        kafka = replace(settings.kafka, listen="127.0.0.1:0", idle_timeout_ms=5000)
        nobody = Coordinator((f"127.0.0.1:{free_port()}",), node_id=NODE, timeout_s=5)
        coordinator = nobody if delegating else None
        started.append(KafkaListener(KafkaApi(readers, node_id=NODE), kafka, coordinator=coordinator).start())
        return started[-1]

    yield start
    for listener in started:
        listener.stop()
    readers.close()


def _versions(port: int) -> dict[int, tuple[int, int]]:
    resp = call(
        port,
        ApiVersionsRequest(client_software_name="t", client_software_version="1"),
        3,
        ApiVersionsResponse,
    )
    return {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}


def test_refusal_is_kept_without_delegation(listen: Listen) -> None:
    port = listen(False).port
    served = _versions(port)
    assert served[10] == (0, 3) and served[11] == (0, 5) and served[14] == (0, 4)
    assert 8 not in served and 9 not in served  # OffsetCommit, OffsetFetch: not served
    for version in range(4):
        got = call(port, FindCoordinatorRequest(key="g", key_type=0), version, FindCoordinatorResponse)
        assert got.error_code == GROUP_AUTHORIZATION_FAILED and got.node_id == -1
    join = _join()
    assert call(port, join, 5, JoinGroupResponse).error_code == GROUP_AUTHORIZATION_FAILED
    sock = connect(port)  # FindCoordinator v4 is not served: the connection closes
    try:
        FindCoordinatorRequest(key_type=0, coordinator_keys=["g"]).with_header(correlation_id=1)
        req = FindCoordinatorRequest(key_type=0, coordinator_keys=["g"])
        req.with_header(correlation_id=1, client_id="t")
        sock.sendall(bytes(req.encode(version=4, header=True, framed=True)))
        assert closed_by_server(sock)
    finally:
        sock.close()


def test_find_coordinator_names_the_listener_v0_to_v6(listen: Listen) -> None:
    listener = listen(True)
    port = listener.port
    served = _versions(port)
    assert served[10] == (0, 6)
    assert {k: served[k] for k in (8, 9, 11, 12, 13, 14)} == {
        8: (2, 9),
        9: (1, 9),
        11: (0, 9),
        12: (0, 4),
        13: (0, 5),
        14: (0, 5),
    }
    for version in range(4):
        got = call(port, FindCoordinatorRequest(key="g", key_type=0), version, FindCoordinatorResponse)
        assert (got.error_code, got.node_id, got.host, got.port) == (0, NODE, "127.0.0.1", port)
    txn = call(port, FindCoordinatorRequest(key="t", key_type=1), 3, FindCoordinatorResponse)
    assert (txn.error_code, txn.node_id) == (TXN_AUTHORIZATION_FAILED, -1)
    for version in (4, 5, 6):
        req = FindCoordinatorRequest(key_type=0, coordinator_keys=["a", "b"])
        got = call(port, req, version, FindCoordinatorResponse)
        assert [(c.key, c.error_code, c.node_id, c.host, c.port) for c in got.coordinators] == [
            ("a", 0, NODE, "127.0.0.1", port),
            ("b", 0, NODE, "127.0.0.1", port),
        ]
        txn = call(
            port, FindCoordinatorRequest(key_type=1, coordinator_keys=["t"]), version, FindCoordinatorResponse
        )
        assert [(c.key, c.error_code, c.node_id) for c in txn.coordinators] == [
            ("t", TXN_AUTHORIZATION_FAILED, -1)
        ]
    share = call(port, FindCoordinatorRequest(key_type=2, coordinator_keys=["s"]), 6, FindCoordinatorResponse)
    assert [(c.key, c.error_code) for c in share.coordinators] == [("s", INVALID_REQUEST)]


def _join() -> Any:
    return JoinGroupRequest(
        group_id="g",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=1000,
        member_id="",
        group_instance_id=None,
        protocol_type="consumer",
        protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")],
        reason=None,
    )


def _commit() -> Any:
    t = OffsetCommitRequest.OffsetCommitRequestTopic
    return OffsetCommitRequest(
        group_id="g",
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        retention_time_ms=-1,
        topics=[
            t(
                name="w",
                partitions=[
                    t.OffsetCommitRequestPartition(
                        partition_index=i,
                        committed_offset=1,
                        committed_leader_epoch=-1,
                        committed_metadata="",
                    )
                    for i in (0, 1)
                ],
            )
        ],
    )


def test_an_unreachable_cluster_answers_coordinator_not_available(listen: Listen) -> None:
    """Each relayed API at its lowest and highest version: error 15 in the response's own shape,
    the connection kept (the client asks FindCoordinator again and retries)."""
    port = listen(True).port
    sock = connect(port)
    try:
        simple = [
            (_join(), JoinGroupResponse, (0, 9)),
            (
                SyncGroupRequest(group_id="g", generation_id=1, member_id="m", assignments=[]),
                SyncGroupResponse,
                (0, 5),
            ),
            (HeartbeatRequest(group_id="g", generation_id=1, member_id="m"), HeartbeatResponse, (0, 4)),
            (LeaveGroupRequest(group_id="g", member_id="m", members=[]), LeaveGroupResponse, (0, 5)),
        ]
        for req, resp, versions in simple:
            for version in versions:
                assert call(port, req, version, resp, sock).error_code == NOT_AVAILABLE, (resp, version)
        for version in (2, 9):
            got = call(port, _commit(), version, OffsetCommitResponse, sock)
            assert [(p.partition_index, p.error_code) for t in got.topics for p in t.partitions] == [
                (0, NOT_AVAILABLE),
                (1, NOT_AVAILABLE),
            ]
        old = OffsetFetchRequest(
            group_id="g", topics=[OffsetFetchRequest.OffsetFetchRequestTopic(name="w", partition_indexes=[0])]
        )
        got = call(port, old, 1, OffsetFetchResponse, sock)
        assert [(p.partition_index, p.committed_offset, p.error_code) for p in got.topics[0].partitions] == [
            (0, -1, NOT_AVAILABLE)
        ]
        assert call(port, old, 7, OffsetFetchResponse, sock).error_code == NOT_AVAILABLE
        g = OffsetFetchRequest.OffsetFetchRequestGroup
        new = OffsetFetchRequest(
            groups=[g(group_id="g", member_id=None, member_epoch=-1, topics=None)], require_stable=True
        )
        got = call(port, new, 9, OffsetFetchResponse, sock)
        assert [(x.group_id, x.error_code) for x in got.groups] == [("g", NOT_AVAILABLE)]
    finally:
        sock.close()


def _settings(kafka: dict[str, Any], cluster: dict[str, Any] | None = None) -> Any:
    raw = {
        "log": {"dirs": ["/tmp"]},
        "remote": {"backend": "memory"},
        "kafka": kafka,
        "cluster": cluster or {},
    }
    return settings_from_mapping(raw)


def test_which_servers_groups_are_relayed_to() -> None:
    on = {"listen": "127.0.0.1:9092"}
    assert coordinator_servers(*_both(_settings(on))) == ()  # no bootstrap: refused
    cluster = {"bootstrap_servers": ["b:9092"]}
    assert coordinator_servers(*_both(_settings(on, cluster))) == ("b:9092",)
    mine = {**on, "coordinator_bootstrap": ["c:1", "d:2"]}
    assert coordinator_servers(*_both(_settings(mine, cluster))) == ("c:1", "d:2")
    assert coordinator_servers(*_both(_settings({**on, "groups": "refuse"}, cluster))) == ()
    assert coordinator_servers(*_both(_settings({}, cluster))) == ()  # no listener
    tls = {**cluster, "security_protocol": "SSL"}  # relayed as [cluster] says (UpstreamSecurity)
    assert coordinator_servers(*_both(_settings(on, tls))) == ("b:9092",)
    assert coordinator_servers(*_both(_settings({**on, "groups": "refuse"}, tls))) == ()
    with pytest.raises(ConfigError, match=r"kafka\.groups"):
        _settings({"groups": "own"})


def _both(settings: Any) -> tuple[Any, Any]:
    return settings.cluster, settings.kafka


def test_the_v0_fallback_lists_the_relayed_apis(listen: Listen) -> None:
    """An ApiVersions of a version the listener does not know gets the v0 fallback with the
    listener's own table, relayed APIs included."""
    answer = api_versions_of_a_future_client(listen(True).port)
    served = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
    assert answer.error_code == 35 and served[10] == (0, 6) and served[8] == (2, 9)


def test_relayed_versions_are_capped_by_the_clusters() -> None:
    """Once the cluster's ApiVersions is known, each relayed API is advertised at the versions both
    serve; one the cluster does not serve is not advertised."""
    from rlm.kafka.protocol import SERVED

    coordinator = Coordinator(("b:9092",), node_id=NODE, timeout_s=5)
    before = coordinator.served(SERVED)
    assert (before[11].min_version, before[11].max_version) == (0, 9)
    coordinator._cluster = {11: (2, 7), 8: (0, 10), 12: (0, 4), 13: (0, 5), 14: (0, 5)}  # as learned
    after = coordinator.served(SERVED)
    assert {k: (after[k].min_version, after[k].max_version) for k in (8, 11, 12)} == {
        8: (2, 9),
        11: (2, 7),
        12: (0, 4),
    }
    assert 9 not in after and after[10].max_version == 6 and SERVED[10].max_version == 3


def test_the_group_directory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Group ids come from clients: the directory of coordinators keeps the most recently used
    ``MAX_GROUPS_CACHED`` (a client inventing ids cannot grow it without bound); a forgotten group
    is asked of the cluster again. The cluster's FindCoordinator answer is stubbed (``_ask``): what
    is tested is rlm's cache, over a real loopback connection."""
    import asyncio

    from rlm.kafka import coordinator as module

    monkeypatch.setattr(module, "MAX_GROUPS_CACHED", 3)
    asked: list[str] = []

    async def ask(_self: Coordinator, _up: Any, group: str) -> tuple[int, str, int]:
        asked.append(group)
        return 1, "127.0.0.1", 9092

    monkeypatch.setattr(Coordinator, "_ask", ask)

    async def run() -> None:
        server = await asyncio.start_server(lambda _r, w: w.close(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        directory = Coordinator((f"127.0.0.1:{port}",), node_id=7, timeout_s=5)
        try:
            for group in ("a", "b", "c", "a", "d", "e", "a", "b"):
                assert await directory.locate(group) == (1, "127.0.0.1", 9092)
            assert len(directory._where) == 3
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(run())
    # a, b, c asked; a hit; d evicts b, e evicts c; a hit; b asked again
    assert asked == ["a", "b", "c", "d", "e", "b"]


def test_the_clusters_credentials_are_checked_before_anything_listens(tmp_path: Path) -> None:
    """UpstreamSecurity reads the password file and CA bundle when ``rlm run`` wires the listener:
    each missing or bad one is one ConfigError naming its key (tests/live/test_groups_secured.py
    relays with good ones)."""
    on = {"listen": "127.0.0.1:9092", "coordinator_bootstrap": ["b:9092"]}

    def security(cluster: dict[str, Any]) -> UpstreamSecurity:
        return UpstreamSecurity.of_cluster(_settings(on, cluster).cluster)

    with pytest.raises(ConfigError, match=r"cluster\.sasl_username is empty"):
        security({"security_protocol": "SASL_PLAINTEXT"})
    with pytest.raises(ConfigError, match=r"cluster\.sasl_password_file is empty"):
        security({"security_protocol": "SASL_PLAINTEXT", "sasl_username": "rlm"})
    password = write_secret(tmp_path / "pw", "s3cret\n")
    got = security(
        {"security_protocol": "SASL_SSL", "sasl_username": "rlm", "sasl_password_file": str(password)}
    )
    assert (got.mechanism, got.username, got.password, got.tls is not None) == (
        "PLAIN",
        "rlm",
        "s3cret",
        True,
    )
    assert "s3cret" not in repr(got)
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("no certificate here\n")
    with pytest.raises(ConfigError, match=r"cluster\.ssl_cafile = .*not a PEM certificate bundle"):
        security({"security_protocol": "SSL", "ssl_cafile": str(not_pem)})
    assert security({}) == UpstreamSecurity()  # PLAINTEXT: nothing to read
