"""The listener's request handlers: one method per served API, request body in, response body out
(kafka-python ``kafka.protocol`` objects; docs/kafka-listener.md). Blocking: the server runs them
in its thread pool. The listener is one broker (``node_id``) that leads every partition rlm holds.
A Fetch response holds at most min(``max_bytes``, ``kafka.fetch_max_bytes``) of records, the first
partition with data excepted by one batch, and reads no more than that (docs/kafka-listener.md §5).
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from kafka.protocol.admin import DeleteRecordsResponse, DescribeConfigsResponse
from kafka.protocol.consumer import ListOffsetsResponse, OffsetForLeaderEpochResponse
from kafka.protocol.metadata import FindCoordinatorResponse, MetadataResponse
from kafka.protocol.producer import InitProducerIdResponse, ProduceResponse

from rlm.errors import RlmError
from rlm.formats.naming import is_internal_topic
from rlm.kafka.fetching import FetchPlan, FetchRead, plan_fetch, read_plan, render
from rlm.kafka.protocol import Api, Codes, api_versions_body
from rlm.kafka.reads import (
    EpochEnd,
    epoch_end_offset,
    error_code,
    list_offset,
    served,
)
from rlm.kafka.sessions import FetchSessionCache
from rlm.kafka.topic_ids import TopicIds, topic_uuid
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


class KafkaApi:
    def __init__(
        self,
        readers: TieredReaders,
        *,
        node_id: int = 0,
        cluster_id: str = "rlm",
        deleter: Deleter | None = None,
        max_fetch_sessions: int = 1000,
    ) -> None:
        """``deleter``: what DeleteRecords does (the daemon's manager); None: refused.
        ``max_fetch_sessions``: the fetch-session cache's size (``kafka.max_fetch_sessions``)."""
        self.readers = readers
        self.sessions = FetchSessionCache(max_fetch_sessions)
        self.topic_ids = TopicIds(readers)
        self.deleter = deleter
        self.node_id = node_id
        self.cluster_id = cluster_id

    # -- cluster ------------------------------------------------------------------------------

    def api_versions(self, _req: Any, _version: int) -> Any:
        return api_versions_body()

    def metadata(self, req: Any, version: int, host: str, port: int) -> Any:
        """Every partition rlm holds (or the ones asked for, by name or from v12 by topic id),
        this node their only replica. An id no served topic has answers UNKNOWN_TOPIC_ID with a
        null name, as Kafka."""
        by_topic: dict[str, list[PartitionDir]] = defaultdict(list)
        for part in self.readers.partitions():
            if served(self.readers, part.topic):
                by_topic[part.topic].append(part)
        cls = MetadataResponse
        if req.topics is None or (version == 0 and not req.topics):  # v0: an empty list means all
            topics = [self._metadata_topic(name, by_topic[name]) for name in sorted(by_topic)]
        else:
            topics, named = [], set()
            for t in req.topics:
                name = t.name if t.name is not None else self.topic_ids.name_of(t.topic_id)
                if name is None:
                    topics.append(self._unknown_id(t.topic_id))
                elif name not in named:
                    named.add(name)
                    topics.append(self._metadata_topic(name, by_topic.get(name, [])))
        broker = cls.MetadataResponseBroker(node_id=self.node_id, host=host, port=port, rack=None)
        return cls(
            throttle_time_ms=0,
            brokers=[broker],
            cluster_id=self.cluster_id,
            controller_id=self.node_id,
            topics=topics,
            error_code=Codes.NONE,
        )

    @staticmethod
    def _unknown_id(topic_id: uuid.UUID) -> Any:
        return MetadataResponse.MetadataResponseTopic(
            error_code=Codes.UNKNOWN_TOPIC_ID, name=None, topic_id=topic_id, is_internal=False, partitions=[]
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
        node, held = self.node_id, {p.partition: p for p in parts}
        entry = topic.MetadataResponsePartition
        # Each held partition's leader epoch as rlm serves it (docs/kafka-listener.md §5.4):
        # clients send it back in Fetch and ListOffsets, and validate positions with
        # OffsetForLeaderEpoch when it changes.
        # Partitions below the highest one held but not in these log dirs are listed without a
        # leader: clients index partitions by id (librdkafka ignores a partition 3 of a topic
        # said to have one partition), and a real cluster lists a partition whose broker is down so.
        partitions = [
            entry(
                error_code=Codes.NONE,
                partition_index=i,
                leader_id=node,
                leader_epoch=self.readers.leader_epoch(held[i]),
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
            topic_id=topic_uuid(parts[0].topic_id),
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
                    self.readers,
                    t.name,
                    p.partition_index,
                    p.timestamp,
                    committed,
                    version,
                    query,
                    p.current_leader_epoch,
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

    def offset_for_leader_epoch(self, req: Any, _version: int) -> Any:
        """Where each asked epoch ends (docs/kafka-listener.md §5.4). Only consumers ask here: a
        replica id ≥ 0 (a follower) answers CLUSTER_AUTHORIZATION_FAILED, as Kafka answers a
        principal without ClusterAction."""
        cls = OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult
        follower = getattr(req, "replica_id", -1) >= 0
        topics = []
        for t in req.topics:
            parts = []
            for p in t.partitions:
                got = (
                    EpochEnd(Codes.CLUSTER_AUTHORIZATION_FAILED)
                    if follower
                    else epoch_end_offset(
                        self.readers, t.topic, p.partition, p.current_leader_epoch, p.leader_epoch
                    )
                )
                parts.append(
                    cls.EpochEndOffset(
                        error_code=got.error,
                        partition=p.partition,
                        leader_epoch=got.leader_epoch,
                        end_offset=got.end_offset,
                    )
                )
            topics.append(cls(topic=t.topic, partitions=parts))
        return OffsetForLeaderEpochResponse(throttle_time_ms=0, topics=topics)

    def plan_fetch(self, req: Any, version: int) -> FetchPlan:
        """The Fetch's session context and the partitions it reads (rlm/kafka/fetching.py)."""
        return plan_fetch(req, version, self.sessions, self.topic_ids)

    def read_fetch(
        self,
        plan: FetchPlan,
        max_bytes: int,
        reader_key: Hashable,
        *,
        fetch_max_bytes: int = FETCH_MAX_BYTES,
        sofar: FetchRead | None = None,
    ) -> FetchRead:
        """One pass over the plan (docs/kafka-listener.md §5.1): the response bound is
        min(request ``max_bytes``, ``fetch_max_bytes``) record bytes, read in whole batches, the
        first partition with records excepted by one batch (KIP-74). ``sofar``: a pass begun
        (:meth:`begin_read`), gone on with from the first partition it did not answer."""
        sofar = sofar or self.begin_read(plan)
        budget = min(max_bytes, fetch_max_bytes)
        return read_plan(self.readers, plan, budget, reader_key, sofar.query, sofar.results)

    def begin_read(self, plan: FetchPlan) -> FetchRead:
        """A pass over the plan with no partition read yet (:meth:`read_fetch` fills it)."""
        # one question to the broker about log starts for every partition that needs it (docs/visibility.md)
        query = self.readers.log_start_query([(w.name, w.partition) for w in plan.wanted if w.name])
        return FetchRead([], 0, False, query)

    def render_fetch(self, plan: FetchPlan, read: FetchRead) -> Any:
        """The body of the answer that goes out (once per request: it updates the session)."""
        return render(plan, read, self.sessions)

    def fetch(
        self, req: Any, version: int, reader_key: Hashable, *, fetch_max_bytes: int = FETCH_MAX_BYTES
    ) -> FetchAnswer:
        """Plan, one read and the answer of a Fetch that does not wait."""
        plan = self.plan_fetch(req, version)
        read = self.read_fetch(plan, req.max_bytes, reader_key, fetch_max_bytes=fetch_max_bytes)
        return FetchAnswer(self.render_fetch(plan, read), read.record_bytes, read.errors)

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
