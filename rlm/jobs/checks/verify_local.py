"""``rlm verify`` on the broker's own files: the same checks tiering makes before it uses or
uploads a segment (docs/broker-files.md), run over every rolled local segment.

* ``local_segment_quarantine`` (error): a rolled ``.log`` that is empty, ends inside a batch or
  fails a CRC — tiering quarantines it and the partition's later segments wait.
* ``local_broken_index`` (error): a ``.index``/``.timeindex`` that fails Kafka's sanity check or
  does not match its ``.log`` — rlm uses and uploads a rebuild, but the broker itself reads the
  broken file until it rebuilds it.

The active (last) segment is skipped: it is being written, and Kafka checks it on recovery.

* ``compacted``: a local range the log cleaner rewrote after it was tiered (docs/topic-policy.md) —
  a warning naming it for an ``archive_compacted`` topic, an error otherwise (the tiers disagree).
  A local segment that only *starts or ends elsewhere* than the tiered segments is not one: the
  replica rolled at other offsets than the one whose sidecar tiered them (docs/cluster-copy.md).
  That is told by the bytes: every tiered segment it overlaps is, offset for offset, the same
  batches in the local log (size and CRC-32C; for one that begins before the local log start,
  its locally kept tail has contiguous offsets up to its last offset).
"""

from __future__ import annotations

import bisect
import mmap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import crc32c

from rlm.errors import CorruptIndexError, RlmError, SegmentQuarantined
from rlm.formats.records import iter_batches
from rlm.jobs.checks.problem import Problem
from rlm.logdir.discovery import PartitionDir, SegmentFiles, list_segments
from rlm.logdir.indexcheck import IndexKind, parse_checked
from rlm.tiering.converge import rewrite_findings
from rlm.tiering.copy import checksum_segment
from rlm.tiering.expire import TopicPolicy
from rlm.tiering.store import SegmentManifest

__all__ = ["check_compaction", "check_local_segments"]


def check_compaction(
    part: PartitionDir, manifests: list[SegmentManifest], policy: TopicPolicy
) -> list[Problem]:
    """Findings for local segments rewritten by compaction after they were tiered (a segment that
    merely rolled elsewhere, with the same batches, is not one: see the module doc)."""
    archived = policy.compacted and policy.archive_compacted
    segments = list_segments(part)
    findings = rewrite_findings(segments, manifests, archived=archived)
    if findings:
        same = _same_batches(
            segments, [m for m in manifests if any(m.base_offset in r.tiered_bases for _, _, r in findings)]
        )
        findings = [f for f in findings if not set(f[2].tiered_bases) <= same]
    return [
        Problem(
            "compacted",
            part.topic,
            part.partition,
            message,
            severity=severity,
            base_offset=r.base_offset,
            offset=r.base_offset,
        )
        for severity, message, r in findings
    ]


@dataclass
class _Tally:
    """The local batches whose base offsets fall in one tiered segment's offsets."""

    first: int | None = None
    last: int = -1
    size: int = 0
    crc: int = 0
    contiguous: bool = True


def _same_batches(segments: Sequence[SegmentFiles], manifests: Sequence[SegmentManifest]) -> set[int]:
    """Base offsets of ``manifests`` whose offsets the local log holds as the same batches: the
    same bytes (size and CRC-32C of the log object), or — for one beginning before the local log
    start — a locally kept tail of contiguous offsets ending at its last offset."""
    if not manifests or not segments:
        return set()
    bases = [m.base_offset for m in manifests]
    tallies = [_Tally() for _ in manifests]
    lo, hi = bases[0], max(m.last_offset for m in manifests)
    for seg, nxt in zip(segments, [*segments[1:], None], strict=True):
        if seg.base_offset > hi or (nxt is not None and nxt.base_offset <= lo):
            continue  # holds none of these offsets
        try:
            _tally_file(seg.log, manifests, bases, tallies)
        except (OSError, RlmError, ValueError):
            return set()  # unreadable or corrupt: the segment checks above report that
    local_start = segments[0].base_offset
    same = set()
    for m, t in zip(manifests, tallies, strict=True):
        if t.first is None or t.last != m.last_offset or not t.contiguous:
            continue
        whole = t.first == m.base_offset and (t.size, t.crc) == (m.log.size, m.log.crc32c)
        tail = m.base_offset < local_start <= t.first and t.size <= m.log.size
        if whole or tail:
            same.add(m.base_offset)
    return same


def _tally_file(
    path: Path, manifests: Sequence[SegmentManifest], bases: list[int], tallies: list[_Tally]
) -> None:
    with path.open("rb") as fh:
        if fh.seek(0, 2) == 0:
            return  # an empty active segment (mmap cannot map 0 bytes)
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            for b in iter_batches(buf, verify_crc=False):
                i = bisect.bisect_right(bases, b.base_offset) - 1
                if i < 0 or b.base_offset > manifests[i].last_offset:
                    continue
                t = tallies[i]
                if t.first is not None and b.base_offset != t.last + 1:
                    t.contiguous = False
                t.first = b.base_offset if t.first is None else t.first
                t.last = b.last_offset
                t.size += b.size
                t.crc = crc32c.crc32c(buf[b.position : b.end_position], t.crc)


def check_local_segments(part: PartitionDir, index_interval_bytes: int) -> list[Problem]:
    """Findings for the rolled segments of ``part`` (``index_interval_bytes`` is named in the
    message of a broken index: the rebuild follows it)."""
    topic, partition = part.topic, part.partition
    problems: list[Problem] = []
    for seg in list_segments(part)[:-1]:
        try:
            checksummed = checksum_segment(seg.log)
        except FileNotFoundError:
            continue  # deleted by the broker meanwhile
        except SegmentQuarantined as err:
            problems.append(
                Problem(
                    "local_segment_quarantine",
                    topic,
                    partition,
                    f"{err.reason} ({err.cause}): tiering quarantines this segment and waits for the broker "
                    "to replace or remove it",
                    base_offset=seg.base_offset,
                    key=str(seg.log),
                    position=err.position,
                    offset=err.offset,
                )
            )
            continue
        checks: tuple[tuple[IndexKind, Path | None], ...] = (
            ("index", seg.index),
            ("timeindex", seg.time_index),
        )
        for kind, file in checks:
            if file is None:
                continue
            try:
                parse_checked(kind, seg.base_offset, file.read_bytes(), checksummed.batches)
            except FileNotFoundError:
                continue
            except CorruptIndexError as err:
                problems.append(
                    Problem(
                        "local_broken_index",
                        topic,
                        partition,
                        f"{err.reason}: rlm uses and uploads an index rebuilt from the .log "
                        f"(index.interval.bytes {index_interval_bytes}); the broker reads this file "
                        "until it rebuilds it",
                        base_offset=seg.base_offset,
                        key=str(file),
                        position=err.position,
                        offset=err.offset,
                    )
                )
    return problems
