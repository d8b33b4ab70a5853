"""The remote log manager: every partition of the configured log dirs, one pass at a time.

A *pass* over a partition = recover (once) → copy eligible segments oldest first → retention.
Passes of one partition never overlap (a per-partition lock, also taken by GC and rebuild-index;
a pass that finds it held waits for it, up to :data:`PASS_LOCK_WAIT_S`), different partitions
run in parallel, and uploads share one token bucket and one concurrency cap. The daemon
schedules passes; ``rlm run --once`` runs one pass over everything.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from rlm.cluster import leadership_source
from rlm.cluster.kafka_admin import close_quietly
from rlm.cluster.log_starts import high_watermarks_of
from rlm.config import Settings
from rlm.errors import RlmError, UploadAbandoned
from rlm.logdir.checkpoint_cache import CheckpointCache
from rlm.logdir.discovery import (
    PartitionDir,
    PartitionState,
    SegmentFiles,
    discover_partitions,
    list_segments,
    partition_dir,
    partition_state,
)
from rlm.storage.api import StorageBackend
from rlm.storage.health import HealthTrackingBackend, StoreHealth
from rlm.storage.metering import MeteringBackend
from rlm.storage.retry import under_retries
from rlm.tiering.converge import (
    OldIncarnation,
    RewrittenRange,
    find_rewrites,
    identity,
    observe,
    rebuild_local_index,
)
from rlm.tiering.copy import (
    CopyWatchdog,
    PendingSegment,
    copy_pending,
    hold,
    hold_unloaded,
    pending_segments,
    publish_lag,
    reexamine_quarantine,
)
from rlm.tiering.expire import (
    DeletedTopics,
    GcSchedule,
    TopicPolicy,
    TopicPolicyResolver,
    by_deadline,
    collect_partition,
    forget_deadline,
    note_deadline,
    retention_limits,
    retention_pass,
)
from rlm.tiering.idle import Fingerprint, collect_unless_idle, fingerprint_of, forget_mark, still_idle
from rlm.tiering.local import (
    Journal,
    PartitionContext,
    PinLedger,
    Progress,
    RemoteIndexFamily,
    SharedResources,
    TieringMetrics,
    TokenBucket,
    note_gaps,
    state_dir,
    state_root_of,
)
from rlm.tiering.pass_result import PassResult
from rlm.tiering.policy_report import PolicyMetrics
from rlm.tiering.read import note_delete_records
from rlm.tiering.resume import load_state
from rlm.tiering.roles import Roles
from rlm.tiering.status_rows import excluded_status, tiered_row
from rlm.tiering.store import Orphan, StoreProtection

__all__ = ["PASS_LOCK_WAIT_S", "PassResult", "RemoteLogManager"]

log = logging.getLogger(__name__)

#: How long a pass waits for its partition's lock (s). Besides a pass, only maintenance takes it —
#: GC, rebuild-index, a status observation — and each holds it for a bounded time. A pass that
#: gave up at once could be skipped forever: GC runs on its own interval, and when that equals the
#: task interval (gc_grace_ms = 0) the two schedules can stay in phase, every pass of one partition
#: landing while GC holds it (the store-outage test saw a partition never pass again after a thaw).
PASS_LOCK_WAIT_S = 10.0


class RemoteLogManager:
    """Owns the shared resources and one :class:`PartitionContext` per discovered partition."""

    def __init__(
        self,
        settings: Settings,
        backend: StorageBackend,
        *,
        metrics: TieringMetrics | None = None,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self.settings = settings
        t = settings.tiering
        metrics = metrics or TieringMetrics()
        # One health tracker for every store call of the process, readers too (docs/operations.md).
        self.health = StoreHealth(
            unreachable_after_ms=settings.remote.unreachable_after_ms,
            probe_interval_ms=settings.remote.probe_interval_ms,
            registry=metrics.registry,
        )
        # Metered below the retries (each attempt is a billed request; docs/store-requests.md),
        # health tracked above them (a store is unreachable when retried calls keep failing).
        metered = under_retries(backend, lambda inner: MeteringBackend(inner, metrics.requests))
        self.store = HealthTrackingBackend(metered, self.health)
        self.shared = SharedResources(
            backend=self.store,
            settings=t,
            metrics=metrics,
            bucket=TokenBucket(t.upload_bytes_per_sec),
            upload_slots=threading.BoundedSemaphore(t.max_concurrent_uploads),
            stop=threading.Event(),
            clock_ms=clock_ms or (lambda: int(time.time() * 1000)),
            index_interval_bytes=settings.log.index_interval_bytes,
            protection=StoreProtection.from_settings(settings.remote),  # docs/protection.md
            high_watermarks=high_watermarks_of(settings.cluster),  # docs/operations.md
        )
        self.shared.pins = PinLedger(  # pins on sight and their bound (docs/operations.md)
            t.max_pinned_bytes,
            settings.log.dirs,
            lambda d: state_root_of(t, d),
            metrics,
            self.shared.clock_ms,
        )
        self.watchdog = CopyWatchdog(self.shared.metrics)
        self._contexts: dict[tuple[str, int, str | None, bool], PartitionContext] = {}
        self._locks: dict[tuple[str, int], threading.Lock] = {}
        self._registry_lock = threading.Lock()
        self.checkpoints = CheckpointCache()
        self.policies = TopicPolicyResolver(settings)
        self.policy_metrics = PolicyMetrics(self.shared.metrics.registry)
        # One KRaft reader: leadership reads the image the policy resolver polls (docs/cluster.md).
        shared = self.policies.follow and self.policies.metadata_dir is not None
        source = leadership_source(
            settings,
            image=(lambda: self.policies.image) if shared else None,
            refresh_image=self.policies.refresh if shared else None,
        )
        self.roles = Roles(source, self.shared.metrics.registry)
        self.shared.cluster, self.shared.node_id = self.roles.cluster, self.roles.source.node_id
        self._policy: dict[tuple[str, int], TopicPolicy] = {}
        sh, image = self.shared, self.policies.refreshed_image  # deleted topics' data, kept for their grace
        self.deleted = DeletedTopics(settings, self.store, image, sh.clock_ms, sh.protection, sh.metrics)
        self.gc_schedule = GcSchedule.of(settings)  # docs/operations.md "GC"

    # -- partitions ---------------------------------------------------------------------------

    def classify(self) -> tuple[list[PartitionDir], list[tuple[PartitionDir, TopicPolicy]]]:
        """Every live partition dir, split by the topic policy (docs/topic-policy.md) into the ones
        rlm tiers and the ones it leaves alone (with why), after reading what is new in the KRaft
        metadata log; publishes the policy metrics."""
        self.policies.refresh()
        if self.roles.cluster:
            self.roles.refresh()  # who leads what: re-read with the pass (docs/cluster.md)
        tiered, excluded, policies = self.policies.classify(discover_partitions(self.settings.log.dirs))
        with self._registry_lock:
            self._policy = policies
        self.policy_metrics.publish(policies)
        return tiered, excluded

    def discover(self) -> list[PartitionDir]:
        """The partitions rlm tiers (never Kafka's internal logs unless named; :meth:`classify`)."""
        return self.classify()[0]

    def policy_for(self, part: PartitionDir) -> TopicPolicy:
        """The policy of the last :meth:`classify` (resolved now for a partition it did not see)."""
        with self._registry_lock:
            pol = self._policy.get((part.topic, part.partition))
        return pol if pol is not None else self.policies.policy(part.topic)

    def context(self, part: PartitionDir) -> PartitionContext:  # one per incarnation (topic id)
        key = _key(part)
        with self._registry_lock:
            ctx = self._contexts.get(key)
            if ctx is None:
                home = state_dir(self.settings.tiering, part)
                t = self.settings.tiering
                family = RemoteIndexFamily(
                    part.path,
                    home / "index-sets.json",
                    rotate_bytes=t.index_rotate_bytes,
                    rotate_ms=t.index_rotate_ms,
                    clock_ms=self.shared.clock_ms,
                )
                journal = Journal(home / "journal.jsonl")
                ctx = PartitionContext(part, home, self.shared, family, journal)
                self._contexts[key] = ctx
                # One lock per name: passes of two incarnations of a partition never overlap.
                self._locks.setdefault(key[:2], threading.Lock())
            return ctx

    def contexts(self) -> Iterator[PartitionContext]:
        for part in self.discover():
            yield self.context(part)

    def pass_lock(self, ctx: PartitionContext) -> threading.Lock:
        """The lock every pass and maintenance step of ``ctx``'s partition holds (module doc)."""
        return self._locks[(ctx.topic, ctx.partition)]

    def pass_locks_held(self) -> dict[str, bool]:
        """``<topic>-<partition>`` → whether its pass lock is held now (diagnostics only)."""
        with self._registry_lock:
            return {f"{t}-{p}": lock.locked() for (t, p), lock in self._locks.items()}

    def stop(self) -> None:
        """Ask in-flight uploads to abandon at the next chunk (shutdown)."""
        self.shared.stop.set()
        close_quietly(self.shared.high_watermarks)

    # -- one pass -----------------------------------------------------------------------------

    def idle_check(self, part: PartitionDir) -> tuple[bool, Fingerprint | None]:
        """Whether a pass over ``part`` now finds nothing to do (idle.py; counted), and its fingerprint."""
        leads = self.roles.idle_leadership(known := self._contexts.get(_key(part)))  # None: a follower
        fp = None if leads is None else fingerprint_of(part, self.checkpoints, self.policy_for(part), leads)
        if idle := still_idle(known, fp, self.shared.clock_ms()):
            self.shared.metrics.idle_passes.inc()
        return idle, fp

    def run_partition(self, part: PartitionDir, *, retention: bool = True) -> PassResult:
        started_ns = time.time_ns()  # before anything is read: the fingerprint's settle point
        idle, fp = self.idle_check(part)
        if idle:
            return PassResult(part.topic, part.partition, idle=True)
        # The directory may have been re-created (new topic id) since it was discovered.
        part = partition_dir(part.log_dir, part.topic, part.partition, part.path)
        ctx = self.context(part)
        result = PassResult(part.topic, part.partition)
        lock = self._locks[(part.topic, part.partition)]
        if not lock.acquire(timeout=PASS_LOCK_WAIT_S):
            log.warning("%s: pass skipped: the partition stayed busy for %.0f s", part.name, PASS_LOCK_WAIT_S)
            result.skipped = True
            return result
        started = time.monotonic()
        try:
            identity.before_pass(ctx)
            self._pass(ctx, result, fp, started_ns, retention=retention)
            ctx.last_error = ctx.identity_conflict = None
        except UploadAbandoned:
            result.error = "abandoned: shutting down"
            ctx.recovered = False
        except RlmError as err:
            result.error = ctx.last_error = str(err)
            ctx.recovered = False  # converge again before the next pass
            log.error("%s: %s", part.name, err)
        except Exception as err:  # a bug or an error no layer translated: still converge next pass
            # Left recovered, the next pass would skip recovery: the open journal attempt and its
            # pins would never be resolved and the same failure could repeat on every pass.
            ctx.recovered = False
            if isinstance(err, FileNotFoundError) and not part.path.is_dir():
                # Kafka renamed it away (topic deleted, replica moved) mid-pass: an event, not a bug
                result.error = ctx.last_error = f"the partition directory {part.path} is gone"
                log.warning("%s: pass stopped: %s (topic deleted or replica moved)", part.name, result.error)
            else:
                result.error = ctx.last_error = f"unexpected {type(err).__name__}: {err}"
                log.exception("%s: pass failed unexpectedly", part.name)
        finally:
            ctx.series(self.shared.metrics.task_seconds).observe(time.monotonic() - started)
            ctx.publish_gauges()
            lock.release()
        return result

    def _pass(
        self,
        ctx: PartitionContext,
        result: PassResult,
        fp: Fingerprint | None,
        started_ns: int,
        *,
        retention: bool,
    ) -> None:
        """The work of one pass: load the state (first pass), copy, compaction metric, retention;
        mark the partition idle when it found nothing to do (idle.py)."""
        if self.roles.cluster:
            self.roles.refresh(max_age_s=1.0)
        leader = self.roles.of(ctx).role == "leader"
        loaded = not ctx.recovered
        if loaded:
            try:
                load_state(ctx, leader=leader, roles=self.roles)
            except RlmError:
                if leader:  # the store is down: what rolled is held all the same
                    hold_unloaded(ctx, lambda segs, saved: self._unloaded_pending(ctx, segs, saved))
                raise
            if still_idle(ctx, fp, self.shared.clock_ms()):  # idle before the restart and since
                result.idle = True
                return
        prior = forget_mark(ctx)
        if self.roles.cluster and not loaded:  # other sidecars may have changed the store (docs/cluster.md)
            self.roles.sync(ctx, leader=leader)
        segments = list_segments(ctx.part)  # one listing per pass
        note_delete_records(ctx, self.state_of(ctx), segments)
        compacted = self.policy_for(ctx.part).compacted
        note_gaps(ctx, segments, compacted=compacted, leader=leader)  # before copying past one
        pending = self._copy_eligible(ctx, result, segments, leader=leader)
        self.compaction(ctx, segments)
        if leader and retention and not self.shared.stop.is_set():
            # The topic's own limits (docs/topic-policy.md)
            plan, due_ms = retention_pass(ctx, **retention_limits(self.policy_for(ctx.part), ctx))
            result.deleted = [m.base_offset for m in plan.expired]
            if fp is not None and not (
                pending or result.copied or result.deleted or ctx.quarantined or result.error
            ):
                self.roles.mark_leader_idle(ctx, fp, prior, started_ns, due_ms)
        elif fp is not None and not (leader or ctx.quarantined or result.error):
            self.roles.mark_follower_idle(ctx, fp, started_ns, self.policy_for(ctx.part))
        if result.copied or result.deleted:  # a hole the copy left; a gap retention passed
            note_gaps(ctx, segments, compacted=compacted, leader=leader)

    def pending(
        self, ctx: PartitionContext, segments: list[SegmentFiles], progress: Progress | None = None
    ) -> list[PendingSegment]:
        """Eligible segments not yet tiered (:func:`~rlm.tiering.copy.copy_pass.pending_segments`)."""
        return pending_segments(
            ctx,
            segments,
            self.state_of(ctx),
            self.settings.log.eligibility,
            compacted=self.policy_for(ctx.part).compacted,
            progress=progress,
        )

    def _unloaded_pending(
        self, ctx: PartitionContext, segments: list[SegmentFiles], saved: Progress
    ) -> list[PendingSegment]:
        """What is pending by the persisted progress, in a pass whose state did not load: its
        deadline still published and warned of (docs/topic-policy.md §8) — the store being down
        is when the margin shrinks."""
        pending = self.pending(ctx, segments, saved)
        note_deadline(ctx, segments, pending, self.policy_for(ctx.part), self.state_of(ctx))
        return pending

    def state_of(self, ctx: PartitionContext) -> PartitionState:
        return partition_state(ctx.part, self.checkpoints.get(ctx.part.log_dir))

    def copy_order(self, parts: list[PartitionDir]) -> list[PartitionDir]:
        """``parts`` in the order their passes should run: nearest the broker's deadline of their
        oldest untiered segment first, as last estimated (docs/topic-policy.md §8)."""
        with self._registry_lock:
            deadlines = [(k[:2], c.deadline) for k, c in self._contexts.items() if c.deadline is not None]
        known = {tp: d.deadline_ms for tp, d in deadlines if d.deadline_ms is not None}
        if not known:  # nothing waits (the usual sweep): discovery order, no sort
            return parts
        return by_deadline(parts, lambda p: known.get((p.topic, p.partition)))

    def _copy_eligible(
        self, ctx: PartitionContext, result: PassResult, segments: list[SegmentFiles], *, leader: bool
    ) -> int:
        """Pin on sight and copy what is eligible of ``segments``; return how many were pending at
        the start. A follower only drops the pins of what the leader tiered and publishes its lag."""
        if not leader:
            forget_deadline(ctx)  # the leader's to watch (docs/topic-policy.md §8)
            waiting = self.pending(ctx, segments)
            hold(ctx, waiting, pin_new=False)
            return publish_lag(ctx, waiting)
        reexamine_quarantine(ctx, segments)
        identity.check_log_end(ctx, segments)
        pending = self.pending(ctx, segments)
        hold(ctx, pending, pin_new=True)  # before any store request: held even if the copy fails
        publish_lag(ctx, pending)
        try:
            copy_pending(ctx, result, pending, still_leads=self.roles.still_leads, watchdog=self.watchdog)
        finally:  # also after a failed copy (the store down): when the margin shrinks
            note_deadline(ctx, segments, pending, self.policy_for(ctx.part), self.state_of(ctx))
        hold(ctx, pending, pin_new=True)  # what is still pending takes the room the copies freed
        return len(pending)

    def run_once(
        self, *, on_result: Callable[[PassResult], None] | None = None, gc: bool = True
    ) -> list[PassResult]:
        """One full pass: every partition (copy + retention), then GC. Sequential per partition;
        uploads inside are bounded by the shared cap."""
        results = []
        for part in self.copy_order(self.discover()):
            if self.shared.stop.is_set():
                break
            results.append(res := self.run_partition(part))
            if on_result is not None:
                on_result(res)
        if gc and not self.shared.stop.is_set():
            self.collect_garbage()
        return results

    # -- maintenance --------------------------------------------------------------------------

    def collect_garbage(
        self,
        *,
        dry_run: bool = False,
        on_partition: Callable[[str], None] | None = None,
        old: list[OldIncarnation] | None = None,
        deleted: list[OldIncarnation] | None = None,
        save_stamps: bool = False,
    ) -> list[Orphan]:
        """Orphans, old incarnations (into ``old``) and deleted topics (into ``deleted``) past their
        grace (docs/topic-identity.md); ``save_stamps``: this process owns the state dirs (gc.py)."""
        orphans: list[Orphan] = []
        tiered, excluded = self.classify()  # one listing of the log dirs per GC, deleted topics too
        live = {(p.topic, p.partition) for p in [*tiered, *(part for part, _ in excluded)]}
        contexts = [self.context(part) for part in tiered]
        # Pins of partitions no longer tiered: local files, dropped even while the store is down.
        self.shared.pins.release_stale({ctx.state_dir for ctx in contexts}, dry_run=dry_run)
        for ctx in contexts:
            if on_partition is not None:
                on_partition(ctx.part.name)
            # No recover() here: `rlm gc` may run beside a daemon that owns the partition, and
            # recovery aborts (deletes) every open attempt regardless of the grace period. Only the
            # leader collects garbage (docs/cluster.md), and not again in an idle partition (idle.py).
            with self.pass_lock(ctx):
                if ctx.part.identity_error is None and self.roles.of(ctx).role == "leader":
                    work = partial(collect_partition, ctx, dry_run=dry_run, old=old, save_stamps=save_stamps)
                    orphans += collect_unless_idle(ctx, dry_run, work)
        (deleted if deleted is not None else []).extend(self.deleted.collect(dry_run=dry_run, live=live))
        self.gc_schedule.record(self.shared.clock_ms(), dry_run=dry_run)  # when the next is due
        return orphans

    def rebuild_index(self, *, on_partition: Callable[[str], None] | None = None) -> dict[str, int]:
        """Rebuild every local remote-index family from the remote manifests alone."""
        rebuilt: dict[str, int] = {}
        for ctx in self.contexts():
            if on_partition is not None:
                on_partition(ctx.part.name)
            with self.pass_lock(ctx):
                rebuilt[ctx.part.name] = rebuild_local_index(ctx, leader=self.roles.of(ctx).role == "leader")
        return rebuilt

    # -- status -------------------------------------------------------------------------------

    def store_status(self) -> dict[str, Any]:
        """``GET /v1/store``: the backend's name and its health (no store I/O; docs/operations.md)."""
        return {"backend": self.settings.remote.backend, **self.health.snapshot()}

    def live_progress(self, part: PartitionDir) -> Progress:
        """The in-memory progress once recovered, else the persisted one; as readers may use it."""
        ctx = self.context(part)
        return identity.served_progress(
            part, ctx.progress if ctx.recovered else Progress.load(ctx.progress_path)
        )

    def status(self, *, observe: bool = True) -> list[dict[str, Any]]:
        """The ``rlm status`` fields (docs/cli.md) per partition (plus last_error / quarantined).

        ``observe=False`` (the daemon's API) never touches the store and never waits for a pass:
        a partition not yet recovered answers from its persisted progress and what was last
        known. ``observe=True`` (``rlm status``, a process of its own) loads the remote manifests
        of such partitions first, skipping one a pass of this process holds.
        """
        rows = []
        tiered, excluded = self.classify()
        for ctx in (self.context(part) for part in tiered):
            self.roles.of(ctx)
            if not ctx.recovered and observe:
                self._try_observe(ctx)
            # Unobserved and unrecovered: the persisted progress, without touching ctx (a pass
            # may be recovering it right now).
            live = ctx.progress if ctx.recovered or observe else Progress.load(ctx.progress_path)
            rows.append(tiered_row(self, ctx, live))
        rows.extend(excluded_status(self, part, pol) for part, pol in excluded)
        return rows

    def _try_observe(self, ctx: PartitionContext) -> None:
        lock = self.pass_lock(ctx)
        if not lock.acquire(blocking=False):
            return
        try:
            observe(ctx)
        except RlmError as err:
            ctx.last_error = str(err)
        finally:
            lock.release()

    def compaction(self, ctx: PartitionContext, segments: list[SegmentFiles]) -> list[RewrittenRange]:
        """Rewrites by the cleaner after tiering (compacted topics; docs/topic-policy.md), as a metric."""
        found = find_rewrites(segments, ctx.manifests) if self.policy_for(ctx.part).compacted else []
        ctx.series(self.policy_metrics.compacted).set(len(found))
        return found


def _key(part: PartitionDir) -> tuple[str, int, str | None, bool]:
    return part.topic, part.partition, part.topic_id, part.identity_error is not None
