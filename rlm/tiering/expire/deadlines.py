"""When the broker deletes each local segment: the model (docs/topic-policy.md §8).

Pure: it takes what a listing and the checkpoints tell (each segment's base offset, size and
largest timestamp; the log start; whether the active segment is committed) and the local
retention in force (rlm.tiering.expire.retention_sources: the broker's ``retention.*``), and answers per
segment the earliest moment Kafka's retention may delete it. Kafka's rules
(``UnifiedLog.deleteOldSegments``; the same three predicates in Kafka 4.1.1's Java ``UnifiedLog``):

* every ``log.retention.check.interval.ms`` the broker runs, per log, the log-start, size and
  time predicates in that order, each from the oldest segment and **stopping at the first segment
  it keeps** — a segment is never deleted before every older one is;
* log start: a segment whose next segment starts at or below the log start offset;
* size (``retention.bytes`` ≥ 0): with ``diff`` = log size − ``retention.bytes``, the oldest
  segments while ``diff − segment size ≥ 0`` (``diff`` shrinks by each one deleted);
* time (``retention.ms`` ≥ 0): a segment whose largest timestamp is older than now −
  ``retention.ms`` (strictly: ``now − largestTimestamp > retention.ms``);
* only offsets below the high watermark; a non-empty active segment is deleted too (the broker
  rolls a new one first), an empty one never.

Times are epoch milliseconds, sizes bytes. The real deletion happens at the first retention check
at or after a deadline, so up to one check interval later: the deadline is the earliest moment,
the conservative one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

__all__ = [
    "Deadline",
    "LocalRetention",
    "LocalSegment",
    "broker_deadlines",
    "by_deadline",
    "margin_ms",
]

Cause = Literal["log start", "size", "time"]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LocalSegment:
    """One local segment as the broker's retention sees it: ``next_base`` is the next segment's
    base offset (None for the active segment), ``largest_timestamp`` epoch ms (None: unknown, so
    time retention cannot be judged and the segment gets no time deadline)."""

    base_offset: int
    size: int
    largest_timestamp: int | None
    next_base: int | None


@dataclass(frozen=True, slots=True)
class LocalRetention:
    """The broker's local retention of one partition: ``retention_ms`` / ``retention_bytes``
    (-1 = unlimited), the log start offset, and whether everything up to the log end is committed
    (the high watermark at the log end: only then may the active segment go)."""

    retention_ms: int
    retention_bytes: int
    log_start_offset: int = 0
    active_committed: bool = True


@dataclass(frozen=True, slots=True)
class Deadline:
    """One segment's fate: ``deadline_ms`` the earliest moment the broker may delete it (epoch ms;
    at or before now = at its next retention check; None = no rule will delete it as things
    stand), ``cause`` the rule that sets it, ``headroom_bytes`` how many bytes producers may still
    append to the partition before size retention deletes it (≤ 0: due now; None: no size limit)."""

    base_offset: int
    deadline_ms: int | None
    cause: Cause | None
    headroom_bytes: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "base_offset": self.base_offset,
            "deadline_ms": self.deadline_ms,
            "cause": self.cause,
            "headroom_bytes": self.headroom_bytes,
        }


def broker_deadlines(
    segments: Sequence[LocalSegment], retention: LocalRetention, now_ms: int
) -> list[Deadline]:
    """Each segment's :class:`Deadline`, oldest first (``segments`` in base-offset order, the
    active one last). Non-decreasing: a segment never goes before an older one."""
    total = sum(s.size for s in segments)
    over = total - retention.retention_bytes  # Kafka's initial ``diff``
    out: list[Deadline] = []
    cumulative = 0
    blocked = False  # an older segment no rule deletes: nor any later one
    latest: int | None = None  # the latest deadline of a segment so far: none goes before it
    latest_cause: Cause | None = None
    for seg in segments:
        cumulative += seg.size
        headroom = cumulative - over if retention.retention_bytes >= 0 else None
        own, cause = _own_deadline(seg, retention, headroom, now_ms)
        if seg.next_base is None and (seg.size == 0 or not retention.active_committed):
            own = None  # an empty active segment is never deleted; an uncommitted one not yet
        if own is None or blocked:
            blocked = True
            out.append(Deadline(seg.base_offset, None, None, headroom))
            continue
        if latest is None or own > latest:  # else an older segment holds it back until then
            latest, latest_cause = own, cause
        out.append(Deadline(seg.base_offset, latest, latest_cause, headroom))
    return out


def _own_deadline(
    seg: LocalSegment, retention: LocalRetention, headroom: int | None, now_ms: int
) -> tuple[int | None, Cause | None]:
    """When the segment alone breaches a rule (ignoring older segments): the first rule the
    broker applies that breaches it now, else its time deadline."""
    if seg.next_base is not None and seg.next_base <= retention.log_start_offset:
        return now_ms, "log start"
    if headroom is not None and headroom <= 0:
        return now_ms, "size"
    if retention.retention_ms >= 0 and seg.largest_timestamp is not None:
        return seg.largest_timestamp + retention.retention_ms + 1, "time"
    return None, None


def margin_ms(deadline: Deadline | None, now_ms: int) -> int | None:
    """Deadline − now (ms; negative: overdue, the broker deletes it at its next check); None when
    there is no deadline."""
    if deadline is None or deadline.deadline_ms is None:
        return None
    return deadline.deadline_ms - now_ms


def by_deadline(items: Sequence[T], deadline_of: Callable[[T], int | None]) -> list[T]:
    """``items`` nearest deadline first (epoch ms), those without one after them in their given
    order (a stable sort): the copy order across partitions (docs/topic-policy.md §8)."""

    def key(item: T) -> tuple[bool, int]:
        at = deadline_of(item)
        return (at is None, at or 0)

    return sorted(items, key=key)
