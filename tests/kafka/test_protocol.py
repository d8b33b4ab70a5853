"""The listener's answers request by request (raw frames with kafka-python's protocol classes) and
its behaviour on bad input: Kafka's error codes, or a closed connection — and the daemon, and every
other connection, still answering afterwards."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
from kafka.errors import GroupAuthorizationFailedError, KafkaError
from kafka.protocol.admin import DescribeConfigsRequest, DescribeConfigsResponse
from kafka.protocol.consumer import FetchResponse, ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from rlm.testing.kafka_wire import fetch_request
from tests.kafka.conftest import Tiered
from tests.kafka.helpers import api_versions_of_a_future_client, call, closed_by_server, connect

pytestmark = pytest.mark.integration

UNKNOWN_TOPIC, OUT_OF_RANGE, INVALID_TOPIC, GROUP_AUTHORIZATION_FAILED = 3, 1, 17, 30
TOPIC_AUTHORIZATION_FAILED, UNSUPPORTED_VERSION = 29, 35


def _fetch(
    port: int,
    parts: list[tuple[str, int, int]],
    *,
    version: int = 12,
    max_bytes: int = 1 << 20,
    partition_max: int = 1 << 20,
    max_wait_ms: int = 0,
    min_bytes: int = 0,
) -> dict[Any, Any]:
    req = fetch_request(
        parts,
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        partition_max_bytes=partition_max,
    )
    resp = call(port, req, version, FetchResponse)
    assert resp is not None
    return {(t.topic, p.partition_index): p for t in resp.responses for p in t.partitions}


def _list_offsets(port: int, topic: str, partition: int, timestamp: int, version: int = 9) -> object:
    t = ListOffsetsRequest.ListOffsetsTopic
    req = ListOffsetsRequest(
        replica_id=-1,
        isolation_level=0,
        topics=[
            t(
                name=topic,
                partitions=[
                    t.ListOffsetsPartition(
                        partition_index=partition, current_leader_epoch=-1, timestamp=timestamp
                    )
                ],
            )
        ],
    )
    resp = call(port, req, version, ListOffsetsResponse)
    assert resp is not None
    return resp.topics[0].partitions[0]


def _api_versions_ok(port: int) -> bool:
    resp = call(
        port,
        ApiVersionsRequest(client_software_name="t", client_software_version="1"),
        3,
        ApiVersionsResponse,
    )
    return resp is not None and resp.error_code == 0


def test_api_versions_and_the_v0_fallback(tiered: Tiered) -> None:
    port = tiered.daemon.port
    resp = call(port, ApiVersionsRequest(), 0, ApiVersionsResponse)
    served = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
    assert served[1] == (4, 17) and served[2] == (1, 9) and served[3] == (0, 13)
    assert 19 not in served  # CreateTopics: not served
    assert served[21] == (0, 2)  # DeleteRecords: rlm's own, SASL only (docs/kafka-listener.md §12)
    # A version the listener does not know: Kafka answers v0 with UNSUPPORTED_VERSION and its list.
    answer = api_versions_of_a_future_client(port)
    assert answer.header.correlation_id == 9 and answer.error_code == UNSUPPORTED_VERSION
    assert {k.api_key for k in answer.api_keys} == set(served)


def test_metadata_lists_partitions_and_unknown_topics(tiered: Tiered) -> None:
    t = MetadataRequest.MetadataRequestTopic
    asked = [t(name="gen"), t(name="nope"), t(name="bad/name")]
    resp = call(
        tiered.daemon.port, MetadataRequest(topics=asked, allow_auto_topic_creation=True), 9, MetadataResponse
    )
    by_name = {x.name: x for x in resp.topics}
    assert by_name["nope"].error_code == UNKNOWN_TOPIC and by_name["bad/name"].error_code == INVALID_TOPIC
    gen = by_name["gen"]
    assert gen.error_code == 0 and sorted(p.partition_index for p in gen.partitions) == [0, 1]
    assert all(p.leader_id == resp.brokers[0].node_id for p in gen.partitions)
    assert resp.brokers[0].port == tiered.daemon.port
    # Only partition 1 of oms_order_created is in these log dirs: 0 is listed without a leader.
    sparse = (
        call(tiered.daemon.port, MetadataRequest(topics=[t(name="oms_order_created")]), 9, MetadataResponse)
        .topics[0]
        .partitions
    )
    assert [(p.partition_index, p.error_code, p.leader_id) for p in sparse] == [(0, 5, -1), (1, 0, 0)]
    everything = call(tiered.daemon.port, MetadataRequest(topics=None), 1, MetadataResponse)
    names = {x.name for x in everything.topics}
    # served with [server] serve_internal_topics, but never the KRaft log (docs/visibility.md)
    assert "__cluster_metadata" not in names and {"gen", "kp", "__consumer_offsets"} <= names


def test_fetch_errors_bounds_and_budget(tiered: Tiered) -> None:
    port = tiered.daemon.port
    e = tiered.expected[("gen", 0)]
    labels = {"api": "Fetch", "error": "OFFSET_OUT_OF_RANGE"}
    oor_before = tiered.daemon.metric("rlm_kafka_partition_errors_total", **labels)
    bytes_before = tiered.daemon.metric("rlm_kafka_fetch_bytes_total")
    got = _fetch(port, [("gen", 0, e.high_watermark + 10), ("nope", 0, 0), ("gen", 9, 0)])
    # As a broker answers it (seen beside a live one, #29): every offset of the answer unknown.
    oor = got[("gen", 0)]
    assert (oor.error_code, oor.high_watermark, oor.last_stable_offset, oor.log_start_offset) == (
        OUT_OF_RANGE,
        -1,
        -1,
        -1,
    )
    assert got[("nope", 0)].error_code == UNKNOWN_TOPIC and got[("gen", 9)].error_code == UNKNOWN_TOPIC
    below = tiered.expected[("oms_order_created", 1)]
    assert (
        _fetch(port, [("oms_order_created", 1, below.rows[0][0] - 1000)])[("oms_order_created", 1)].error_code
        == OUT_OF_RANGE
    )
    # At the high watermark: no error, no records — also when asked to wait for data (no hang).
    at_end = _fetch(port, [("gen", 0, e.high_watermark)], max_wait_ms=1500, min_bytes=1)[("gen", 0)]
    assert at_end.error_code == 0 and not at_end.records
    # max_bytes = 1: the first partition still gets one whole batch (KIP-74), the next none.
    tight = _fetch(port, [("gen", 0, 0), ("kp", 0, 0)], max_bytes=1, partition_max=1)
    first, second = tight[("gen", 0)], tight[("kp", 0)]
    assert (
        first.error_code == 0
        and first.records
        and int.from_bytes(first.records[8:12], "big") + 12 == len(first.records)
    )
    assert second.error_code == 0 and not second.records
    assert second.high_watermark == tiered.expected[("kp", 0)].high_watermark
    # no transaction in gen: its last stable offset is the high watermark, read_uncommitted or not
    assert first.log_start_offset == e.log_start and first.last_stable_offset == e.high_watermark
    assert second.last_stable_offset == second.high_watermark  # offsets only: the LSO all the same
    assert tiered.daemon.metric("rlm_kafka_partition_errors_total", **labels) - oor_before == 2
    assert tiered.daemon.metric("rlm_kafka_fetch_bytes_total") - bytes_before == len(first.records)


def test_list_offsets_special_timestamps(tiered: Tiered) -> None:
    port = tiered.daemon.port
    e = tiered.expected[("gen", 0)]
    local_start = min(int(p.stem) for p in tiered.parts[("gen", 0)].glob("*.log"))
    assert e.deleted_bases and local_start > e.rows[0][0]
    assert _list_offsets(port, "gen", 0, -1).offset == e.high_watermark
    assert _list_offsets(port, "gen", 0, -2).offset == e.log_start
    max_ts = max(r[1] for r in e.below_hw)
    first_max = next(r for r in e.below_hw if r[1] == max_ts)
    got = _list_offsets(port, "gen", 0, -3)
    assert (got.offset, got.timestamp) == (first_max[0], max_ts)
    assert _list_offsets(port, "gen", 0, -4).offset == local_start
    assert _list_offsets(port, "gen", 0, -5).offset == local_start - 1
    assert _list_offsets(port, "gen", 0, -3, version=6).error_code == UNSUPPORTED_VERSION
    assert _list_offsets(port, "gen", 0, -5, version=8).error_code == UNSUPPORTED_VERSION
    none = _list_offsets(port, "gen", 0, max_ts + 1)
    assert (none.error_code, none.offset, none.timestamp) == (0, -1, -1)
    assert _list_offsets(port, "nope", 0, -1).error_code == UNKNOWN_TOPIC


def test_describe_configs_and_refused_writes_and_groups(tiered: Tiered) -> None:
    port = tiered.daemon.port
    r = DescribeConfigsRequest.DescribeConfigsResource
    asked = [r(resource_type=2, resource_name=name, configuration_keys=None) for name in ("gen", "nope")]
    resp = call(
        port,
        DescribeConfigsRequest(resources=asked, include_synonyms=False, include_documentation=False),
        4,
        DescribeConfigsResponse,
    )
    gen, nope = resp.results
    assert {c.name: c.value for c in gen.configs} == {
        "cleanup.policy": "delete",
        "retention.bytes": "-1",
        "retention.ms": "-1",
    }
    assert nope.error_code == UNKNOWN_TOPIC
    admin = KafkaAdminClient(bootstrap_servers=tiered.daemon.bootstrap)  # as a client asks for them
    try:
        kp = ConfigResource(ConfigResourceType.TOPIC, "kp")
        described = admin.describe_configs([kp], config_filter="all")
    finally:
        admin.close()
    assert {k: v["value"] for k, v in described["topic"]["kp"].items()} == {
        "cleanup.policy": "delete",
        "retention.bytes": "-1",
        "retention.ms": "-1",
    }
    coord = call(port, FindCoordinatorRequest(key="g", key_type=0), 3, FindCoordinatorResponse)
    assert coord.error_code == GROUP_AUTHORIZATION_FAILED
    t = ProduceRequest.TopicProduceData
    produce = call(
        port,
        ProduceRequest(
            transactional_id=None,
            acks=1,
            timeout_ms=1000,
            topic_data=[t(name="gen", partition_data=[t.PartitionProduceData(index=0, records=b"")])],
        ),
        9,
        ProduceResponse,
    )
    assert produce.responses[0].partition_responses[0].error_code == TOPIC_AUTHORIZATION_FAILED
    producer = KafkaProducer(
        bootstrap_servers=tiered.daemon.bootstrap, retries=0, max_block_ms=10_000, enable_idempotence=False
    )
    try:
        with pytest.raises(KafkaError):
            producer.send("gen", b"x", partition=0).get(timeout=30)
    finally:
        producer.close(timeout=5)


def test_a_consumer_with_a_group_id_fails_at_once(tiered: Tiered) -> None:
    """No error code makes a client fall back from a group to manual assignment; a not-retriable one
    makes it fail clearly instead of polling nothing forever (docs/kafka-listener.md "Groups")."""
    consumer = KafkaConsumer(
        bootstrap_servers=tiered.daemon.bootstrap, group_id="analytics", enable_auto_commit=False
    )
    try:
        consumer.assign([TopicPartition("kp", 0)])
        consumer.seek_to_beginning()
        with pytest.raises(GroupAuthorizationFailedError):
            consumer.poll(timeout_ms=10_000)
    finally:
        consumer.close()


def test_consumer_resets_after_out_of_range(tiered: Tiered) -> None:
    """kafka-python seeks past the end, gets OFFSET_OUT_OF_RANGE, resets to the earliest offset
    (its auto_offset_reset) and reads the remote tier from there."""
    e = tiered.expected[("kp", 0)]
    tp = TopicPartition("kp", 0)
    consumer = KafkaConsumer(
        bootstrap_servers=tiered.daemon.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    try:
        consumer.assign([tp])
        consumer.seek(tp, e.high_watermark + 1000)
        got: list[tuple[int, bytes | None]] = []
        deadline = time.monotonic() + 60
        while len(got) < 3 and time.monotonic() < deadline:
            for msgs in consumer.poll(timeout_ms=1000).values():
                got += [(m.offset, m.value) for m in msgs]
    finally:
        consumer.close()
    assert got[:3] == [(r[0], r[3]) for r in e.rows[:3]]


def test_bad_frames_close_only_their_connection(tiered: Tiered) -> None:
    port = tiered.daemon.port
    daemon = tiered.daemon
    before = {r: daemon.metric("rlm_kafka_connections_closed_total", reason=r) for r in ("protocol", "idle")}
    # A bystander connection asks every 0.3 s (below the 2 s idle timeout) all along: never affected.
    bystander, answers, stop = connect(port), [], threading.Event()

    def ask() -> None:
        while not stop.is_set():
            resp = call(port, ApiVersionsRequest(), 0, ApiVersionsResponse, sock=bystander)
            answers.append(resp is not None and resp.error_code == 0)
            stop.wait(0.3)

    pinger = threading.Thread(target=ask)
    pinger.start()
    v12 = fetch_request([], max_bytes=1)
    v12.with_header(correlation_id=1, client_id="x")
    fetch_v99 = bytearray(v12.encode(version=12, header=True, framed=True))
    fetch_v99[6:8] = (99).to_bytes(2, "big")
    create_topics = bytes(fetch_v99[:4]) + (19).to_bytes(2, "big") + bytes(fetch_v99[6:])
    bad = {
        "unsupported Fetch version": bytes(fetch_v99),
        "an API not served (CreateTopics)": create_topics,
        "a frame above kafka.max_request_bytes": (2 << 20).to_bytes(4, "big") + b"\x00" * 64,
        "a negative frame size": (-5).to_bytes(4, "big", signed=True),
        "garbage inside a frame": (40).to_bytes(4, "big") + b"\x00\x01\x00\x0c" + os.urandom(36),
        "a frame shorter than a header": (3).to_bytes(4, "big") + b"abc",
        "half-open: part of a size, then silence": b"\x00\x00",
        "half-open: a frame cut short": (100).to_bytes(4, "big") + b"\x00\x12",
    }
    for what, data in bad.items():
        sock = connect(port)
        try:
            sock.sendall(data)
            assert closed_by_server(sock), what
        finally:
            sock.close()
        assert tiered.daemon.alive(), what
        assert _api_versions_ok(port), what
    stop.set()
    pinger.join()
    bystander.close()
    assert len(answers) > 10 and all(answers)
    # /metrics: 6 closed for their bytes, 2 for silence (each counted once, by its reason)
    assert daemon.metric("rlm_kafka_connections_closed_total", reason="protocol") - before["protocol"] == 6
    assert daemon.metric("rlm_kafka_connections_closed_total", reason="idle") - before["idle"] == 2
    assert daemon.metric("rlm_kafka_requests_total", api="ApiVersions") >= len(answers)


def test_a_client_that_stops_reading_does_not_stall_others(tiered: Tiered) -> None:
    """Pipelined fetches never read back: that connection is closed after the idle timeout, others
    are served meanwhile."""
    port = tiered.daemon.port
    stuck = socket.create_connection(("127.0.0.1", port))
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    first = tiered.expected[("oms_order_created", 1)].rows[0][0]
    req = fetch_request([("oms_order_created", 1, first)])
    req.with_header(correlation_id=1, client_id="stuck")
    frame = bytes(req.encode(version=12, header=True, framed=True))
    stuck.setblocking(False)
    try:
        for _ in range(40):
            try:
                stuck.send(frame)
            except BlockingIOError:
                break
        assert _api_versions_ok(port)
        assert tiered.daemon.alive()
    finally:
        stuck.close()
