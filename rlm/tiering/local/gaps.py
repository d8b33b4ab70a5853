"""Gaps: offsets the broker deleted before rlm tiered them (docs/visibility.md, "Gaps").

No tier holds such offsets any more; rlm records each as a gap — an inclusive offset range, when
this sidecar first noticed it, why — in the partition's ``progress.json``, so it survives restarts
and every surface can name it: status rows, ``rlm_gap_offsets``, the status page, ``rlm verify``,
and the readers, which answer an offset inside one as "not available in any tier".

A gap is found two ways, both from facts every sidecar of a cluster shares:

* **before the copy resumes**: the lowest offset still held locally is above the highest tiered
  offset + 1 (the segments between rolled and were deleted while rlm was stopped, the store down,
  or the copy behind);
* **in the store**: a hole between two consecutive remote segments of a topic the cleaner does not
  compact (a compacted segment may end below its successor's base legitimately). Any sidecar, and
  a restarted one whose state dir was lost, finds the same hole.

Neither counts offsets below the DeleteRecords point (deleted on purpose), and nothing is a gap
before the first segment of an incarnation is tiered (rlm tiers the log from where it then starts;
a re-created topic is a new incarnation with its own progress). A gap stops being reported once
it lies wholly below the log start (remote retention or DeleteRecords passed it) or a tiered
segment covers it (a segment rlm still held, e.g. pinned, was tiered after all).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlm.tiering.local.statefiles import int_field, str_field
from rlm.tiering.store import SegmentManifest

__all__ = ["DELETED_BEFORE_TIERED", "MISSING_IN_STORE", "Gap", "find_gaps", "gap_at", "merge_gaps"]

log = logging.getLogger(__name__)

#: Why a gap exists, as far as rlm can tell.
DELETED_BEFORE_TIERED = "deleted by the broker before it was tiered"
MISSING_IN_STORE = "missing between two remote segments"


@dataclass(frozen=True, slots=True)
class Gap:
    """Offsets ``[first_offset, last_offset]`` no tier holds; ``noticed_ms``: ms since the epoch
    when this sidecar first saw it; ``reason``: why, as far as known."""

    first_offset: int
    last_offset: int
    noticed_ms: int
    reason: str

    @property
    def size(self) -> int:
        """How many offsets it spans (≥ 1)."""
        return self.last_offset - self.first_offset + 1

    def describe(self) -> str:
        return f"offsets {self.first_offset}-{self.last_offset} are not available in any tier ({self.reason})"

    def to_json(self) -> dict[str, Any]:
        return {
            "first_offset": self.first_offset,
            "last_offset": self.last_offset,
            "noticed_ms": self.noticed_ms,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, doc: Any) -> Gap | None:
        """The gap, or None for anything that is not one (statefiles: a bad entry is absent)."""
        first, last, noticed = (int_field(doc, k) for k in ("first_offset", "last_offset", "noticed_ms"))
        if first is None or last is None or noticed is None or not 0 <= first <= last:
            return None
        return cls(first, last, noticed, str_field(doc, "reason") or DELETED_BEFORE_TIERED)


def find_gaps(
    manifests: Sequence[SegmentManifest],
    highest_tiered: int,
    held_start: int | None,
    deleted_below: int,
    *,
    compacted: bool,
) -> list[tuple[int, int, str]]:
    """The gaps seen now, ``(first, last, reason)`` oldest first. ``held_start``: the lowest offset
    rlm can still copy (the first local segment's base, or a lower held copy's), None when none;
    ``deleted_below``: the DeleteRecords point (-1 none)."""
    found: list[tuple[int, int, str]] = []
    if not compacted:
        for a, b in itertools.pairwise(sorted(manifests, key=lambda m: m.base_offset)):
            found.append((a.last_offset + 1, b.base_offset - 1, MISSING_IN_STORE))
    if highest_tiered >= 0 and held_start is not None:
        found.append((highest_tiered + 1, held_start - 1, DELETED_BEFORE_TIERED))
    out = []
    for first, last, reason in found:
        first = max(first, deleted_below)
        if first <= last:
            out.append((first, last, reason))
    return out


def merge_gaps(
    recorded: Sequence[Gap],
    found: Sequence[tuple[int, int, str]],
    manifests: Sequence[SegmentManifest],
    floor: int,
    now_ms: int,
) -> list[Gap]:
    """``recorded`` and ``found`` as one sorted list of disjoint gaps: overlapping or adjacent ones
    merge (the earliest notice and the first reason kept), offsets a remote segment covers and
    offsets below ``floor`` (the log start) are cut out."""
    items = sorted([*recorded, *(Gap(f, la, now_ms, r) for f, la, r in found)], key=lambda g: g.first_offset)
    merged: list[Gap] = []
    for g in items:
        prev = merged[-1] if merged else None
        if prev is not None and g.first_offset <= prev.last_offset + 1:
            first_seen = prev if prev.noticed_ms <= g.noticed_ms else g
            merged[-1] = Gap(
                prev.first_offset,
                max(prev.last_offset, g.last_offset),
                first_seen.noticed_ms,
                first_seen.reason,
            )
        else:
            merged.append(g)
    covered = sorted((m.base_offset, m.last_offset) for m in manifests)
    out: list[Gap] = []
    for g in merged:
        out.extend(_uncovered(g, covered, floor))
    return out


def _uncovered(gap: Gap, covered: Sequence[tuple[int, int]], floor: int) -> list[Gap]:
    """The parts of ``gap`` at or above ``floor`` that no ``covered`` range (sorted) holds."""
    parts: list[Gap] = []
    start = max(gap.first_offset, floor)
    for lo, hi in covered:
        if hi < start or lo > gap.last_offset:
            continue
        if lo > start:
            parts.append(Gap(start, lo - 1, gap.noticed_ms, gap.reason))
        start = max(start, hi + 1)
    if start <= gap.last_offset:
        parts.append(Gap(start, gap.last_offset, gap.noticed_ms, gap.reason))
    return parts


def gap_at(gaps: Sequence[Gap], offset: int) -> Gap | None:
    """The recorded gap holding ``offset``, else None."""
    return next((g for g in gaps if g.first_offset <= offset <= g.last_offset), None)
