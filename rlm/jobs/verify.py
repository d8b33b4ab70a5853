"""``verify``: a scrub of the remote store and the local index sets, as a Spark job.

Stage 1, one executor task per partition (one listing of ``<topic>-<partition>/``):
manifests parse and name their own key; every object a manifest names exists under the manifest's
attempt with the recorded size; the uploaded entries object is CRC-valid, covers the log object
back to back and agrees with the manifest. Only what the store serves is checked: the chain of
manifests under the lineage markers (docs/cluster.md); a segment another sidecar's overlapping
copy covers, or one diverged from the lineage, is a warning until the leader uncommits it. Data
attempts no manifest references are **orphans** (an error once older than ``tiering.gc_grace_ms``, else a
warning: the copy may be in flight).

Stage 2 (``deep``), one executor task per segment: every object is read in full and its size and
CRC-32C compared with the manifest; every batch of the log object is CRC-checked and every entry's
offsets/timestamps are compared with the batches it covers.

On the driver: the local ``.remotelogindex`` sets are read strictly (CRC, order, derived
``.remoteoffsetindex``/``.remotetimeindex`` match) and compared entry by entry with the uploaded
entries of the committed segments; a gap between consecutive manifests is an error when anything
shows a segment was there (a local index entry, a local segment or an orphan attempt in the gap),
else a warning (a compacted topic's cleaner may leave such gaps).

Also on the driver, the broker's own files (:mod:`rlm.jobs.verify_local`): every rolled local
segment's ``.log`` is CRC-checked and its ``.index``/``.timeindex`` checked against it, exactly as
tiering checks them before upload (docs/broker-files.md).

Every problem names what it can: topic, partition, segment base offset, object key or file,
byte position, Kafka offset.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlm.config import Settings
from rlm.errors import FormatError, ProtectionError
from rlm.formats import naming
from rlm.formats.remote_index import RemoteLogIndexEntry, iter_entries
from rlm.formats.remote_index_derived import derive_remote_indexes
from rlm.jobs.plan import BackendSpec, select_partitions
from rlm.jobs.problem import Problem, Severity
from rlm.jobs.verify_deep import deep_check_segment
from rlm.jobs.verify_local import check_compaction, check_local_segments
from rlm.logdir.scan import PartitionDir, list_segments
from rlm.storage.api import ObjectInfo, StorageBackend
from rlm.tiering import keys
from rlm.tiering.lineage import Chain, resolve_chain
from rlm.tiering.manifest import ENTRIES_OBJECT, SegmentManifest
from rlm.tiering.policy import TopicPolicyResolver
from rlm.tiering.remote_state import Orphan, RemoteState, remote_view


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


# --------------------------------------------------------------------------------------------
# stage 1: one partition (executor)


@dataclass
class _PartitionFacts:
    topic: str
    partition: int
    problems: list[Problem]
    manifests: list[bytes]  # JSON of each parseable manifest, offset order
    entries: dict[int, bytes]  # base offset -> the uploaded entries object (when valid)
    orphan_bases: list[int]
    objects: int
    key_id: str | None = None  # the incarnation's root (docs/topic-identity.md)
    #: base offset -> the offsets [first, last] the store's chain serves of it (docs/cluster.md)
    links: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: base offset -> the served entries of a segment served only in part, encoded
    clipped: dict[int, bytes] = field(default_factory=dict)


def _check_entries(
    topic: str, partition: int, backend: StorageBackend, m: SegmentManifest, blob: bytes, key: str
) -> list[Problem]:
    out: list[Problem] = []

    def bad(message: str, **kw: Any) -> None:
        out.append(
            Problem("entries_object", topic, partition, message, base_offset=m.base_offset, key=key, **kw)
        )

    try:
        decoded = list(iter_entries(blob))
    except FormatError as err:
        bad(err.reason, position=err.position, offset=err.offset)
        return out
    if len(decoded) != m.index_entries:
        bad(f"{len(decoded)} entries, the manifest says {m.index_entries}")
    position = 0
    for d in decoded:
        e = d.entry
        try:
            url_key = backend.key_for_url(e.rdi.url)
        except ValueError:
            url_key = None
        if url_key != m.log.key:
            bad(
                f"entry RDI {e.rdi} does not name the segment's log object {m.log.key}",
                position=d.position,
                offset=e.first_offset,
            )
        if e.rdi.position != position:
            bad(
                f"entry starts at byte {e.rdi.position} of the log object, expected {position} "
                "(entries must cover the object back to back)",
                position=d.position,
                offset=e.first_offset,
            )
        position = e.rdi.position + e.stored_size
    if decoded:
        # Stored entries cover the stored object; their plaintext the segment (docs/protection.md).
        covered = m.log.size if m.protection is not None else m.size_bytes
        if position != covered:
            bad(f"entries cover {position} bytes, the manifest says {covered}")
        plain = sum(d.entry.data_length for d in decoded)
        if m.protection is not None and plain != m.size_bytes:
            bad(f"entries hold {plain} plaintext bytes, the manifest says {m.size_bytes}")
        if decoded[0].entry.first_offset < m.base_offset:
            bad(
                f"first entry offset {decoded[0].entry.first_offset} is below the segment base",
                offset=decoded[0].entry.first_offset,
            )
        if decoded[-1].entry.last_offset != m.last_offset:
            bad(
                f"last entry ends at offset {decoded[-1].entry.last_offset}, the manifest says "
                f"{m.last_offset}",
                offset=decoded[-1].entry.last_offset,
            )
    return out


def _read_manifests(
    remote: RemoteState, listing: Iterable[ObjectInfo], problems: list[Problem]
) -> list[SegmentManifest]:
    """The listed manifests that parse and name their own key, in offset order; a problem for
    each other one."""
    topic, partition = remote.topic, remote.partition
    manifests: list[SegmentManifest] = []
    for base, key in remote.manifest_keys(listing):
        try:
            m = remote.read_manifest(key)
        except FormatError as err:
            problems.append(
                Problem("manifest_unreadable", topic, partition, err.reason, base_offset=base, key=key)
            )
            continue
        if (m.topic, m.partition, m.base_offset) != (topic, partition, base):
            problems.append(
                Problem(
                    "manifest_key",
                    topic,
                    partition,
                    f"manifest describes {m.topic}-{m.partition} segment {m.base_offset}",
                    base_offset=base,
                    key=key,
                )
            )
            continue
        manifests.append(m)
    return manifests


def check_partition(
    spec: BackendSpec, topic: str, partition: int, grace_ms: int, now_ms: int, key_id: str | None = None
) -> _PartitionFacts:
    """Stage 1 for one partition (runs in an executor); ``key_id``: its incarnation's root
    (docs/topic-identity.md; None = the name-only root)."""
    remote = RemoteState(spec.create(), topic, partition, key_id, protection=spec.protection())
    problems: list[Problem] = []
    listing: dict[str, ObjectInfo] = {i.key: i for i in remote.list_partition()}
    manifests = _read_manifests(remote, listing.values(), problems)
    chain = _resolve(remote, listing.values(), manifests, problems)  # only what is served is checked
    entries: dict[int, bytes] = {}
    objects = 0
    for m in chain.manifests:
        for name, stored in sorted(m.objects.items()):
            objects += 1
            ref = keys.parse_data_key(topic, partition, stored.key, key_id)
            if ref is None or (ref.base_offset, ref.attempt_id) != (m.base_offset, m.attempt_id):
                problems.append(
                    Problem(
                        "object_foreign",
                        topic,
                        partition,
                        f"manifest object {name!r} is not under the manifest's attempt {m.attempt_id}",
                        base_offset=m.base_offset,
                        key=stored.key,
                    )
                )
            info = listing.get(stored.key)
            if info is None:
                problems.append(
                    Problem(
                        "object_missing",
                        topic,
                        partition,
                        f"manifest object {name!r} does not exist",
                        base_offset=m.base_offset,
                        key=stored.key,
                    )
                )
            elif info.size != stored.size:
                problems.append(
                    Problem(
                        "object_size",
                        topic,
                        partition,
                        f"object {name!r} has {info.size} bytes, the manifest says {stored.size}",
                        base_offset=m.base_offset,
                        key=stored.key,
                    )
                )
        entries_obj = m.objects.get(ENTRIES_OBJECT)
        if entries_obj is None:
            problems.append(
                Problem(
                    "entries_object",
                    topic,
                    partition,
                    "manifest names no uploaded entries object",
                    base_offset=m.base_offset,
                )
            )
        elif entries_obj.key in listing:
            try:
                blob = remote.entries_blob(m)
            except ProtectionError as err:  # a missing/wrong key, a tampered object: one problem
                problems.append(
                    Problem(
                        "protection",
                        topic,
                        partition,
                        err.reason,
                        base_offset=m.base_offset,
                        key=err.file or entries_obj.key,
                    )
                )
                continue
            found = _check_entries(topic, partition, remote.backend, m, blob, entries_obj.key)
            problems += found
            if not found:
                entries[m.base_offset] = blob
    clipped = {}
    for link in chain.links:
        if not link.whole and link.manifest.base_offset in entries:
            clipped[link.manifest.base_offset] = b"".join(e.encode() for e in remote.link_entries(link))
    orphans = remote.unreferenced(remote.attempts(listing.values()), manifests, now_ms)
    problems += [_orphan_problem(o, grace_ms, key_id) for o in orphans]
    return _PartitionFacts(
        topic,
        partition,
        problems,
        [lk.manifest.to_json() for lk in chain.links],
        entries,
        [o.base_offset for o in orphans],
        objects,
        key_id,
        {lk.manifest.base_offset: (lk.first_offset, lk.last_offset) for lk in chain.links},
        clipped,
    )


def _resolve(
    remote: RemoteState,
    listing: Iterable[ObjectInfo],
    manifests: list[SegmentManifest],
    problems: list[Problem],
) -> Chain:
    """The store's chain under its lineage markers (docs/cluster.md). What it leaves out is a
    warning: the partition's leader uncommits such segments on its next pass."""
    topic, partition = remote.topic, remote.partition
    lineages = []
    for epoch, key in remote.lineage_marker_keys(listing):
        try:
            lineages.append(remote.read_lineage_marker(key).lineage)
        except FormatError as err:
            problems.append(Problem("lineage_marker", topic, partition, err.reason, key=key, offset=epoch))
    chain = resolve_chain(manifests, lineages)
    for m in chain.superseded:
        problems.append(
            Problem(
                "overlap",
                topic,
                partition,
                f"segment {m.base_offset}-{m.last_offset} is wholly covered by earlier "
                "segments (another sidecar's copy): not served; the leader uncommits it",
                severity="warning",
                base_offset=m.base_offset,
                offset=m.base_offset,
            )
        )
    for m, cut in chain.diverged:
        problems.append(
            Problem(
                "diverged",
                topic,
                partition,
                f"segment {m.base_offset}-{m.last_offset} is not on the partition's lineage "
                f"from offset {cut} (leader epochs {list(m.leader_epochs)}): not served; "
                "the leader uncommits it",
                severity="warning",
                base_offset=m.base_offset,
                offset=cut,
            )
        )
    return chain


