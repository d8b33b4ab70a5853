"""Idle passes: a partition whose inputs did not change since a clean pass is not passed again
(docs/operations.md, "What an idle pass costs").

A pass reads the partition directory (segments, ``leader-epoch-checkpoint``, ``partition.metadata``),
the log dir's checkpoints (high watermark, log start), the topic's policy, and the
clock (time-based retention). Its :class:`Fingerprint` is the stat signature of the directory and of
``partition.metadata`` — Kafka creates, deletes and renames files there for every roll, cleaner
swap, deletion and checkpoint rewrite, each of which changes the directory's mtime — the
partition's checkpoint values and its policy. A pass that found nothing to do records it with the
next time retention by time would delete something (:class:`IdleMark`); until one of those changes
or that time comes, a pass is a few ``stat`` calls and no store request.

The "racy" rule (:func:`rlm.fsutil.settled`): the directory's signature is taken before the pass
reads anything and is kept only when the directory had been unchanged for ``SETTLE_NS`` by then —
a change within the same timestamp tick could otherwise hide behind an equal signature.
Checkpoint values come from :class:`~rlm.logdir.checkpoint_cache.CheckpointCache`, which applies
the same rule to its files.

In cluster mode the leader and leader epoch are part of the fingerprint and a mark lasts at most
an hour. A leader's first mark asks for one more pass (``announce``), which writes the idle note
its followers idle on; a follower is marked only when that note covers its replica (roles.py,
docs/cluster.md "Idle partitions").

The mark is also kept in ``<state dir>/idle.json`` (with the progress it was made for), so a
restart that trusted the local state (rlm.tiering.resume) starts idle too: the first pass after a
restart costs what an idle pass costs. Every pass that is not idle deletes the file first, so it
only ever describes a partition that has been idle since its last full, clean pass.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlm.cluster.leadership import Leadership
from rlm.errors import RlmError
from rlm.fsutil import Signature, atomic_write, settled, stat_signature
from rlm.logdir.checkpoint_cache import CheckpointCache
from rlm.logdir.discovery import PARTITION_METADATA, PartitionDir, PartitionState
from rlm.tiering.expire import TopicPolicy
from rlm.tiering.local import PartitionContext, Progress
from rlm.tiering.store import Orphan

__all__ = [
    "IDLE_FILE",
    "IDLE_GC_MS",
    "Fingerprint",
    "IdleMark",
    "collect_unless_idle",
    "fingerprint",
    "fingerprint_of",
    "forget_mark",
    "load_mark",
    "policy_key",
    "set_mark",
    "still_idle",
    "trusted",
]

#: The persisted mark of an idle partition, in its state dir (a cache: written without fsync).
IDLE_FILE = "idle.json"
#: How long GC passes over a partition that stayed idle since a GC found nothing in it (ms). Garbage
#: appears only where a sidecar copies: here, while it stays idle, only an abandoned upload of a
#: sidecar that wrongly believed it led. A day bounds how long such objects stay.
IDLE_GC_MS = 86_400_000


#: id(policy) → (policy, its key): a sweep asks once per partition for the policy object of the
#: last discovery, and hashing a policy (an lru_cache) cost more than the rest of the fingerprint
_POLICY_KEYS: dict[int, tuple[TopicPolicy, str]] = {}
_MAX_POLICY_KEYS = 4096  # as many as the lru_cache it replaced: a discovery resolves one per topic


def policy_key(policy: TopicPolicy) -> str:
    """A stable text of everything in ``policy`` (compared across restarts)."""
    known = _POLICY_KEYS.get(id(policy))
    if known is not None and known[0] is policy:  # the policy held: its id is not reused
        return known[1]
    key = repr(policy)
    if len(_POLICY_KEYS) >= _MAX_POLICY_KEYS:
        _POLICY_KEYS.clear()  # a bound, not an LRU
    _POLICY_KEYS[id(policy)] = (policy, key)
    return key


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What a pass over one partition depends on, apart from the clock and its own progress."""

    directory: Signature
    metadata: Signature
    # high watermark, log start. Not the recovery point: no pass reads it, and the broker rewrites it
    # after a flush long after the records moved — a wake-up (a store listing in cluster mode) for nothing.
    state: tuple[int | None, int | None]
    policy: str  # policy_key()
    leader: tuple[int | None, int | None] = (None, None)  # leader node id, leader epoch (cluster mode)


