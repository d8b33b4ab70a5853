"""This node's role for each partition in a replicated cluster, per pass (docs/cluster.md).

Kafka copies a partition to remote storage only on its leader; rlm does the same from outside the
broker. :class:`Roles` asks the configured leadership source (``[cluster] leadership``) once per
pass and again before every segment a leader copies, remembers the answer on the partition context
(status shows it), syncs followers — and leaders — from the store, and publishes what it found:

======================================  ==========================================================
``rlm_partition_leader``                the leader's node id (-1 unknown / none)
``rlm_partition_is_leader``             1 when this node leads the partition (copies, retention, GC)
``rlm_remote_store_highest_offset``     highest offset the store's chain serves, as last synced
``rlm_remote_sync_lag_offsets``         that minus the local index's highest offset (0 when in step)
``rlm_lineage_uncommitted_segments``    segments the leader uncommitted: diverged or overlapped
``rlm_leadership_lost_total``           passes that stopped copying because leadership moved
``rlm_idle_notes_written_total``        idle notes this leader wrote for its followers
======================================  ==========================================================
"""

from __future__ import annotations

import logging
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from rlm.cluster.leadership import Leadership, LeadershipSource
from rlm.tiering.converge import SyncResult, note_divergence, note_log_start, progress_after, sync_partition
from rlm.tiering.expire import TopicPolicy, retention_due, retention_limits
from rlm.tiering.idle import Fingerprint, IdleMark, set_mark
from rlm.tiering.local import PartitionContext, of_context
from rlm.tiering.store import IdleNote

__all__ = ["Roles"]

log = logging.getLogger(__name__)

_TP = ("topic", "partition")
_LEADS = Leadership(role="leader", leader=None, leader_epoch=None, source="always")
#: The longest an idle leader in cluster mode goes without listing its store (ms): the issue's
#: "a fallback listing at most once per partition per hour" (docs/cluster.md "Idle partitions").
RESYNC_MS = 3_600_000


