"""The rows of ``rlm status`` / ``GET /v1/partitions`` the manager builds (docs/cli.md): a tiered
partition's from its context, an excluded one's from local files and the persisted progress."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlm.errors import RlmError
from rlm.logdir.scan import PartitionDir, list_segments
from rlm.tiering.expire.deadline_watch import deadline_fields, estimate
from rlm.tiering.expire.policy import TopicPolicy
from rlm.tiering.local.state import PROGRESS_FILE, PartitionContext, Progress, state_dir
from rlm.tiering.policy_report import excluded_row
from rlm.tiering.read.visibility import partition_offsets
from rlm.tiering.status import partition_row

if TYPE_CHECKING:
    from rlm.tiering.manager import RemoteLogManager

__all__ = ["excluded_status", "tiered_row"]


def excluded_status(m: RemoteLogManager, part: PartitionDir, pol: TopicPolicy) -> dict[str, Any]:
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


def tiered_row(m: RemoteLogManager, ctx: PartitionContext, progress: Progress) -> dict[str, Any]:
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
