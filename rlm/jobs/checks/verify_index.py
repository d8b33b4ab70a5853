"""``verify`` on the driver: the local ``.remotelogindex`` sets against the store (docs/cli.md
``rlm verify``).

The sets are read strictly (CRC, order, derived ``.remoteoffsetindex``/``.remotetimeindex`` match)
and compared entry by entry with the uploaded entries of the committed segments (stage 1's
:class:`~rlm.jobs.checks.verify_store.PartitionFacts`); a gap between consecutive manifests is an error
when anything shows a segment was there (a local index entry, a local segment or an orphan attempt
in the gap), else a warning (a compacted topic's cleaner may leave such gaps).
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from pathlib import Path
from typing import Any

from rlm.errors import FormatError
from rlm.formats import naming
from rlm.formats.indexes.remote_index import RemoteLogIndexEntry, iter_entries
from rlm.formats.indexes.remote_index_derived import derive_remote_indexes
from rlm.jobs.checks.problem import Problem, Severity
from rlm.jobs.checks.verify_store import PartitionFacts
from rlm.logdir.discovery import PartitionDir, list_segments
from rlm.tiering.local import Gap
from rlm.tiering.store import SegmentManifest, object_keys

__all__ = ["check_local_index", "recorded_gaps"]

#: One local entry where it was read: (file, byte position in it, entry).
_Located = tuple[str, int, RemoteLogIndexEntry]


def check_local_index(
    part: PartitionDir, facts: PartitionFacts, manifests: list[SegmentManifest]
) -> list[Problem]:
    """Every problem of ``part``'s local sets: their own integrity, their agreement with the
    served ``manifests`` and the gaps between those."""
    problems: list[Problem] = []
    local = _read_sets(part, problems)
    problems += _contiguity(part, local)
    if not manifests:
        return problems + _ahead(part, local)
    by_segment, unowned = _by_segment(local, manifests, facts)
    for m in manifests:
        got = by_segment.pop(m.base_offset, [])
        blob = facts.clipped.get(m.base_offset, facts.entries.get(m.base_offset))
        if blob is not None:
            problems += _compare_segment(part, m, got, blob, last=m is manifests[-1])
    problems += _unowned_runs(part, unowned)
    problems += _gaps(part, facts, manifests, [x[2] for x in local])
    return problems


def _read_sets(part: PartitionDir, problems: list[Problem]) -> list[_Located]:
    """Every entry of the local sets, oldest first; a problem for each set that does not read
    strictly or whose derived files do not match (an unreadable set contributes no entries)."""
    local: list[_Located] = []
    for path in sorted(part.path.glob("*" + naming.REMOTE_LOG_INDEX)):
        buf = path.read_bytes()
        try:
            base = naming.parse_base_offset(path.name)
            decoded = list(iter_entries(buf))
        except (FormatError, ValueError) as err:
            problems.append(
                Problem(
                    "local_index",
                    part.topic,
                    part.partition,
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
                    part.topic,
                    part.partition,
                    f"set named {base} starts at offset {decoded[0].entry.first_offset}",
                    key=str(path),
                    position=0,
                    offset=decoded[0].entry.first_offset,
                )
            )
        problems += _derived(part, path, buf, base)
        local += [(str(path), d.position, d.entry) for d in decoded]
    return local


def _derived(part: PartitionDir, path: Path, buf: bytes, base: int) -> list[Problem]:
    """The set's ``.remoteoffsetindex`` and ``.remotetimeindex`` must be what its entries derive."""
    offset_bytes, time_bytes = derive_remote_indexes(buf, base)
    out = []
    for suffix, expected in (
        (naming.REMOTE_OFFSET_INDEX, offset_bytes),
        (naming.REMOTE_TIME_INDEX, time_bytes),
    ):
        derived = path.with_suffix(suffix)
        if not derived.exists() or derived.read_bytes() != expected:
            out.append(
                Problem(
                    "local_derived_index",
                    part.topic,
                    part.partition,
                    "does not match its .remotelogindex",
                    key=str(derived),
                )
            )
    return out


def _contiguity(part: PartitionDir, local: list[_Located]) -> list[Problem]:
    """Each entry must start after the previous one's last offset (across sets too)."""
    return [
        _at(
            part,
            "local_contiguity",
            f"entry starts at {b[2].first_offset}, not after the previous entry's last offset "
            f"{a[2].last_offset}",
            b,
        )
        for a, b in itertools.pairwise(local)
        if b[2].first_offset <= a[2].last_offset
    ]


def _ahead(part: PartitionDir, local: list[_Located]) -> list[Problem]:
    """Local entries while the store has no committed segment: one problem, at the first."""
    return [
        _at(part, "local_index_ahead", "local index entries exist but the store has no committed segment", x)
        for x in local[:1]
    ]


