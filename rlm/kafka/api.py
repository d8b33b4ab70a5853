"""The listener's request handlers: one method per served API, request body in, response body out
(kafka-python ``kafka.protocol`` objects; docs/kafka-listener.md). Blocking: the server runs them
in its thread pool. The listener is one broker (``node_id``) that leads every partition rlm holds.
A Fetch response holds at most min(``max_bytes``, ``kafka.fetch_max_bytes``) of records, the first
partition with data excepted by one batch, and reads no more than that (docs/kafka-listener.md §5).
"""

from __future__ import annotations

import base64
import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from kafka.protocol.admin import DeleteRecordsResponse, DescribeConfigsResponse
from kafka.protocol.consumer import FetchResponse, ListOffsetsResponse
from kafka.protocol.metadata import FindCoordinatorResponse, MetadataResponse
from kafka.protocol.producer import InitProducerIdResponse, ProduceResponse

from rlm.cluster.log_starts import LogStartQuery
from rlm.errors import RlmError
from rlm.formats.naming import is_internal_topic
from rlm.kafka.protocol import Api, Codes, api_versions_body
from rlm.kafka.reads import (
    FetchedPartition,
    error_code,
    fetch_partition,
    list_offset,
    offsets_only,
    partition_marks,
    served,
)
from rlm.logdir.discovery import PartitionDir
from rlm.tiering.delete_records import DeletedRecords
from rlm.tiering.read import TieredReaders, check_topic_name

#: ``(topic, partition, before) -> answer``: the daemon's rlm.tiering.delete_records.delete_records.
Deleter = Callable[[str, int, int], DeletedRecords]

__all__ = ["FETCH_MAX_BYTES", "Deleter", "FetchAnswer", "KafkaApi"]

#: Kafka's ``fetch.max.bytes`` default (55 MiB): the response bound when no other is given.
FETCH_MAX_BYTES = 57_671_680

log = logging.getLogger(__name__)

_TOPIC_RESOURCE, _BROKER_RESOURCE = 2, 4
_SOURCE_TOPIC, _SOURCE_DEFAULT = 1, 5  # DescribeConfigs config_source: DYNAMIC_TOPIC_CONFIG, DEFAULT
_STRING, _LONG = 2, 5  # DescribeConfigs config_type (v3+)
_DESCRIBED = ("cleanup.policy", "retention.bytes", "retention.ms")


@dataclass(frozen=True, slots=True)
class FetchAnswer:
    """One pass over a Fetch request: the response, its record bytes, whether a partition failed."""

    body: Any
    record_bytes: int
    errors: bool


def _topic_uuid(topic_id: str | None) -> uuid.UUID:
    """``partition.metadata``'s base64url topic id as a UUID; the zero UUID when there is none."""
    if not topic_id:
        return uuid.UUID(int=0)
    try:
        return uuid.UUID(bytes=base64.urlsafe_b64decode(topic_id + "=" * (-len(topic_id) % 4)))
    except ValueError:
        return uuid.UUID(int=0)


