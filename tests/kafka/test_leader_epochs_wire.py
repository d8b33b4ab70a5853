"""OffsetForLeaderEpoch, and the leader epoch in Metadata, Fetch and ListOffsets, on the wire
(docs/kafka-listener.md §5.4), over real brokers' partitions whose leader changed several times
(tests' fixtures: their ``leader-epoch-checkpoint`` is the broker's own, read here as plain text)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.consumer import (
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
)
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from rlm.testing.kafka_wire import fetch_request
from tests.kafka.conftest import Tiered
from tests.kafka.helpers import call

pytestmark = pytest.mark.integration

FENCED, UNKNOWN_EPOCH, CLUSTER_AUTHORIZATION_FAILED = 74, 75, 31
TOPIC = "oms_order_status_changed"


def _broker_epochs(part: Path) -> list[tuple[int, int]]:
    """The broker's checkpoint: version line, count line, then ``epoch start`` lines."""
    lines = (part / "leader-epoch-checkpoint").read_text().split("\n")
    return [(int(a), int(b)) for a, b in (ln.split() for ln in lines[2 : 2 + int(lines[1])])]


def _partition(tiered: Tiered) -> tuple[int, list[tuple[int, int]]]:
    """A partition of TOPIC whose broker lived through several leader epochs."""
    for (topic, p), path in sorted(tiered.parts.items()):
        if topic == TOPIC and len(_broker_epochs(path)) >= 3:
            return p, _broker_epochs(path)
    raise AssertionError("no fixture partition with 3 leader epochs")


def _ofle(
    port: int, partition: int, asks: list[tuple[int, int]], version: int = 4, replica: int = -1
) -> list[Any]:
    part = OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition
    req = OffsetForLeaderEpochRequest(
        replica_id=replica,
        topics=[
            OffsetForLeaderEpochRequest.OffsetForLeaderTopic(
                topic=TOPIC,
                partitions=[
                    part(partition=partition, current_leader_epoch=c, leader_epoch=e) for c, e in asks
                ],
            )
        ],
    )
    resp = call(port, req, version, OffsetForLeaderEpochResponse)
    return [(p.error_code, p.leader_epoch, p.end_offset) for t in resp.topics for p in t.partitions]


def test_offset_for_leader_epoch_answers_as_kafkas_epoch_cache(tiered: Tiered) -> None:
    port = tiered.daemon.port
    partition, epochs = _partition(tiered)
    hw = tiered.expected[(TOPIC, partition)].high_watermark
    latest = epochs[-1][0]
    want: list[tuple[int, int, int]] = []
    asks = []
    for i, (epoch, _start) in enumerate(epochs):
        end = epochs[i + 1][1] if i + 1 < len(epochs) else hw
        asks.append((-1, epoch))
        want.append((0, epoch, end))
        if i + 1 < len(epochs) and epochs[i + 1][0] > epoch + 1:  # an epoch this replica never led
            asks.append((-1, epoch + 1))
            want.append((0, epoch, epochs[i + 1][1]))  # the floor epoch, ending where the next starts
    asks += [
        (-1, epochs[0][0] - 1),
        (-1, -1),
        (-1, latest + 1),
        (latest, latest),
        (latest - 1, latest),
        (latest + 1, latest),
    ]
    want += [
        (0, epochs[0][0] - 1, epochs[0][1]),  # older than every entry: ends where the first starts
        (0, -1, -1),
        (UNKNOWN_EPOCH, -1, -1),  # newer than rlm knows: retriable, never Kafka's UNDEFINED
        (0, latest, hw),
        (FENCED, -1, -1),
        (UNKNOWN_EPOCH, -1, -1),
    ]
    for version in (2, 3, 4):
        assert _ofle(port, partition, asks, version) == want
    assert _ofle(port, partition, [(-1, latest)], replica=1) == [(CLUSTER_AUTHORIZATION_FAILED, -1, -1)]


def test_metadata_fetch_and_list_offsets_carry_and_check_the_leader_epoch(tiered: Tiered) -> None:
    port = tiered.daemon.port
    partition, epochs = _partition(tiered)
    latest = epochs[-1][0]
    meta = call(
        port,
        MetadataRequest(
            topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)], allow_auto_topic_creation=False
        ),
        9,
        MetadataResponse,
    )
    [topic] = meta.topics
    assert {p.partition_index: p.leader_epoch for p in topic.partitions}[partition] == latest

    def fetched(current: int) -> Any:
        req = fetch_request([(TOPIC, partition, epochs[-1][1])])
        req.topics[0].partitions[0].current_leader_epoch = current
        resp = call(port, req, 12, FetchResponse)
        return resp.responses[0].partitions[0]

    assert fetched(latest).error_code == 0 and fetched(latest).records
    assert fetched(-1).error_code == 0
    assert (fetched(latest - 1).error_code, fetched(latest + 1).error_code) == (FENCED, UNKNOWN_EPOCH)

    def listed(current: int) -> int:
        part = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition
        req = ListOffsetsRequest(
            replica_id=-1,
            isolation_level=0,
            topics=[
                ListOffsetsRequest.ListOffsetsTopic(
                    name=TOPIC,
                    partitions=[part(partition_index=partition, current_leader_epoch=current, timestamp=-1)],
                )
            ],
        )
        resp = call(port, req, 9, ListOffsetsResponse)
        return int(resp.topics[0].partitions[0].error_code)

    assert (listed(latest), listed(-1), listed(latest - 1), listed(latest + 1)) == (
        0,
        0,
        FENCED,
        UNKNOWN_EPOCH,
    )