def _orphan_problem(o: Orphan, grace_ms: int, key_id: str | None) -> Problem:
    """An error once the attempt is ``grace_ms`` old (by ``attempt_age_ms``: an attempt of unknown
    age counts as new, docs/remote-state.md), else a warning: the copy may be in flight."""
    old = o.age_ms >= grace_ms
    return Problem(
        "orphan",
        o.topic,
        o.partition,
        f"copy attempt {o.attempt_id} ({len(o.keys)} objects, {o.bytes} bytes, {o.age_ms} ms old) "
        "is referenced by no manifest"
        + ("" if old else "; younger than tiering.gc_grace_ms, the copy may be in flight"),
        severity="error" if old else "warning",
        base_offset=o.base_offset,
        key=keys.attempt_prefix(o.topic, o.partition, o.base_offset, o.attempt_id, key_id),
    )


# --------------------------------------------------------------------------------------------
# driver: local index sets and gaps


def _check_local(
    part: PartitionDir, facts: _PartitionFacts, manifests: list[SegmentManifest]
) -> list[Problem]:
    topic, partition = part.topic, part.partition
    problems: list[Problem] = []
    local: list[tuple[str, int, RemoteLogIndexEntry]] = []  # (file, position, entry)
    for path in sorted(part.path.glob("*" + naming.REMOTE_LOG_INDEX)):
        buf = path.read_bytes()
        try:
            base = naming.parse_base_offset(path.name)
            decoded = list(iter_entries(buf))
        except (FormatError, ValueError) as err:
            problems.append(
                Problem(
                    "local_index",
                    topic,
                    partition,
                    str(getattr(err, "reason", err)),
                    key=str(path),
                    position=getattr(err, "position", None),
                    offset=getattr(err, "offset", None),
                )
            )
            continue
        if decoded and decoded[0].entry.first_offset != base:
            problems.append(
                Problem(
                    "local_index",
                    topic,
                    partition,
                    f"set named {base} starts at offset {decoded[0].entry.first_offset}",
                    key=str(path),
                    position=0,
                    offset=decoded[0].entry.first_offset,
                )
            )
        offset_bytes, time_bytes = derive_remote_indexes(buf, base)
        for suffix, expected in (
            (naming.REMOTE_OFFSET_INDEX, offset_bytes),
            (naming.REMOTE_TIME_INDEX, time_bytes),
        ):
            derived = path.with_suffix(suffix)
            if not derived.exists() or derived.read_bytes() != expected:
                problems.append(
                    Problem(
                        "local_derived_index",
                        topic,
                        partition,
                        "does not match its .remotelogindex",
                        key=str(derived),
                    )
                )
        local += [(str(path), d.position, d.entry) for d in decoded]
    for (_, _, a), (f, pos, b) in itertools.pairwise(local):
        if b.first_offset <= a.last_offset:
            problems.append(
                Problem(
                    "local_contiguity",
                    topic,
                    partition,
                    f"entry starts at {b.first_offset}, not after the previous entry's "
                    f"last offset {a.last_offset}",
                    key=f,
                    position=pos,
                    offset=b.first_offset,
                )
            )
    # Compare with the committed segments' uploaded entries (only segments whose entries are valid).
    if not manifests:
        for f, pos, e in local[:1]:
            problems.append(
                Problem(
                    "local_index_ahead",
                    topic,
                    partition,
                    "local index entries exist but the store has no committed segment",
                    key=f,
                    position=pos,
                    offset=e.first_offset,
                )
            )
        return problems
    spans = [facts.links.get(m.base_offset, (m.base_offset, m.last_offset)) for m in manifests]
    remote_start = spans[0][0]
    live = [x for x in local if x[2].last_offset >= remote_start]
    by_segment: dict[int, list[tuple[str, int, RemoteLogIndexEntry]]] = defaultdict(list)
    firsts = [first for first, _ in spans]
    unowned: list[tuple[str, int, RemoteLogIndexEntry]] = []
    for x in live:
        i = bisect.bisect_right(firsts, x[2].first_offset) - 1
        if i >= 0 and x[2].first_offset <= spans[i][1]:
            by_segment[manifests[i].base_offset].append(x)
        else:
            unowned.append(x)
    for m in manifests:
        blob = facts.clipped.get(m.base_offset, facts.entries.get(m.base_offset))
        got = by_segment.pop(m.base_offset, [])
        if blob is None:
            continue
        uploaded = [d.entry for d in iter_entries(blob)]
        if not got:
            sev: Severity = "warning" if m is manifests[-1] else "error"
            problems.append(
                Problem(
                    "local_index_missing",
                    topic,
                    partition,
                    f"no local index entries for committed segment {m.base_offset}-"
                    f"{m.last_offset}"
                    + (" (the daemon may not have appended them yet)" if sev == "warning" else ""),
                    severity=sev,
                    base_offset=m.base_offset,
                    offset=m.base_offset,
                )
            )
            continue
        for n, (f, pos, e) in enumerate(got):
            if n >= len(uploaded) or e != uploaded[n]:
                theirs = (
                    f"{uploaded[n].first_offset}-{uploaded[n].last_offset} @ {uploaded[n].rdi}"
                    if n < len(uploaded)
                    else "(none)"
                )
                problems.append(
                    Problem(
                        "local_index_mismatch",
                        topic,
                        partition,
                        f"local entry {e.first_offset}-{e.last_offset} @ {e.rdi} differs "
                        f"from the segment's uploaded entry {theirs}",
                        base_offset=m.base_offset,
                        key=f,
                        position=pos,
                        offset=e.first_offset,
                    )
                )
                break
        else:
            if len(got) < len(uploaded):
                problems.append(
                    Problem(
                        "local_index_mismatch",
                        topic,
                        partition,
                        f"{len(got)} local entries, the segment has {len(uploaded)}",
                        base_offset=m.base_offset,
                        key=got[-1][0],
                        offset=uploaded[len(got)].first_offset,
                    )
                )
    runs: list[list[tuple[str, int, RemoteLogIndexEntry]]] = []
    for x in unowned:  # group consecutive unowned entries of one file
        if runs and runs[-1][-1][0] == x[0] and runs[-1][-1][1] < x[1]:
            runs[-1].append(x)
        else:
            runs.append([x])
    for run in runs:
        f, pos, e = run[0]
        problems.append(
            Problem(
                "local_index_orphan_entries",
                topic,
                partition,
                f"{len(run)} local entries, offsets {e.first_offset}-"
                f"{run[-1][2].last_offset}, belong to no committed segment",
                key=f,
                position=pos,
                offset=e.first_offset,
            )
        )
    problems += _gaps(part, facts, manifests, [x[2] for x in local])
    return problems


