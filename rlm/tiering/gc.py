"""Garbage collection of abandoned copy attempts (FORMATS §6).

An attempt's objects are garbage when no manifest names the attempt, no copy of it is in flight in
this process, and it is older than the grace period (``gc_grace_ms``; the age comes from the
creation time encoded in the attempt id, else the newest object's store timestamp). Recovery
already deletes the attempts its own journal knows; GC catches the rest (a journal lost with a
disk, another sidecar's crash, a retention delete interrupted before it was journaled).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from rlm.storage.api import ObjectInfo
from rlm.tiering import keys
from rlm.tiering.recovery import load_manifests
from rlm.tiering.state import PartitionContext


@dataclass(frozen=True, slots=True)
class Orphan:
    topic: str
    partition: int
    base_offset: int
    attempt_id: str
    keys: tuple[str, ...]
    bytes: int
    age_ms: int


def find_orphans(ctx: PartitionContext) -> list[Orphan]:
    """Abandoned attempts of the partition past the grace period (manifests re-listed first)."""
    backend, retry, now = ctx.shared.backend, ctx.shared.retry, ctx.shared.clock_ms()
    groups: dict[keys.AttemptRef, list[ObjectInfo]] = defaultdict(list)
    prefix = keys.data_prefix(ctx.topic, ctx.partition, ctx.key_id)
    for info in retry.call(lambda: list(backend.list(prefix))):
        ref = keys.parse_data_key(ctx.topic, ctx.partition, info.key, ctx.key_id)
        if ref is not None:
            groups[ref].append(info)
    # Manifests are listed *after* the data: an attempt that commits in between is then seen live.
    live = {(m.base_offset, m.attempt_id) for m in load_manifests(ctx)}
    orphans = []
    for ref, infos in sorted(groups.items(), key=lambda kv: (kv[0].base_offset, kv[0].attempt_id)):
        if (ref.base_offset, ref.attempt_id) in live or ref.attempt_id in ctx.in_flight:
            continue
        created = keys.attempt_created_ms(ref.attempt_id)
        if created is None:
            stamps = [i.last_modified for i in infos if i.last_modified is not None]
            created = int(max(stamps) * 1000) if stamps else now
        age = now - created
        if age < ctx.shared.settings.gc_grace_ms:
            continue
        orphans.append(Orphan(ctx.topic, ctx.partition, ref.base_offset, ref.attempt_id,
                              tuple(i.key for i in infos), sum(i.size for i in infos), age))
    return orphans


def collect_garbage(ctx: PartitionContext, *, dry_run: bool = False) -> list[Orphan]:
    """Delete (or with ``dry_run`` only list) the partition's orphans."""
    orphans = find_orphans(ctx)
    if dry_run:
        return orphans
    backend, retry = ctx.shared.backend, ctx.shared.retry
    for orphan in orphans:
        for key in orphan.keys:
            retry.call(lambda k=key: backend.delete(k))
        ctx.shared.metrics.orphans_deleted.labels(**ctx.labels).inc(len(orphan.keys))
    return orphans
