"""Compaction of tiered offsets: find local segments the log cleaner rewrote after they were tiered.

Kafka's cleaner rewrites a group of rolled segments into one (named after the first segment's base
offset), dropping records superseded by a later one with the same key. For a topic archived with
``archive_compacted`` (docs/topic-policy.md) the remote tier keeps the pre-compaction history: the
offsets it holds are answered from it, the rewritten local copy is never uploaded again, and the
rewrite is reported — in status, the ``rlm_compacted_local_segments`` metric and ``rlm verify``.

A local rolled segment overlapping the tiered offsets is *unchanged* when a remote segment has the
same base offset and the same size (the cleaner only rewrites to make a segment smaller, or to
merge several); anything else is a rewrite. Pure: no I/O beyond the listing the caller passes.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rlm.logdir.discovery import SegmentFiles
from rlm.tiering.store import SegmentManifest

__all__ = ["RewrittenRange", "find_rewrites", "rewrite_findings"]


@dataclass(frozen=True, slots=True)
class RewrittenRange:
    """One local segment ``[base_offset, end_offset)`` that differs from the tiered segments it
    overlaps (``tiered_bases``). ``untiered_from`` is set when the rewrite merged tiered offsets
    with offsets never tiered (from there to ``end_offset``): those cannot be archived any more
    without uploading the tiered part twice, so they are reported, not copied."""

    base_offset: int
    end_offset: int
    local_bytes: int
    tiered_bases: tuple[int, ...]
    tiered_bytes: int
    untiered_from: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "base_offset": self.base_offset,
            "end_offset": self.end_offset,
            "local_bytes": self.local_bytes,
            "tiered_segments": list(self.tiered_bases),
            "tiered_bytes": self.tiered_bytes,
            "untiered_from": self.untiered_from,
        }

    def describe(self) -> str:
        tail = (
            (
                f"; offsets {self.untiered_from}-{self.end_offset - 1} were compacted together with "
                "tiered ones and are not archived"
            )
            if self.untiered_from is not None
            else ""
        )
        return (
            f"local segment {self.base_offset} (offsets {self.base_offset}-{self.end_offset - 1}, "
            f"{self.local_bytes} bytes) was rewritten by compaction after tiering; the remote "
            f"tier keeps segments {list(self.tiered_bases)} ({self.tiered_bytes} bytes){tail}"
        )


def find_rewrites(
    segments: Sequence[SegmentFiles], manifests: Sequence[SegmentManifest]
) -> list[RewrittenRange]:
    """Rolled local segments (``segments`` in base order, the last one active) that overlap the
    committed remote segments (``manifests`` in base order) but are not byte-for-byte the same
    size and start as one of them."""
    if not manifests or len(segments) < 2:
        return []
    remote_start, highest = manifests[0].base_offset, max(m.last_offset for m in manifests)
    by_base = {m.base_offset: m for m in manifests}
    found = []
    for seg, nxt in itertools.pairwise(segments):
        end = nxt.base_offset  # exclusive
        if end <= remote_start or seg.base_offset > highest:
            continue  # nothing of it is remote
        same = by_base.get(seg.base_offset)
        if same is not None and same.size_bytes == seg.size and same.last_offset < end:
            continue
        overlap = [m for m in manifests if m.base_offset < end and m.last_offset >= seg.base_offset]
        if not overlap:
            continue  # between remote segments: a missing segment (verify's gap check), no rewrite
        covered_to = max(m.last_offset for m in overlap)
        found.append(
            RewrittenRange(
                seg.base_offset,
                end,
                seg.size,
                tuple(m.base_offset for m in overlap),
                sum(m.size_bytes for m in overlap),
                covered_to + 1 if covered_to < end - 1 else None,
            )
        )
    return found


def rewrite_findings(
    segments: Sequence[SegmentFiles], manifests: Sequence[SegmentManifest], *, archived: bool
) -> list[tuple[Literal["error", "warning"], str, RewrittenRange]]:
    """``(severity, message, range)`` per rewrite for ``rlm verify``: a warning that names the
    compaction when the topic is archived on purpose (``archive_compacted``), an error otherwise
    (the two tiers then disagree about the same offsets)."""
    out: list[tuple[Literal["error", "warning"], str, RewrittenRange]] = []
    for r in find_rewrites(segments, manifests):
        if archived:
            out.append(("warning", r.describe() + " (archive_compacted: answered from the remote tier)", r))
        else:
            out.append(
                (
                    "error",
                    r.describe() + "; the topic is not archived with archive_compacted, so "
                    "the local and remote answers for these offsets differ",
                    r,
                )
            )
    return out
