"""rlm's own DeleteRecords: raise a partition's log start in the store (docs/visibility.md
"DeleteRecords through rlm"; the surfaces: docs/cli.md, docs/http-api.md, docs/kafka-listener.md).

The broker's DeleteRecords below its own local log start changes nothing on the broker, so it never
reaches rlm, yet those offsets are the history rlm serves. This is Kafka's DeleteRecords applied to
that history, with Kafka's semantics:

* the request names a target offset (-1: the high watermark, i.e. the visible end); one above it,
  or another negative one, is OFFSET_OUT_OF_RANGE; the new log start is ``max(current, target)``:
  it never moves backwards; the answer is the new low watermark (log start);
* the point is a store object (``manifests/log-start-<offset>.json``, docs/formats.md §6.8), so
  every sidecar of a cluster and a sidecar whose state dir was lost honour it; written by the
  partition's leader only (:class:`~rlm.errors.NotLeaderError` elsewhere);
* journaled: ``LOG_START_STARTED`` → marker → ``progress.json`` → ``LOG_START_FINISHED``; a crash
  in between leaves the journal open, so the next start recovers from the store and learns the
  marker (crash point ``after_log_start_marker``);
* once the progress holds it, every surface of this process (and the CLI's readers, which read
  ``progress.json``) stops serving below it; remote segments wholly below are then deleted by
  retention's ``log-start`` rule (journaled as every retention delete), a straddling one stays and
  is hidden below the point.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from rlm.errors import (
    InvalidArgumentError,
    NotLeaderError,
    OffsetOutOfRangeError,
    PartitionNotFoundError,
    RlmError,
)
from rlm.logdir.discovery import PartitionDir, discover_partitions
from rlm.tiering.expire import apply_retention
from rlm.tiering.idle import forget_mark
from rlm.tiering.local import PartitionContext, crash_point, of_context
from rlm.tiering.manager import PASS_LOCK_WAIT_S, RemoteLogManager
from rlm.tiering.read import (
    PartitionOffsets,
    check_partition_number,
    check_topic_name,
    partition_offsets,
    told_high_watermark,
)
from rlm.tiering.resume import load_state

__all__ = ["TO_HIGH_WATERMARK", "DeletedRecords", "delete_records", "raise_log_start"]

log = logging.getLogger(__name__)

#: The target offset that means "the high watermark" (Kafka's DeleteRecords ``-1``).
TO_HIGH_WATERMARK = -1
_ATTEMPT = "log-start"


@dataclass(frozen=True, slots=True)
class DeletedRecords:
    """The answer: the new ``low_watermark`` (log start), the one before, the remote segments
    retention deleted now."""

    topic: str
    partition: int
    low_watermark: int
    previous_log_start: int
    deleted_segments: int

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "low_watermark": self.low_watermark,
            "previous_log_start_offset": self.previous_log_start,
            "deleted_segments": self.deleted_segments,
        }


def _partition(manager: RemoteLogManager, topic: str, partition: int) -> PartitionDir:
    check_topic_name(topic)
    check_partition_number(partition)
    tiered, _excluded = manager.classify()
    for part in tiered:
        if (part.topic, part.partition) == (topic, partition):
            return part
    for part in discover_partitions(manager.settings.log.dirs):
        if (part.topic, part.partition) == (topic, partition):
            reason = manager.policy_for(part).reason or "excluded by the topic policy"
            raise InvalidArgumentError(f"rlm does not tier {topic}-{partition} ({reason})", field="topic")
    raise PartitionNotFoundError(f"partition {topic}-{partition} is not in log.dirs")


def _leading(manager: RemoteLogManager, ctx: PartitionContext) -> None:
    if manager.roles.cluster:
        manager.roles.refresh()
    lead = manager.roles.of(ctx)
    if lead.role != "leader":
        who = f"node {lead.leader}" if lead.leader is not None else "an unknown node"
        refused = NotLeaderError(
            f"{ctx.part.name}: this sidecar (node {manager.shared.node_id}) does not lead the "
            f"partition: {who} does; send delete-records to its rlm"
        )
        refused.leader = lead.leader
        raise refused


def _offsets(manager: RemoteLogManager, ctx: PartitionContext) -> PartitionOffsets:
    return partition_offsets(
        ctx.part,
        ctx.progress,
        checkpoints=manager.checkpoints.get(ctx.part.log_dir),
        policy=manager.settings.log.eligibility,
        broker_hw=told_high_watermark(ctx),
    )


def _target(offsets: PartitionOffsets, before: int, name: str) -> int:
    """The requested point (``-1``: the high watermark), checked against the visible range."""
    end = offsets.visible_end_offset if offsets.visible_end_offset is not None else 0
    if before == TO_HIGH_WATERMARK:
        return end
    if before < 0 or before > end:
        raise OffsetOutOfRangeError(
            f"{name}: delete-records offset {before} is out of range: the high watermark is {end} "
            "(-1 deletes up to it)",
            field="before",
        )
    return before


def raise_log_start(ctx: PartitionContext, point: int, node_id: int | None) -> None:
    """Journaled: the store's marker, then the progress (module doc); idempotent."""
    ctx.journal.append("LOG_START_STARTED", point, _ATTEMPT)
    of_context(ctx).create_log_start_marker(point, {"node_id": node_id, "written_ms": ctx.shared.clock_ms()})
    crash_point("after_log_start_marker")
    ctx.store.log_start = max(ctx.store.log_start, point)
    ctx.progress.delete_records_offset = max(ctx.progress.delete_records_offset, point)
    ctx.save_progress()
    ctx.journal.append("LOG_START_FINISHED", point, _ATTEMPT)


def delete_records(manager: RemoteLogManager, topic: str, partition: int, before: int) -> DeletedRecords:
    """Raise the log start of ``topic``-``partition`` to ``before`` (an offset; -1 = the high
    watermark), as Kafka's DeleteRecords does (module doc). Holds the partition's pass lock."""
    part = _partition(manager, topic, partition)
    ctx = manager.context(part)
    lock = manager.pass_lock(ctx)
    if not lock.acquire(timeout=PASS_LOCK_WAIT_S):
        raise RlmError(f"{part.name}: the partition stayed busy for {PASS_LOCK_WAIT_S:.0f} s; try again")
    try:
        _leading(manager, ctx)
        if not ctx.recovered:
            load_state(ctx, leader=True, roles=manager.roles)
        elif manager.roles.cluster:
            manager.roles.sync(ctx, leader=True)  # the chain and log start other sidecars wrote
        offsets = _offsets(manager, ctx)
        current = offsets.log_start_offset if offsets.log_start_offset is not None else 0
        point = max(current, _target(offsets, before, part.name))
        deleted = 0
        if point > current:
            raise_log_start(ctx, point, manager.shared.node_id)
            forget_mark(ctx)
            plan = apply_retention(ctx, retention_ms=-1, retention_bytes=-1)
            deleted = len(plan.expired)
            log.info(
                "%s: delete-records: log start %d -> %d (%d remote segments deleted)",
                part.name,
                current,
                point,
                deleted,
            )
        low = _offsets(manager, ctx).log_start_offset
        return DeletedRecords(topic, partition, point if low is None else low, current, deleted)
    finally:
        lock.release()