class KafkaApi:
    def __init__(
        self,
        readers: TieredReaders,
        *,
        node_id: int = 0,
        cluster_id: str = "rlm",
        deleter: Deleter | None = None,
    ) -> None:
        """``deleter``: what DeleteRecords does (the daemon's manager); None: refused."""
        self.readers = readers
        self.deleter = deleter
        self.node_id = node_id
        self.cluster_id = cluster_id

    # -- cluster ------------------------------------------------------------------------------

    def api_versions(self, _req: Any, _version: int) -> Any:
        return api_versions_body()

    def metadata(self, req: Any, version: int, host: str, port: int) -> Any:
        """Every partition rlm holds (or the ones asked for), this node their only replica."""
        asked = None if req.topics is None else [t.name for t in req.topics]
        if version == 0 and not asked:
            asked = None  # v0: an empty list means every topic
        by_topic: dict[str, list[PartitionDir]] = defaultdict(list)
        for part in self.readers.partitions():
            if served(self.readers, part.topic):
                by_topic[part.topic].append(part)
        names = sorted(by_topic) if asked is None else list(dict.fromkeys(asked))
        cls = MetadataResponse
        topics = [self._metadata_topic(name, by_topic.get(name, [])) for name in names]
        broker = cls.MetadataResponseBroker(node_id=self.node_id, host=host, port=port, rack=None)
        return cls(
            throttle_time_ms=0,
            brokers=[broker],
            cluster_id=self.cluster_id,
            controller_id=self.node_id,
            topics=topics,
        )

    def _metadata_topic(self, name: str, parts: list[PartitionDir]) -> Any:
        topic = MetadataResponse.MetadataResponseTopic
        if not parts:
            try:
                check_topic_name(name)
                code = Codes.UNKNOWN_TOPIC_OR_PARTITION
            except RlmError:
                code = Codes.INVALID_TOPIC_EXCEPTION
            return topic(
                error_code=code, name=name, topic_id=uuid.UUID(int=0), is_internal=False, partitions=[]
            )
        node, held = self.node_id, {p.partition for p in parts}
        entry = topic.MetadataResponsePartition
        # Leader epoch -1: clients then skip epoch validation (OffsetForLeaderEpoch is not served).
        # Partitions below the highest one held but not in these log dirs are listed without a
        # leader: clients index partitions by id (librdkafka ignores a partition 3 of a topic
        # said to have one partition), and a real cluster lists a partition whose broker is down so.
        partitions = [
            entry(
                error_code=Codes.NONE,
                partition_index=i,
                leader_id=node,
                leader_epoch=-1,
                replica_nodes=[node],
                isr_nodes=[node],
                offline_replicas=[],
            )
            if i in held
            else entry(
                error_code=Codes.LEADER_NOT_AVAILABLE,
                partition_index=i,
                leader_id=-1,
                leader_epoch=-1,
                replica_nodes=[],
                isr_nodes=[],
                offline_replicas=[],
            )
            for i in range(max(held) + 1)
        ]
        return topic(
            error_code=Codes.NONE,
            name=name,
            topic_id=_topic_uuid(parts[0].topic_id),
            is_internal=is_internal_topic(name),
            partitions=partitions,
        )

    def describe_configs(self, req: Any, _version: int) -> Any:
        """retention.ms, retention.bytes and cleanup.policy of a topic, as rlm's policy resolves
        them: the retention of what rlm serves is the remote tier's (docs/topic-policy.md §1); a
        broker resource has no configs here."""
        cls = DescribeConfigsResponse
        results = []
        for res in req.resources:
            code, configs = Codes.NONE, []
            if res.resource_type == _TOPIC_RESOURCE:
                if not self._holds(res.resource_name):
                    code = Codes.UNKNOWN_TOPIC_OR_PARTITION
                else:
                    configs = self._topic_configs(res.resource_name, res.configuration_keys)
            elif res.resource_type != _BROKER_RESOURCE:
                code = Codes.INVALID_REQUEST
            results.append(
                cls.DescribeConfigsResult(
                    error_code=code,
                    error_message=None,
                    resource_type=res.resource_type,
                    resource_name=res.resource_name,
                    configs=configs,
                )
            )
        return cls(throttle_time_ms=0, results=results)

    def _holds(self, topic: str) -> bool:
        try:
            return served(self.readers, topic) and bool(self.readers.partitions([topic]))
        except RlmError:
            return False

    def _topic_configs(self, topic: str, keys: list[str] | None) -> list[Any]:
        policy = self.readers.policies.policy(topic)
        values = {
            "retention.ms": policy.retention_ms,
            "retention.bytes": policy.retention_bytes,
            "cleanup.policy": policy.cleanup_policy,
        }
        entry = DescribeConfigsResponse.DescribeConfigsResult.DescribeConfigsResourceResult
        out = []
        for name in _DESCRIBED:
            if keys is not None and name not in keys:
                continue
            setting = values[name]
            out.append(
                entry(
                    name=name,
                    value=str(setting.value),
                    read_only=True,
                    config_source=_SOURCE_TOPIC if setting.source == "kafka" else _SOURCE_DEFAULT,
                    is_sensitive=False,
                    synonyms=[],
                    config_type=_STRING if name == "cleanup.policy" else _LONG,
                    documentation=None,
                )
            )
        return out

    # -- reads --------------------------------------------------------------------------------

    def list_offsets(self, req: Any, version: int) -> Any:
        committed = bool(getattr(req, "isolation_level", 0))
        cls = ListOffsetsResponse
        query = self.readers.log_start_query(
            [(t.name, p.partition_index) for t in req.topics for p in t.partitions]
        )
        topics = []
        for t in req.topics:
            parts = []
            for p in t.partitions:
                got = list_offset(
                    self.readers, t.name, p.partition_index, p.timestamp, committed, version, query
                )
                parts.append(
                    cls.ListOffsetsTopicResponse.ListOffsetsPartitionResponse(
                        partition_index=p.partition_index,
                        error_code=got.error,
                        timestamp=got.timestamp,
                        offset=got.offset,
                        leader_epoch=got.leader_epoch,
                    )
                )
            topics.append(cls.ListOffsetsTopicResponse(name=t.name, partitions=parts))
        return cls(throttle_time_ms=0, topics=topics)

    def fetch(
        self, req: Any, _version: int, reader_key: Hashable, *, fetch_max_bytes: int = FETCH_MAX_BYTES
    ) -> FetchAnswer:
        """One pass over the partitions in request order, as Kafka's ``ReplicaManager.readFromLog``
        (docs/kafka-listener.md §5.1). The response bound is min(request ``max_bytes``,
        ``fetch_max_bytes``) record bytes; each partition gets at most its ``partition_max_bytes``
        and what is left of the bound, in whole batches — except that the first partition with
        records gets one whole batch however large ("minOneMessage", KIP-74), so a consumer always
        progresses. A later partition whose next batch does not fit answers no records. Every read
        is bounded by its limit (+ that one batch) at the source."""
        cls = FetchResponse
        if getattr(req, "session_id", 0):  # no fetch session was ever created here
            return FetchAnswer(
                cls(
                    throttle_time_ms=0,
                    error_code=Codes.FETCH_SESSION_ID_NOT_FOUND,
                    session_id=0,
                    responses=[],
                ),
                0,
                True,
            )
        committed = bool(req.isolation_level)
        budget, total, errors = min(req.max_bytes, fetch_max_bytes), 0, False
        # one question to the broker about log starts for every partition that needs it (docs/visibility.md)
        query = self.readers.log_start_query(
            [(t.topic, p.partition) for t in req.topics for p in t.partitions]
        )
        responses = []
        for t in req.topics:
            parts = []
            for p in t.partitions:
                limit = min(p.partition_max_bytes, budget - total)
                got = self._fetch_one(t.topic, p, committed, limit, total > 0, reader_key, query)
                total += len(got.records)
                errors = errors or got.error != Codes.NONE
                parts.append(_partition_data(p.partition, got))
            responses.append(cls.FetchableTopicResponse(topic=t.topic, partitions=parts))
        return FetchAnswer(
            cls(throttle_time_ms=0, error_code=Codes.NONE, session_id=0, responses=responses), total, errors
        )

    def fetch_marks(self, req: Any) -> tuple[tuple[int, int], ...]:
        """Per asked partition, ``(log start, visible end)`` now: what a waiting Fetch re-checks
        instead of reading records again (docs/kafka-listener.md §5); no record is read."""
        return tuple(
            partition_marks(self.readers, t.topic, p.partition, p.fetch_offset)
            for t in req.topics
            for p in t.partitions
        )

    def _fetch_one(
        self,
        topic: str,
        p: Any,
        committed: bool,
        limit: int,
        started: bool,
        reader_key: Hashable,
        query: LogStartQuery | None,
    ) -> FetchedPartition:
        """``limit``: the partition's share of the bound; ``started``: a partition before this one
        answered records, so the one-batch exception is used up."""
        if started and limit <= 0:
            return offsets_only(self.readers, topic, p.partition, query)
        got = fetch_partition(
            self.readers, topic, p.partition, p.fetch_offset, limit, committed, reader_key, query
        )
        if started and len(got.records) > limit:  # its first batch does not fit: offsets only
            return FetchedPartition(
                got.error,
                got.high_watermark,
                got.last_stable_offset,
                got.log_start_offset,
                b"",
                [] if committed else None,
            )
        return got

    # -- what a read-only broker refuses ------------------------------------------------------

    def find_coordinator(self, req: Any, _version: int) -> Any:
        """Groups refused (``kafka.groups = "refuse"``, or no bootstrap to delegate to; else
        rlm/kafka/coordinator.py answers), transactions always. No error code makes a client with a
        group id fall back to manual assignment (kafka-python, aiokafka and librdkafka all keep asking while
        the coordinator is "not available", and poll nothing): GROUP_AUTHORIZATION_FAILED is not
        retriable, so such a client fails at once with an error naming the group instead of
        hanging. Clients without a group id never ask (docs/kafka-listener.md "Groups")."""
        code = (
            Codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            if req.key_type == 1
            else Codes.GROUP_AUTHORIZATION_FAILED
        )
        return FindCoordinatorResponse(
            throttle_time_ms=0,
            error_code=code,
            error_message="rlm's Kafka listener serves no consumer groups",
            node_id=-1,
            host="",
            port=-1,
        )

    @staticmethod
    def group_error(api: Api, _req: Any, _version: int) -> Any:
        """JoinGroup, SyncGroup, Heartbeat, LeaveGroup: GROUP_AUTHORIZATION_FAILED (see
        :meth:`find_coordinator`)."""
        return api.response(error_code=Codes.GROUP_AUTHORIZATION_FAILED)

    def produce(self, req: Any, _version: int) -> Any:
        """Read-only: every partition answers TOPIC_AUTHORIZATION_FAILED (no write permission),
        which producers report at once instead of retrying."""
        cls = ProduceResponse
        out = []
        for t in req.topic_data:
            parts = [
                cls.TopicProduceResponse.PartitionProduceResponse(
                    index=p.index,
                    error_code=Codes.TOPIC_AUTHORIZATION_FAILED,
                    base_offset=-1,
                    log_append_time_ms=-1,
                    log_start_offset=-1,
                    record_errors=[],
                    error_message="rlm's Kafka listener is read-only",
                )
                for p in t.partition_data
            ]
            out.append(cls.TopicProduceResponse(name=t.name, partition_responses=parts))
        return cls(responses=out, throttle_time_ms=0)

    def delete_records(self, req: Any, _version: int, user: str | None) -> Any:
        """rlm's DeleteRecords (docs/kafka-listener.md "DeleteRecords"): only for a connection
        authenticated by SASL (``user``); else every partition answers TOPIC_AUTHORIZATION_FAILED,
        as Kafka answers a principal without DELETE on the topic. Partition by partition, in
        request order; an error answers that partition's code with low watermark -1."""
        cls = DeleteRecordsResponse.DeleteRecordsTopicResult
        topics = []
        for t in req.topics:
            parts = []
            for p in t.partitions:
                code, low = self._delete_one(t.name, p.partition_index, p.offset, user)
                parts.append(
                    cls.DeleteRecordsPartitionResult(
                        partition_index=p.partition_index, low_watermark=low, error_code=code
                    )
                )
            topics.append(cls(name=t.name, partitions=parts))
        return DeleteRecordsResponse(throttle_time_ms=0, topics=topics)

    def _delete_one(self, topic: str, partition: int, before: int, user: str | None) -> tuple[int, int]:
        if user is None or self.deleter is None:
            return Codes.TOPIC_AUTHORIZATION_FAILED, -1
        try:
            done = self.deleter(topic, partition, before)
        except RlmError as err:
            log.info("kafka: DeleteRecords %s-%d by %s: %s", topic, partition, user, err)
            return error_code(err), -1
        log.info("kafka: DeleteRecords %s-%d by %s: log start %d", topic, partition, user, done.low_watermark)
        return Codes.NONE, done.low_watermark

    def init_producer_id(self, _req: Any, _version: int) -> Any:
        return InitProducerIdResponse(
            throttle_time_ms=0,
            error_code=Codes.CLUSTER_AUTHORIZATION_FAILED,
            producer_id=-1,
            producer_epoch=-1,
        )


def _partition_data(partition: int, got: FetchedPartition) -> Any:
    data = FetchResponse.FetchableTopicResponse.PartitionData
    aborted = (
        None
        if got.aborted is None
        else [data.AbortedTransaction(producer_id=pid, first_offset=first) for pid, first in got.aborted]
    )
    return data(
        partition_index=partition,
        error_code=got.error,
        high_watermark=got.high_watermark,
        last_stable_offset=got.last_stable_offset,
        log_start_offset=got.log_start_offset,
        aborted_transactions=aborted,
        preferred_read_replica=-1,
        records=got.records,
    )
