"""The broker's deadlines of a partition's untiered segments, as a pass and status see them
(docs/topic-policy.md §8; the model: rlm.tiering.expire.deadlines).

Deadlines never decrease with the offset, so the smallest margin of a partition is its oldest
pending segment's that the broker still has (one the broker already deleted is held by its sight
pin and has no deadline left). Each pass of the leader publishes it (``rlm_retention_margin_seconds``,
``+Inf`` without a deadline) and logs one warning when it falls below ``tiering.deadline_warn_ms``,
again only after it rose back above; the daemon passes partitions nearest their deadline first
(:meth:`rlm.tiering.manager.RemoteLogManager.copy_order`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from rlm.logdir.discovery import PartitionState, SegmentFiles
from rlm.logdir.timestamps import largest_timestamp
from rlm.tiering.expire.deadlines import Deadline, LocalRetention, LocalSegment, broker_deadlines, margin_ms
from rlm.tiering.expire.policy import TopicPolicy
from rlm.tiering.local import PartitionContext

__all__ = ["deadline_fields", "estimate", "forget_deadline", "note_deadline"]

log = logging.getLogger(__name__)

Pending = Sequence[tuple[SegmentFiles, int, int]]


def estimate(
    segments: Sequence[SegmentFiles],
    pending: Pending,
    policy: TopicPolicy,
    state: PartitionState,
    now_ms: int,
) -> Deadline | None:
    """The :class:`Deadline` of the oldest of ``pending`` still in ``segments`` (the local
    listing, oldest first); None when none is. Reads the largest timestamp of that segment and the
    older ones only (time retention never deletes a segment before an older one)."""
    waiting = {p[0].base_offset for p in pending}
    first = next((n for n, s in enumerate(segments) if s.base_offset in waiting), None)
    if first is None:
        return None
    local = [
        LocalSegment(
            s.base_offset,
            s.size,
            largest_timestamp(s, active=n + 1 == len(segments)) if n <= first else None,
            segments[n + 1].base_offset if n + 1 < len(segments) else None,
        )
        for n, s in enumerate(segments)
    ]
    log_start = state.log_start_offset if state.log_start_offset is not None else segments[0].base_offset
    retention = LocalRetention(
        int(policy.local_retention_ms.value), int(policy.local_retention_bytes.value), log_start
    )
    return broker_deadlines(local, retention, now_ms)[first]


def note_deadline(
    ctx: PartitionContext,
    segments: Sequence[SegmentFiles],
    pending: Pending,
    policy: TopicPolicy,
    state: PartitionState,
) -> Deadline | None:
    """After the leader's copies: estimate what is still pending (``pending`` filtered by the
    highest tiered offset), remember it on ``ctx`` for the copy order, publish the margin, warn
    once per episode below ``tiering.deadline_warn_ms``."""
    highest = ctx.progress.highest_tiered_offset
    left = [p for p in pending if p[1] - 1 > highest]
    now = ctx.shared.clock_ms()
    deadline = ctx.deadline = estimate(segments, left, policy, state, now)
    margin = margin_ms(deadline, now)
    ctx.series(ctx.shared.metrics.retention_margin).set(math.inf if margin is None else margin / 1000)
    warn_ms = ctx.shared.settings.deadline_warn_ms
    if margin is None or warn_ms < 0 or margin >= warn_ms:
        ctx.deadline_warned = False
    elif not ctx.deadline_warned:
        assert deadline is not None
        ctx.deadline_warned = True
        log.warning(
            "%s: the broker may delete segment %d by its %s retention in %.1f s and it is not tiered "
            "yet (tiering.deadline_warn_ms %d; its sight pin then holds it; docs/topic-policy.md §8)",
            ctx.part.name,
            deadline.base_offset,
            deadline.cause,
            margin / 1000,
            warn_ms,
        )
    return deadline


def forget_deadline(ctx: PartitionContext) -> None:
    """A follower's pass: no deadline of its own to watch (the leader copies), so none orders its
    passes and its margin is ``+Inf`` — a former leader's last margin must not stay behind."""
    ctx.deadline, ctx.deadline_warned = None, False
    ctx.series(ctx.shared.metrics.retention_margin).set(math.inf)


def deadline_fields(deadline: Deadline | None, now_ms: int, warn_ms: int) -> dict[str, Any]:
    """The status row's fields (docs/topic-policy.md §8): the smallest margin (ms, null without a
    deadline) and whether it is below ``warn_ms`` (``tiering.deadline_warn_ms``; -1: never), that
    deadline (epoch ms), its segment and rule, and the size headroom (bytes)."""
    margin = margin_ms(deadline, now_ms)
    return {
        "retention_margin_ms": margin,
        "retention_margin_low": margin is not None and warn_ms >= 0 and margin < warn_ms,
        "retention_deadline_ms": deadline.deadline_ms if deadline is not None else None,
        "retention_deadline_offset": deadline.base_offset if deadline is not None else None,
        "retention_deadline_cause": deadline.cause if deadline is not None else None,
        "retention_headroom_bytes": deadline.headroom_bytes if deadline is not None else None,
    }
