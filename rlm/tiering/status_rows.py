"""The rows of ``rlm status`` / ``GET /v1/partitions`` the manager builds (docs/cli.md): a tiered
partition's from its context, an excluded one's from local files and the persisted progress."""

from __future__ import annotations

from typing import Any, Protocol

from rlm.config import Settings
from rlm.errors import RlmError
from rlm.logdir.checkpoint_cache import CheckpointCache
from rlm.logdir.discovery import PartitionDir, PartitionState, SegmentFiles, list_segments
from rlm.tiering.converge import RewrittenRange
from rlm.tiering.copy import PendingSegment
from rlm.tiering.expire import TopicPolicy, TopicPolicyResolver, deadline_fields, estimate
from rlm.tiering.local import PROGRESS_FILE, PartitionContext, Progress, SharedResources, state_dir
from rlm.tiering.policy_report import excluded_row
from rlm.tiering.read import partition_offsets, told_high_watermark
from rlm.tiering.roles import Roles
from rlm.tiering.status import partition_row

__all__ = ["StatusSource", "excluded_status", "tiered_row"]


class StatusSource(Protocol):
    """What the rows read from the manager (:class:`~rlm.tiering.manager.RemoteLogManager` is
    one): typed here so the rows need not import the manager that builds them."""

    settings: Settings
    shared: SharedResources
    checkpoints: CheckpointCache
    policies: TopicPolicyResolver
    roles: Roles

    def policy_for(self, part: PartitionDir) -> TopicPolicy: ...

    def pending(
        self, ctx: PartitionContext, segments: list[SegmentFiles], progress: Progress | None = None
    ) -> list[PendingSegment]: ...

    def state_of(self, ctx: PartitionContext) -> PartitionState: ...

    def compaction(self, ctx: PartitionContext, segments: list[SegmentFiles]) -> list[RewrittenRange]: ...


def excluded_status(m: StatusSource, part: PartitionDir, pol: TopicPolicy) -> dict[str, Any]:
    """A partition the topic policy leaves alone (docs/topic-policy.md §4)."""
    progress = Progress.load(state_dir(m.settings.tiering, part) / PROGRESS_FILE)
    return excluded_row(
        part,
        pol,
        progress,
        m.checkpoints.get(part.log_dir),
        m.policies.describe(),
        m.settings.log.eligibility,
    )


def tiered_row(m: StatusSource, ctx: PartitionContext, progress: Progress) -> dict[str, Any]:
    """A tiered partition's row from ``progress`` (live or persisted). For the leader it also
    re-estimates the broker's deadline, which orders the next passes (docs/topic-policy.md §8)."""
    segments = list_segments(ctx.part)
    conflict = ctx.identity_conflict is not None or ctx.part.identity_error is not None
    offsets = partition_offsets(
        ctx.part,
        Progress() if conflict else progress,
        segments,
        m.checkpoints.get(ctx.part.log_dir),
        m.settings.log.eligibility,
        broker_hw=told_high_watermark(ctx),
    )
    try:
        pending, waiting_error = m.pending(ctx, segments, progress), None
    except RlmError as err:  # unreadable checkpoints: the lag is unknown, the reason is shown
        pending, waiting_error = [], str(err)
    now = m.shared.clock_ms()
    if m.roles.of(ctx).role == "leader" and not waiting_error:  # also orders the next passes
        ctx.deadline = estimate(segments, pending, m.policy_for(ctx.part), m.state_of(ctx), now)
    extra = {
        **deadline_fields(ctx.deadline, now, m.settings.tiering.deadline_warn_ms),  # docs/topic-policy.md §8
        "compaction": [r.to_json() for r in m.compaction(ctx, segments)],
        "policy": m.policy_for(ctx.part).as_dict(),
        "kafka_configs": m.policies.describe(),
        "gaps": [g.to_json() for g in progress.gaps],  # docs/visibility.md, "Gaps"
        **m.roles.status(ctx),
    }
    return partition_row(
        ctx,
        offsets,
        segments,
        pending,
        waiting_error,
        conflict=conflict,
        now_ms=now,
        extra=extra,
    )
