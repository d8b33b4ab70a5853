"""A tiered partition's status row (``rlm status``, ``GET /v1/partitions``): the original
fields (docs/cli.md) and the ones added since, each commented with the doc that defines it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlm.logdir.discovery import SegmentFiles
from rlm.tiering.local import PartitionContext
from rlm.tiering.read import PartitionOffsets
from rlm.tiering.store import object_keys

__all__ = ["eligible_end", "lag_age_ms", "partition_row", "pin_fields"]

Pending = Sequence[tuple[SegmentFiles, int, int]]


def partition_row(
    ctx: PartitionContext,
    offsets: PartitionOffsets,
    segments: Sequence[SegmentFiles],
    pending: Pending,
    waiting_error: str | None,
    *,
    conflict: bool,
    now_ms: int,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """The row; ``pending``: the manager's pending segments; ``extra``: the policy and cluster
    fields the manager resolves."""
    return {
        "topic": ctx.topic,
        "partition": ctx.partition,
        "log_start_offset": offsets.log_start_offset,
        "local_log_start_offset": offsets.local_log_start_offset,
        "high_watermark": offsets.high_watermark,
        "log_end_offset": offsets.log_end_offset,
        "highest_tiered_offset": offsets.highest_tiered_offset,
        "remote_log_start_offset": offsets.remote_log_start_offset,
        "remote_segments": 0 if conflict else len(ctx.manifests),
        "remote_bytes": 0 if conflict else ctx.remote_bytes,
        "copy_lag_segments": len(pending),
        "copy_lag_bytes": sum(p[0].size for p in pending),
        "quarantined": {base: q.message for base, q in ctx.quarantined.items()},
        # Beyond the original fields (docs/broker-files.md): each quarantine's file, byte, cause, since.
        "quarantine": [q.to_json() for _, q in sorted(ctx.quarantined.items())],
        "last_error": ctx.last_error or waiting_error,
        # Beyond the original fields (status page): offsets in [pending_start_offset,
        # eligible_end_offset) wait to be tiered (below the local start: pinned, docs/operations.md);
        # how long the oldest pending segment has waited; what the local tier holds.
        "eligible_end_offset": eligible_end(
            offsets.highest_tiered_offset, offsets.local_log_start_offset, pending
        ),
        "copy_lag_age_ms": lag_age_ms(pending, now_ms, _pinned_logs(ctx)),
        "pending_start_offset": pending[0][2] if pending else None,  # the first offset waiting to copy
        "local_segments": len(segments),
        "local_bytes": sum(s.size for s in segments),
        # docs/topic-policy.md: the policy in force and where each value came from.
        "tiered": True,
        "excluded_reason": None,
        # docs/visibility.md: readers serve [log_start_offset, visible_end_offset); the source
        # says whether that end is the checkpointed high watermark or an assumption.
        "visible_end_offset": offsets.visible_end_offset,
        "high_watermark_source": offsets.high_watermark_source,
        "delete_records_offset": offsets.delete_records_offset,
        # docs/topic-identity.md: the incarnation, why tiered data is not its own, its predecessors.
        "topic_id": ctx.part.topic_id,
        "identity_conflict": ctx.identity_conflict or ctx.part.identity_error,
        "old_incarnations": [o.to_json() for o in ctx.old_incarnations],
        **pin_fields(ctx),  # pinned_segments, pinned_bytes, pin_refused_offset
        # docs/store-requests.md: this process's store requests for the partition, by operation,
        # and the bytes they moved.
        "store_requests": ctx.shared.metrics.requests.row(ctx.topic, ctx.partition),
        # compaction, policy, kafka_configs (docs/topic-policy.md); role, leader, ... (docs/cluster.md)
        **extra,
    }


def pin_fields(ctx: PartitionContext) -> dict[str, Any]:
    """docs/operations.md "Pins and the broker's retention": the pending segments pinned on sight,
    the bytes they hold, and the oldest one tiering.max_pinned_bytes kept unpinned (None: none)."""
    pins = ctx.shared.pins.pins_of(ctx.state_dir)
    refusal = ctx.shared.pins.refusal_of(ctx.state_dir)
    return {
        "pinned_segments": len(pins),
        "pinned_bytes": sum(p.pinned_bytes for p in pins.values()),
        "pin_refused_offset": refusal[0] if refusal is not None else None,
    }


def _pinned_logs(ctx: PartitionContext) -> dict[int, Path]:
    return {base: pin.path / object_keys.LOG for base, pin in ctx.shared.pins.pins_of(ctx.state_dir).items()}


def eligible_end(highest_tiered: int, local_start: int | None, pending: Pending) -> int | None:
    """Exclusive end of the offsets eligible for tiering: the next base after the newest pending
    segment; with nothing pending, everything eligible is already remote (highest tiered + 1)."""
    if pending:
        return pending[-1][1]
    if highest_tiered >= 0:
        return highest_tiered + 1
    return local_start


def lag_age_ms(pending: Pending, now_ms: int, pinned: dict[int, Path] | None = None) -> int:
    """How long the oldest pending segment has waited (ms): now − its ``.log`` mtime (through its
    sight pin, ``pinned`` by base offset, once the broker deleted it); 0 when none."""
    if not pending:
        return 0
    first = pending[0][0]
    try:
        mtime_ms = int(first.log.stat().st_mtime * 1000)
    except OSError:
        held = (pinned or {}).get(first.base_offset)
        try:
            mtime_ms = int(held.stat().st_mtime * 1000) if held is not None else now_ms
        except OSError:
            return 0
    return max(0, now_ms - mtime_ms)
