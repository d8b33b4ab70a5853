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
"""

from __future__ import annotations

from pathlib import Path

from rlm.errors import CorruptIndexError
from rlm.jobs.problem import Problem
from rlm.logdir.indexcheck import IndexKind, parse_checked
from rlm.logdir.scan import PartitionDir, list_segments
from rlm.tiering.compaction import rewrite_findings
from rlm.tiering.copier import SegmentQuarantined, scan
from rlm.tiering.manifest import SegmentManifest
from rlm.tiering.policy import TopicPolicy

__all__ = ["check_compaction", "check_local_segments"]


def check_compaction(part: PartitionDir, manifests: list[SegmentManifest], policy: TopicPolicy
                     ) -> list[Problem]:
    """Findings for local segments rewritten by compaction after they were tiered."""
    archived = policy.compacted and policy.archive_compacted
    return [Problem("compacted", part.topic, part.partition, message, severity=severity,
                    base_offset=r.base_offset, offset=r.base_offset)
            for severity, message, r in rewrite_findings(list_segments(part), manifests, archived=archived)]


def check_local_segments(part: PartitionDir, index_interval_bytes: int) -> list[Problem]:
    """Findings for the rolled segments of ``part`` (``index_interval_bytes`` is named in the
    message of a broken index: the rebuild follows it)."""
    topic, partition = part.topic, part.partition
    problems: list[Problem] = []
    for seg in list_segments(part)[:-1]:
        try:
            scanned = scan(seg.log)
        except FileNotFoundError:
            continue  # deleted by the broker meanwhile
        except SegmentQuarantined as err:
            problems.append(Problem(
                "local_segment_quarantine", topic, partition,
                f"{err.reason} ({err.cause}): tiering quarantines this segment and waits for the broker "
                "to replace or remove it", base_offset=seg.base_offset, key=str(seg.log),
                position=err.position, offset=err.offset))
            continue
        checks: tuple[tuple[IndexKind, Path | None], ...] = (("index", seg.index),
                                                             ("timeindex", seg.time_index))
        for kind, file in checks:
            if file is None:
                continue
            try:
                parse_checked(kind, seg.base_offset, file.read_bytes(), scanned.batches)
            except FileNotFoundError:
                continue
            except CorruptIndexError as err:
                problems.append(Problem(
                    "local_broken_index", topic, partition,
                    f"{err.reason}: rlm uses and uploads an index rebuilt from the .log "
                    f"(index.interval.bytes {index_interval_bytes}); the broker reads this file "
                    "until it rebuilds it", base_offset=seg.base_offset, key=str(file),
                    position=err.position, offset=err.offset))
    return problems