def _gaps(
    part: PartitionDir,
    facts: _PartitionFacts,
    manifests: list[SegmentManifest],
    local: list[RemoteLogIndexEntry],
) -> list[Problem]:
    out = []
    segment_bases = [s.base_offset for s in list_segments(part)]
    for a, b in itertools.pairwise(manifests):
        lo = facts.links.get(a.base_offset, (a.base_offset, a.last_offset))[1] + 1
        hi = facts.links.get(b.base_offset, (b.base_offset, b.last_offset))[0] - 1
        if hi < lo:
            continue
        evidence = [
            f"local index entry at offset {e.first_offset}"
            for e in local
            if e.first_offset <= hi and e.last_offset >= lo
        ][:1]
        evidence += [f"local segment {s}" for s in segment_bases if lo <= s <= hi][:1]
        evidence += [f"orphan attempt of segment {o}" for o in facts.orphan_bases if lo <= o <= hi][:1]
        out.append(
            Problem(
                "gap",
                part.topic,
                part.partition,
                f"offsets {lo}-{hi} lie between segment {a.base_offset} (last offset {a.last_offset}) and "
                f"segment {b.base_offset}: "
                + (
                    f"a committed segment is missing ({'; '.join(evidence)})"
                    if evidence
                    else "no sign of a missing segment (normal after compaction)"
                ),
                severity="error" if evidence else "warning",
                base_offset=b.base_offset,
                key=keys.manifest_key(part.topic, part.partition, b.base_offset, facts.key_id),
                offset=lo,
            )
        )
    return out


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
    roots = sorted((t, p, remote_view(settings.tiering, part).key_id) for (t, p), part in parts.items())
    now = int(time.time() * 1000) if now_ms is None else now_ms
    grace = settings.tiering.gc_grace_ms
    sc = spark.sparkContext
    facts: list[_PartitionFacts] = (
        (
            sc.parallelize(roots, max(1, len(roots)))
            .map(lambda r: check_partition(spec, r[0], r[1], grace, now, r[2]))
            .collect()
        )
        if parts
        else []
    )
    report = VerifyReport(deep, partitions=len(parts))
    policies = TopicPolicyResolver(settings)
    policies.refresh()
    deep_jobs = []
    for f in sorted(facts, key=lambda f: (f.topic, f.partition)):
        manifests = [SegmentManifest.from_json(d) for d in f.manifests]
        report.segments += len(manifests)
        report.objects += f.objects
        report.problems += f.problems
        report.problems += _check_local(parts[(f.topic, f.partition)], f, manifests)
        report.problems += check_local_segments(
            parts[(f.topic, f.partition)], settings.log.index_interval_bytes
        )
        report.problems += check_compaction(
            parts[(f.topic, f.partition)], manifests, policies.policy(f.topic)
        )
        deep_jobs += [
            (m.log.size, d, f.entries.get(m.base_offset)) for m, d in zip(manifests, f.manifests, strict=True)
        ]
    if deep and deep_jobs:
        deep_jobs.sort(key=lambda j: -j[0])
        results = (
            sc.parallelize([(d, e) for _, d, e in deep_jobs], len(deep_jobs))
            .map(lambda j: deep_check_segment(spec, j[0], j[1]))
            .collect()
        )
        for problems, read, batches in results:
            report.problems += problems
            report.bytes_read += read
            report.batches_checked += batches
    order = {"error": 0, "warning": 1}
    report.problems.sort(
        key=lambda p: (order[p.severity], p.topic, p.partition, p.base_offset or -1, p.position or -1)
    )
    return report
