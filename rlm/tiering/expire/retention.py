"""Remote retention by time and size (docs/formats.md §6.6): whole segments, oldest first.

Time: a segment expires when its max timestamp < now − ``retention_ms``. Size: while the
partition's remote bytes exceed ``retention_bytes``, the oldest segment goes — but, as Kafka's own
size retention does, only while what remains is still at least ``retention_bytes`` (never delete
below the limit). Deletion only ever removes a prefix: a segment younger than its successor's
deadline blocks nothing, but an undeletable oldest segment stops the walk, so the remote log
stays contiguous. Each delete: DELETE_STARTED → manifest → data → DELETE_FINISHED, idempotent.

Log start (Kafka's "log start offset breach"): a segment wholly below the DeleteRecords point
(``progress.delete_records_offset``, docs/visibility.md) is deleted whatever its age or the size
limit, reason ``"log-start"``; the boundary segment stays (readers never serve its earlier records).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from rlm.tiering.converge import note_deleted
from rlm.tiering.local import PartitionContext, crash_point, of_context
from rlm.tiering.store import SegmentManifest

__all__ = [
    "RetentionPlan",
    "apply_retention",
    "delete_segment",
    "expiry_reason",
    "plan_retention",
    "retention_due",
    "retention_pass",
    "time_expiry_ms",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RetentionPlan:
    expired: list[SegmentManifest]
    reason: dict[int, str]  # base offset → "log-start" | "time" | "size"

    @property
    def bytes(self) -> int:
        return sum(m.size_bytes for m in self.expired)


def plan_retention(
    manifests: Sequence[SegmentManifest],
    *,
    now_ms: int,
    retention_ms: int,
    retention_bytes: int,
    local_only_bytes: int = 0,
    log_start_offset: int = -1,
) -> RetentionPlan:
    """Which committed segments retention deletes now (pure; ``-1`` disables a limit): first
    those wholly below ``log_start_offset`` (the DeleteRecords point; -1 = none).
    ``local_only_bytes`` (local data not yet tiered) counts towards ``retention_bytes`` when the
    limit covers the whole log, as Kafka's ``retention.bytes`` does (docs/topic-policy.md)."""
    remaining = local_only_bytes + sum(m.size_bytes for m in manifests)
    expired: list[SegmentManifest] = []
    reason: dict[int, str] = {}
    for m in sorted(manifests, key=lambda m: m.base_offset):
        why = expiry_reason(
            m.last_offset,
            m.max_timestamp,
            m.size_bytes,
            remaining,
            now_ms=now_ms,
            retention_ms=retention_ms,
            retention_bytes=retention_bytes,
            log_start_offset=log_start_offset,
        )
        if why is None:
            break
        reason[m.base_offset] = why
        expired.append(m)
        remaining -= m.size_bytes
    return RetentionPlan(expired, reason)


def expiry_reason(
    last_offset: int,
    max_timestamp: int,
    size: int,
    remaining: int,
    *,
    now_ms: int,
    retention_ms: int,
    retention_bytes: int,
    log_start_offset: int,
) -> str | None:
    """Why the oldest remaining segment (offsets up to ``last_offset``, ``size`` bytes, of
    ``remaining`` bytes counted towards the size limit) is deleted now, None when it is kept: the
    rule :func:`plan_retention` applies segment by segment."""
    if last_offset < log_start_offset:
        return "log-start"
    if retention_ms >= 0 and max_timestamp < now_ms - retention_ms:
        return "time"
    if retention_bytes >= 0 and remaining - size >= retention_bytes:
        return "size"
    return None


def time_expiry_ms(max_timestamp: int, retention_ms: int) -> int | None:
    """When (ms) a segment with ``max_timestamp`` expires by time; None when time never expires it."""
    return None if retention_ms < 0 else max_timestamp + retention_ms + 1


def delete_segment(ctx: PartitionContext, manifest: SegmentManifest) -> None:
    """Manifest first (readers stop seeing the segment), then its data; journaled, idempotent."""
    remote = of_context(ctx)
    ctx.journal.append("DELETE_STARTED", manifest.base_offset, manifest.attempt_id)
    remote.delete_manifest(manifest.base_offset)
    crash_point("after_delete_manifest")
    remote.delete_attempt(manifest.base_offset, manifest.attempt_id)
    ctx.journal.append("DELETE_FINISHED", manifest.base_offset, manifest.attempt_id)


