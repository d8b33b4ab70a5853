"""``verify``: a scrub of the remote store and the local index sets, as a Spark job (docs/cli.md).

The driver (this module) runs the stages and gathers one :class:`VerifyReport`:

* stage 1, one executor task per partition (:mod:`rlm.jobs.checks.verify_store`, one listing of
  ``<topic>-<partition>/``): manifests, the objects they name, their uploaded entries, orphans;
* on the driver, the local ``.remotelogindex`` sets against what stage 1 found and the gaps
  between segments (:mod:`rlm.jobs.checks.verify_index`), and the broker's own files
  (:mod:`rlm.jobs.checks.verify_local`): every rolled local segment's ``.log`` CRC-checked and its
  ``.index``/``.timeindex`` checked against it, exactly as tiering checks them before upload
  (docs/broker-files.md);
* stage 2 (``deep``), one executor task per segment (:mod:`rlm.jobs.checks.verify_deep`): every object
  read in full, every batch CRC-checked.

Every problem names what it can: topic, partition, segment base offset, object key or file,
byte position, Kafka offset.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rlm.config import Settings
from rlm.jobs.checks.problem import Problem
from rlm.jobs.checks.verify_deep import deep_check_segment
from rlm.jobs.checks.verify_index import check_local_index, recorded_gaps
from rlm.jobs.checks.verify_local import check_compaction, check_local_segments
from rlm.jobs.checks.verify_store import PartitionFacts, scrub_partition
from rlm.jobs.reading import BackendSpec, select_partitions
from rlm.logdir.discovery import PartitionDir
from rlm.tiering.converge import persisted_progress
from rlm.tiering.expire import TopicPolicyResolver
from rlm.tiering.local import remote_view
from rlm.tiering.store import SegmentManifest

__all__ = ["VerifyReport", "verify"]


@dataclass
class VerifyReport:
    deep: bool
    partitions: int = 0
    segments: int = 0
    objects: int = 0
    bytes_read: int = 0
    batches_checked: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "deep": self.deep,
            "summary": {
                "partitions": self.partitions,
                "segments": self.segments,
                "objects": self.objects,
                "bytes_read": self.bytes_read,
                "batches_checked": self.batches_checked,
                "errors": len(self.errors),
                "warnings": len(self.warnings),
            },
            "problems": [p.to_json() for p in self.errors],
            "warnings": [p.to_json() for p in self.warnings],
        }

    def summary_lines(self) -> list[str]:
        head = (
            f"rlm verify{' --deep' if self.deep else ''}: {self.partitions} partitions, "
            f"{self.segments} segments, {self.objects} objects"
            + (f", {self.bytes_read} bytes and {self.batches_checked} batches checked" if self.deep else "")
            + f": {len(self.errors)} problems, {len(self.warnings)} warnings"
        )
        return [head] + [p.line() for p in self.problems]


def verify(
    spark: Any,
    settings: Settings,
    *,
    deep: bool = False,
    topics: Sequence[str] | None = None,
    now_ms: int | None = None,
) -> VerifyReport:
    """Scrub every partition of ``settings.log.dirs`` (of ``topics``); see the module doc.

    The report's ``ok`` is False when any error-severity problem was found.
    """
    spec = BackendSpec.from_settings(settings)
    parts = {(p.topic, p.partition): p for p in select_partitions(settings, topics)}
    now = int(time.time() * 1000) if now_ms is None else now_ms
    facts = _store_stage(spark, spec, settings, parts, now)
    report = VerifyReport(deep, partitions=len(parts))
    policies = TopicPolicyResolver(settings)
    policies.refresh()
    deep_jobs: list[_DeepJob] = []
    for f in sorted(facts, key=lambda f: (f.topic, f.partition)):
        part = parts[(f.topic, f.partition)]
        manifests = [SegmentManifest.from_json(d) for d in f.manifests]
        report.segments += len(manifests)
        report.objects += f.objects
        report.problems += f.problems
        gaps = persisted_progress(settings.tiering, part).gaps  # docs/visibility.md, "Gaps"
        report.problems += recorded_gaps(part, gaps, check_local_index(part, f, manifests))
        report.problems += check_local_segments(part, settings.log.index_interval_bytes)
        report.problems += check_compaction(part, manifests, policies.policy(f.topic))
        deep_jobs += [
            (m.log.size, d, f.entries.get(m.base_offset)) for m, d in zip(manifests, f.manifests, strict=True)
        ]
    if deep and deep_jobs:
        _deep_stage(spark, spec, deep_jobs, report)
    order = {"error": 0, "warning": 1}
    report.problems.sort(
        key=lambda p: (order[p.severity], p.topic, p.partition, p.base_offset or -1, p.position or -1)
    )
    return report


#: One stage-2 task: (log object size, manifest JSON, its valid uploaded entries or None).
_DeepJob = tuple[int, bytes, bytes | None]


def _store_stage(
    spark: Any,
    spec: BackendSpec,
    settings: Settings,
    parts: dict[tuple[str, int], PartitionDir],
    now_ms: int,
) -> list[PartitionFacts]:
    """Stage 1: one executor task per partition, each given plain data only (the spec, topic,
    partition, its root's key id, the grace period and the clock)."""
    if not parts:
        return []
    roots = sorted((t, p, remote_view(settings.tiering, part).key_id) for (t, p), part in parts.items())
    grace = settings.tiering.gc_grace_ms
    facts: list[PartitionFacts] = (
        spark.sparkContext.parallelize(roots, max(1, len(roots)))
        .map(lambda r: scrub_partition(spec, r[0], r[1], grace, now_ms, r[2]))
        .collect()
    )
    return facts


def _deep_stage(spark: Any, spec: BackendSpec, jobs: list[_DeepJob], report: VerifyReport) -> None:
    """Stage 2: one executor task per segment, the largest first; adds to ``report``."""
    jobs.sort(key=lambda j: -j[0])
    results = (
        spark.sparkContext.parallelize([(d, e) for _, d, e in jobs], len(jobs))
        .map(lambda j: deep_check_segment(spec, j[0], j[1]))
        .collect()
    )
    for problems, read, batches in results:
        report.problems += problems
        report.bytes_read += read
        report.batches_checked += batches