def fingerprint(
    part: PartitionDir, state: PartitionState, policy: TopicPolicy, leads: Leadership | None = None
) -> Fingerprint:
    """The fingerprint of ``part`` now (two ``stat`` calls); ``leads``: this node's leadership of
    it in cluster mode (a new leader or epoch is not the pass that was marked)."""
    # os.path.join: str(part.path) is cached on the path, a pathlib join would parse it anew
    meta = stat_signature(os.path.join(part.path, PARTITION_METADATA))
    values = (state.high_watermark, state.log_start_offset)
    leader = (None, None) if leads is None else (leads.leader, leads.leader_epoch)
    return Fingerprint(stat_signature(part.path), meta, values, policy_key(policy), leader)


def fingerprint_of(
    part: PartitionDir, checkpoints: CheckpointCache, policy: TopicPolicy, leads: Leadership | None = None
) -> Fingerprint | None:
    """:func:`fingerprint` with the log dir's cached checkpoints; None when they cannot be read
    (the pass reports that)."""
    try:
        state = checkpoints.get(part.log_dir, hint=True).state_for(part.topic, part.partition)
    except RlmError:
        return None
    return fingerprint(part, state, policy, leads)


def still_idle(ctx: PartitionContext | None, fp: Fingerprint | None, now_ms: int) -> bool:
    """Whether a pass over ``ctx`` now would find what its last clean pass found: nothing to do."""
    mark = ctx.idle if ctx is not None else None
    return (
        fp is not None
        and ctx is not None
        and ctx.recovered
        and isinstance(mark, IdleMark)
        and mark.still_idle(fp, ctx.progress, now_ms)
    )


def load_mark(ctx: PartitionContext) -> None:
    """After a restart that trusted the local state: the persisted mark, if any."""
    ctx.idle = IdleMark.load(ctx.state_dir)
    ctx.idle_saved = ctx.idle is not None


def forget_mark(ctx: PartitionContext) -> IdleMark | None:
    """A full pass starts: it may change what a persisted mark describes. Returns the mark it
    dropped (a cluster leader compares it with the mark this pass makes: roles.py)."""
    prior, ctx.idle = ctx.idle, None
    if ctx.idle_saved is not False:
        IdleMark.forget(ctx.state_dir)
        ctx.idle_saved = False
    return prior if isinstance(prior, IdleMark) else None


def set_mark(
    ctx: PartitionContext,
    fp: Fingerprint,
    read_started_ns: int,
    due_ms: int | None,
    *,
    announce: bool = False,
    prior: IdleMark | None = None,
) -> None:
    """A full pass found nothing to do: mark ``ctx`` idle (and persist it) when ``fp`` is trusted.
    ``announce``: a cluster leader's first mark — one more pass is due, to write the idle note.
    ``prior``: the mark this pass dropped; when it describes the same, the partition has been idle
    all along (a pass an expired mark asked for, such as the hourly listing): its age and GC's
    finding carry over."""
    if trusted(fp, read_started_ns):
        mark = IdleMark.of(fp, ctx.progress, due_ms, announce, ctx.shared.clock_ms())
        if prior is not None and prior.describes(fp, ctx.progress):
            mark = dataclasses.replace(
                mark, made_ms=prior.made_ms, gc_clean_ms=prior.gc_clean_ms, gc_manifests=prior.gc_manifests
            )
        ctx.idle = mark
        ctx.idle.save(ctx.state_dir)
        ctx.idle_saved = True


def collect_unless_idle(
    ctx: PartitionContext, dry_run: bool, collect: Callable[[], list[Orphan]]
) -> list[Orphan]:
    """GC of ``ctx`` (``collect`` it, return what it deleted) unless it has stayed idle — its mark
    stands: no pass of this node did anything since — since a GC found nothing to collect in it,
    less than :data:`IDLE_GC_MS` ago, with the store view holding as many manifests as then (a
    sync that uncommitted one left its objects to GC). A GC that finds nothing (no orphan, no old
    incarnation) after the mark stood for the grace period (every attempt begun before the
    partition went idle was then old enough to judge) records it on the mark. A report
    (``dry_run``) looks everywhere."""
    mark, now = ctx.idle, ctx.shared.clock_ms()
    idle = not dry_run and isinstance(mark, IdleMark) and not mark.announce
    if (
        idle
        and mark.gc_clean_ms is not None
        and now - mark.gc_clean_ms < IDLE_GC_MS
        and len(ctx.store.manifests) == mark.gc_manifests
    ):
        return []
    deleted = collect()
    if (
        idle
        and not deleted
        and not ctx.old_incarnations
        and ctx.idle is mark
        and now - mark.made_ms >= ctx.shared.settings.gc_grace_ms
    ):
        ctx.idle = dataclasses.replace(mark, gc_clean_ms=now, gc_manifests=len(ctx.store.manifests))
    return deleted