def apply_retention(
    ctx: PartitionContext,
    *,
    retention_ms: int | None = None,
    retention_bytes: int | None = None,
    local_only_bytes: int = 0,
) -> RetentionPlan:
    """Delete what :func:`plan_retention` selects; advance the remote log start; drop local sets
    entirely below it. Limits default to ``[tiering]``'s; the topic policy passes its own."""
    settings, metrics = ctx.shared.settings, ctx.shared.metrics
    retention_ms = settings.retention_ms if retention_ms is None else retention_ms
    retention_bytes = settings.retention_bytes if retention_bytes is None else retention_bytes
    plan = _due_plan(
        ctx, retention_ms=retention_ms, retention_bytes=retention_bytes, local_only_bytes=local_only_bytes
    )
    ctx.series(metrics.delete_lag_segments).set(len(plan.expired))
    ctx.series(metrics.delete_lag_bytes).set(plan.bytes)
    if not plan.expired:
        return plan
    for manifest in plan.expired:
        _delete_expired(ctx, manifest, plan.reason[manifest.base_offset])
    ctx.family.remove_below(ctx.progress.remote_log_start_offset)
    ctx.series(metrics.delete_lag_segments).set(0)
    ctx.series(metrics.delete_lag_bytes).set(0)
    ctx.publish_gauges()
    return plan


def _due_plan(
    ctx: PartitionContext, *, retention_ms: int, retention_bytes: int, local_only_bytes: int
) -> RetentionPlan:
    """:func:`plan_retention` of the partition now, or an empty plan when its oldest segment is
    kept (deletion removes a prefix): asked of the snapshot's header, a restart's pending
    manifests are parsed only when retention is due."""
    now_ms = ctx.shared.clock_ms()
    oldest = ctx.oldest_manifest()
    if (
        oldest is None
        or expiry_reason(
            oldest[1],
            oldest[2],
            oldest[3],
            local_only_bytes + ctx.remote_bytes,
            now_ms=now_ms,
            retention_ms=retention_ms,
            retention_bytes=retention_bytes,
            log_start_offset=ctx.progress.delete_records_offset,
        )
        is None
    ):
        return RetentionPlan([], {})
    return plan_retention(
        ctx.manifests,
        now_ms=now_ms,
        retention_ms=retention_ms,
        retention_bytes=retention_bytes,
        local_only_bytes=local_only_bytes,
        log_start_offset=ctx.progress.delete_records_offset,
    )


def _delete_expired(ctx: PartitionContext, manifest: SegmentManifest, reason: str) -> None:
    """Delete one expired segment (oldest first) and advance the remote log start past it
    (``progress.json`` saved after each, so a crash resumes where it stopped)."""
    metrics = ctx.shared.metrics
    try:
        delete_segment(ctx, manifest)
    except Exception:
        ctx.series(metrics.delete_errors).inc()
        raise
    ctx.manifests.remove(manifest)
    note_deleted(ctx, manifest)
    ctx.progress.remote_log_start_offset = (
        ctx.manifests[0].base_offset if ctx.manifests else ctx.progress.highest_tiered_offset + 1
    )
    ctx.save_progress()
    ctx.series(metrics.delete_requests).inc()
    log.info(
        "%s-%d: retention (%s) deleted remote segment %d-%d (%d bytes)",
        ctx.topic,
        ctx.partition,
        reason,
        manifest.base_offset,
        manifest.last_offset,
        manifest.size_bytes,
    )


def retention_pass(
    ctx: PartitionContext, *, retention_ms: int, retention_bytes: int, local_only_bytes: int = 0
) -> tuple[RetentionPlan, int | None]:
    """:func:`apply_retention`, and when (ms) retention by time deletes the oldest remaining
    segment next (None: never, by time) — an idle partition wakes for it (docs/operations.md)."""
    plan = apply_retention(
        ctx, retention_ms=retention_ms, retention_bytes=retention_bytes, local_only_bytes=local_only_bytes
    )
    oldest = ctx.oldest_manifest()
    return plan, None if oldest is None else time_expiry_ms(oldest[2], retention_ms)


def retention_due(
    ctx: PartitionContext, *, retention_ms: int, retention_bytes: int, local_only_bytes: int = 0
) -> tuple[bool, int | None]:
    """What :func:`retention_pass` would find, deleting nothing: whether it deletes something now,
    and when (ms) retention by time deletes next (None: never, by time). A follower asks it before
    it idles: what the leader's retention deletes, it learns from the next listing (roles.py)."""
    plan = _due_plan(
        ctx, retention_ms=retention_ms, retention_bytes=retention_bytes, local_only_bytes=local_only_bytes
    )
    oldest = ctx.oldest_manifest()
    return bool(plan.expired), None if oldest is None else time_expiry_ms(oldest[2], retention_ms)