class Roles:
    """Leadership per partition and the follower/leader sync of each pass."""

    def __init__(self, source: LeadershipSource, registry: CollectorRegistry) -> None:
        self.source = source
        self._refreshed: float | None = None
        r = registry
        self.leader = Gauge(
            "rlm_partition_leader", "Node id of the partition's leader (-1: unknown)", _TP, registry=r
        )
        self.is_leader = Gauge(
            "rlm_partition_is_leader",
            "1 when this node leads the partition: it copies, applies retention and collects garbage",
            _TP,
            registry=r,
        )
        self.store_highest = Gauge(
            "rlm_remote_store_highest_offset",
            "Highest offset served from the store (its chain of manifests), as last synced",
            _TP,
            registry=r,
        )
        self.sync_lag = Gauge(
            "rlm_remote_sync_lag_offsets",
            "Store highest offset minus the local remote index's highest offset",
            _TP,
            registry=r,
        )
        self.uncommitted = Counter(
            "rlm_lineage_uncommitted_segments",
            "Remote segments the leader "
            "uncommitted because they diverged from its lineage or were "
            "overlapped by another sidecar's",
            (*_TP, "reason"),
            registry=r,
        )
        self.notes = Counter(
            "rlm_idle_notes_written",
            "Idle notes this leader wrote for its followers (docs/cluster.md)",
            _TP,
            registry=r,
        )
        self.lost = Counter(
            "rlm_leadership_lost",
            "Passes that stopped copying because leadership moved away",
            _TP,
            registry=r,
        )

    @property
    def cluster(self) -> bool:
        """True unless every partition is led here (``leadership = "always"``)."""
        return self.source.name != "always"

    def refresh(self, *, max_age_s: float = 0.0) -> None:
        """Re-read the source; skipped when it was read less than ``max_age_s`` ago (the per-pass
        call: a daemon runs thousands of passes per interval, leadership changes far less often)."""
        now = time.monotonic()
        if self._refreshed is not None and now - self._refreshed < max_age_s:
            return
        self._refreshed = now
        self.source.refresh()

    def of(self, ctx: PartitionContext) -> Leadership:
        """This node's role for ``ctx`` now (remembered on the context for status)."""
        found = self.source.leadership(ctx.topic, ctx.partition) if self.cluster else _LEADS
        if found == ctx.leadership:  # the gauges hold it already (a context's series are never removed)
            return found
        ctx.leadership = found
        ctx.series(self.leader).set(-1 if found.leader is None else found.leader)
        ctx.series(self.is_leader).set(1 if found.role == "leader" else 0)
        return found

    def idle_leadership(self, ctx: PartitionContext | None) -> Leadership | None:
        """What an idle mark of ``ctx`` depends on from leadership (idle.py); None when its pass
        may not be skipped: a partition not passed yet, an unknown role, a follower of no known
        leader. A leader's store changes only by its own hand while its leader epoch stands; a
        follower idles on its leader's idle note (docs/cluster.md "Idle partitions")."""
        if not self.cluster:
            return _LEADS
        if ctx is None:
            return None
        self.refresh(max_age_s=1.0)
        found = self.of(ctx)
        known_leader = found.role == "follower" and found.leader is not None
        return found if found.role == "leader" or known_leader else None

    def mark_leader_idle(
        self,
        ctx: PartitionContext,
        fp: Fingerprint,
        prior: IdleMark | None,
        started_ns: int,
        due_ms: int | None,
    ) -> None:
        """A leader's pass found nothing to do: mark it idle (idle.py). In cluster mode, when other
        replicas follow, the first such mark asks for one more pass; that pass — the partition idle a
        whole interval, so not one pass between two rolls of a busy log — writes the idle note its
        followers idle on (docs/cluster.md "Idle partitions")."""
        now_ms = ctx.shared.clock_ms()
        lead = ctx.leadership if isinstance(ctx.leadership, Leadership) else None
        announce = False
        if self.cluster and lead is not None and lead.leader is not None and not lead.sole:
            if prior is not None and prior.describes(fp, ctx.progress):
                self._write_note(ctx, fp, lead.leader, lead.leader_epoch, now_ms)
            else:
                announce = True
        set_mark(ctx, fp, started_ns, self.idle_due(due_ms, now_ms), announce=announce, prior=prior)

    def _write_note(
        self, ctx: PartitionContext, fp: Fingerprint, leader: int, epoch: int | None, now_ms: int
    ) -> None:
        hw, log_start = fp.state[0], fp.state[1]
        if hw is None:
            return
        note = IdleNote(epoch, leader, ctx.store.chain.highest, hw, log_start or 0, now_ms)
        known = ctx.store.idle_note
        if note.says_same(known[1] if known is not None else None):
            return
        of_context(ctx).write_idle_note(note)
        ctx.store.idle_note = ((-1, None, None), note)  # the next listing reads it once for its stamp
        ctx.series(self.notes).inc()

    def mark_follower_idle(
        self, ctx: PartitionContext, fp: Fingerprint, started_ns: int, policy: TopicPolicy
    ) -> None:
        """A follower's pass: mark it idle when the idle note its listing found covers what its own
        replica holds (:meth:`IdleNote.covers`) and the leader's retention has nothing to delete
        now (by ``policy``, the topic's, as the leader applies it)."""
        known, lead = ctx.store.idle_note, ctx.leadership
        note = known[1] if known is not None else None
        if note is None or not isinstance(lead, Leadership):
            return
        if not note.covers(lead.leader, lead.leader_epoch, ctx.store.chain.highest, fp.state):
            return
        due_now, due_ms = retention_due(ctx, **retention_limits(policy, ctx))
        if not due_now:
            set_mark(ctx, fp, started_ns, self.idle_due(due_ms, ctx.shared.clock_ms()))

    def idle_due(self, due_ms: int | None, now_ms: int) -> int | None:
        """When an idle mark made now ends: ``due_ms`` (retention by time), and in cluster mode
        no later than :data:`RESYNC_MS` from now — a leader lists its store again at least that
        often, to learn what an earlier leader's last upload committed after the hand-over."""
        if not self.cluster:
            return due_ms
        return min(due_ms, now_ms + RESYNC_MS) if due_ms is not None else now_ms + RESYNC_MS

    def still_leads(self, ctx: PartitionContext) -> bool:
        """Re-check before copying another segment: a node that lost leadership stops."""
        if not self.cluster:
            return True
        before = ctx.leadership
        self.source.refresh()
        now = self.of(ctx)
        if now.role == "leader":
            return True
        ctx.series(self.lost).inc()
        log.info(
            "%s: no longer the leader (now %s, leader epoch %s; was epoch %s): stopping copies",
            ctx.part.name,
            now.leader if now.leader is not None else "unknown",
            now.leader_epoch,
            getattr(before, "leader_epoch", None),
        )
        return False

    def sync(self, ctx: PartitionContext, *, leader: bool) -> SyncResult:
        """The per-pass sync with the store (recovery already did it on a pass that recovered)."""
        result = sync_partition(ctx, leader=leader)
        self.note(ctx, result)
        highest, start = progress_after(result.chain, ctx.progress)
        changed = note_divergence(ctx, result.local_diverged_from) | note_log_start(ctx)
        if (highest, start) != (ctx.progress.highest_tiered_offset, ctx.progress.remote_log_start_offset):
            ctx.progress.highest_tiered_offset, ctx.progress.remote_log_start_offset = highest, start
            changed = True
        if changed:
            ctx.save_progress()
        return result

    def note(self, ctx: PartitionContext, result: SyncResult) -> None:
        """Publish what a sync found."""
        lb = ctx.labels
        ctx.series(self.store_highest).set(result.chain.highest)
        ctx.series(self.sync_lag).set(max(0, result.chain.highest - ctx.family.last_offset))
        diverged = {m.base_offset for m, _cut in result.chain.diverged}
        for base in result.uncommitted:
            reason = "diverged" if base in diverged else "overlapped"
            self.uncommitted.labels(**lb, reason=reason).inc()
        if result.rebuilt_from is not None:
            log.info(
                "%s: local remote index rewound to offset %d to match the store",
                ctx.part.name,
                result.rebuilt_from,
            )

    def status(self, ctx: PartitionContext) -> dict[str, Any]:
        """Status fields of ``ctx`` (docs/cluster.md); no store I/O."""
        lead = ctx.leadership if isinstance(ctx.leadership, Leadership) else None
        chain = ctx.store.chain
        local = ctx.family.last_offset
        diverged_from = chain.first_diverged
        return {
            "role": lead.role if lead is not None else ("leader" if not self.cluster else "unknown"),
            "leader": lead.leader if lead is not None else None,
            "leader_epoch": lead.leader_epoch if lead is not None else None,
            "leadership_source": self.source.name,
            # why the role is what it is when it is not plain (no leader, source unreadable, ...)
            "leadership_detail": lead.detail if lead is not None else None,
            "store_highest_offset": chain.highest,
            "local_index_highest_offset": local,
            "sync_lag_offsets": max(0, chain.highest - local),
            "diverged_from_offset": diverged_from,
            # where this replica's own log left the lineage (readers stop there), null: it did not
            "local_diverged_from_offset": (
                ctx.progress.local_diverged_from if ctx.progress.local_diverged_from >= 0 else None
            ),
            "lineage_markers": sorted(m.epoch for _s, m in ctx.store.markers.values()),
        }