def _by_segment(
    local: list[_Located], manifests: list[SegmentManifest], facts: PartitionFacts
) -> tuple[dict[int, list[_Located]], list[_Located]]:
    """The local entries at or above the remote log start, by the served segment whose offsets
    hold their first offset (base offset → entries), and those no served segment holds."""
    spans = [facts.links.get(m.base_offset, (m.base_offset, m.last_offset)) for m in manifests]
    remote_start = spans[0][0]
    by_segment: dict[int, list[_Located]] = defaultdict(list)
    firsts = [first for first, _ in spans]
    unowned: list[_Located] = []
    for x in local:
        if x[2].last_offset < remote_start:
            continue
        i = bisect.bisect_right(firsts, x[2].first_offset) - 1
        if i >= 0 and x[2].first_offset <= spans[i][1]:
            by_segment[manifests[i].base_offset].append(x)
        else:
            unowned.append(x)
    return by_segment, unowned


def _compare_segment(
    part: PartitionDir, m: SegmentManifest, got: list[_Located], blob: bytes, *, last: bool
) -> list[Problem]:
    """The local entries ``got`` of segment ``m`` against its served uploaded entries ``blob``:
    none at all (a warning for the ``last`` segment: the daemon may not have appended them yet),
    the first that differs, or too few."""
    uploaded = [d.entry for d in iter_entries(blob)]
    if not got:
        sev: Severity = "warning" if last else "error"
        return [
            Problem(
                "local_index_missing",
                part.topic,
                part.partition,
                f"no local index entries for committed segment {m.base_offset}-{m.last_offset}"
                + (" (the daemon may not have appended them yet)" if sev == "warning" else ""),
                severity=sev,
                base_offset=m.base_offset,
                offset=m.base_offset,
            )
        ]
    for n, (f, pos, e) in enumerate(got):
        if n >= len(uploaded) or e != uploaded[n]:
            theirs = (
                f"{uploaded[n].first_offset}-{uploaded[n].last_offset} @ {uploaded[n].rdi}"
                if n < len(uploaded)
                else "(none)"
            )
            return [
                _at(
                    part,
                    "local_index_mismatch",
                    f"local entry {e.first_offset}-{e.last_offset} @ {e.rdi} differs "
                    f"from the segment's uploaded entry {theirs}",
                    (f, pos, e),
                    base_offset=m.base_offset,
                )
            ]
    if len(got) < len(uploaded):
        return [
            Problem(
                "local_index_mismatch",
                part.topic,
                part.partition,
                f"{len(got)} local entries, the segment has {len(uploaded)}",
                base_offset=m.base_offset,
                key=got[-1][0],
                offset=uploaded[len(got)].first_offset,
            )
        ]
    return []


def _unowned_runs(part: PartitionDir, unowned: list[_Located]) -> list[Problem]:
    """One problem per run of consecutive entries of one file that no served segment holds."""
    runs: list[list[_Located]] = []
    for x in unowned:
        if runs and runs[-1][-1][0] == x[0] and runs[-1][-1][1] < x[1]:
            runs[-1].append(x)
        else:
            runs.append([x])
    return [
        _at(
            part,
            "local_index_orphan_entries",
            f"{len(run)} local entries, offsets {run[0][2].first_offset}-"
            f"{run[-1][2].last_offset}, belong to no committed segment",
            run[0],
        )
        for run in runs
    ]


def _at(part: PartitionDir, check: str, message: str, at: _Located, **kw: Any) -> Problem:
    """An error about the local entry ``at``: its file, its byte position there, its first offset."""
    file, position, entry = at
    return Problem(
        check,
        part.topic,
        part.partition,
        message,
        key=file,
        position=position,
        offset=entry.first_offset,
        **kw,
    )


def _gaps(
    part: PartitionDir,
    facts: PartitionFacts,
    manifests: list[SegmentManifest],
    local: list[RemoteLogIndexEntry],
) -> list[Problem]:
    """A problem per gap between consecutive served segments: an error with the evidence that a
    committed segment is missing, else a warning (normal after compaction)."""
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
                key=object_keys.manifest_key(part.topic, part.partition, b.base_offset, facts.key_id),
                offset=lo,
            )
        )
    return out


def recorded_gaps(part: PartitionDir, gaps: list[Gap], problems: list[Problem]) -> list[Problem]:
    """An error per gap the daemon recorded (docs/visibility.md, "Gaps"), and ``problems`` without
    the gap warnings those explain (a hole in the store that is a recorded gap is not "normal
    after compaction")."""
    kept = [
        p
        for p in problems
        if not (
            p.check == "gap"
            and p.severity == "warning"
            and p.topic == part.topic
            and p.partition == part.partition
            and any(g.first_offset <= (p.offset or -1) <= g.last_offset for g in gaps)
        )
    ]
    return kept + [
        Problem(
            "gap",
            part.topic,
            part.partition,
            f"{g.describe()}; noticed at {g.noticed_ms} ms since the epoch",
            offset=g.first_offset,
        )
        for g in gaps
    ]