def trusted(fp: Fingerprint, read_started_ns: int) -> bool:
    """Whether ``fp``, taken when a pass started at ``read_started_ns``, may stand for what the pass
    read: the directory exists and neither file changed within :data:`~rlm.fsutil.SETTLE_NS` before."""
    return fp.directory is not None and settled((fp.directory, fp.metadata), read_started_ns)


def _progress_key(progress: Progress) -> tuple[int, int, int]:
    return progress.highest_tiered_offset, progress.remote_log_start_offset, progress.delete_records_offset


@dataclass(frozen=True, slots=True)
class IdleMark:
    """A clean pass that found nothing to do: its fingerprint, the progress it left, and when (ms)
    retention by time deletes the oldest remote segment (None: never, by time). ``announce``: a
    cluster leader's mark whose idle note is not written yet — not idle, so the next sweep passes
    the partition once more (docs/cluster.md "Idle partitions")."""

    fingerprint: Fingerprint
    progress: tuple[int, int, int]
    due_ms: int | None
    announce: bool = False
    made_ms: int = 0  # when the pass marked it (ms since the Unix epoch; 0: not known)
    # When a GC found nothing to collect while it stood, and how many manifests the store view held
    # then (collect_unless_idle). Not persisted: a restart's recovery may uncommit manifests.
    gc_clean_ms: int | None = None
    gc_manifests: int = -1

    @classmethod
    def of(
        cls, fp: Fingerprint, progress: Progress, due_ms: int | None, announce: bool = False, made_ms: int = 0
    ) -> IdleMark:
        return cls(fp, _progress_key(progress), due_ms, announce, made_ms)

    def describes(self, fp: Fingerprint, progress: Progress) -> bool:
        """Whether this mark was made for ``fp`` and ``progress`` (its time and note aside)."""
        return fp == self.fingerprint and _progress_key(progress) == self.progress

    def still_idle(self, fp: Fingerprint, progress: Progress, now_ms: int) -> bool:
        return (
            not self.announce
            and self.describes(fp, progress)
            and (self.due_ms is None or now_ms < self.due_ms)
        )

    def save(self, state_dir: Path) -> None:
        fp = self.fingerprint
        doc = {
            "directory": fp.directory,
            "metadata": fp.metadata,
            "state": fp.state,
            "policy": fp.policy,
            "leader": fp.leader,
            "progress": self.progress,
            "due_ms": self.due_ms,
            "announce": self.announce,
            "made_ms": self.made_ms,
        }
        atomic_write(state_dir / IDLE_FILE, json.dumps(doc).encode(), durable=False)

    @classmethod
    def load(cls, state_dir: Path) -> IdleMark | None:
        """The persisted mark; None when absent or not whole (then the first pass is a full one)."""
        try:
            doc = json.loads((state_dir / IDLE_FILE).read_bytes())
            fp = Fingerprint(
                _sig(doc["directory"]),
                _sig(doc["metadata"]),
                _ints(doc["state"], 2, True),  # 3 values: written with the recovery point (a full pass)
                _text(doc["policy"]),
                _ints(doc.get("leader", [None, None]), 2, True),  # absent: written before cluster marks
            )
            progress = _ints(doc["progress"], 3, False)
            due = doc["due_ms"]
            if due is not None and (not isinstance(due, int) or isinstance(due, bool)):
                return None
            announce = doc.get("announce", False)  # absent: written before idle notes
            if not isinstance(announce, bool):
                return None
            (made,) = _ints([doc.get("made_ms", 0)], 1, False)
            key = (int(progress[0] or 0), int(progress[1] or 0), int(progress[2] or 0))
            return cls(fp, key, due, announce, int(made))
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            return None

    @staticmethod
    def forget(state_dir: Path) -> None:
        (state_dir / IDLE_FILE).unlink(missing_ok=True)


def _ints(value: Any, n: int, nullable: bool) -> tuple[Any, ...]:
    if (
        not isinstance(value, list)
        or len(value) != n
        or not all(
            (v is None and nullable) or (isinstance(v, int) and not isinstance(v, bool)) for v in value
        )
    ):
        raise ValueError(f"bad value {value!r}")
    return tuple(value)


def _sig(value: Any) -> Signature:
    if value is None:
        return None
    ino, size, mtime = _ints(value, 3, False)
    return int(ino), int(size), int(mtime)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"bad value {value!r}")
    return value
