"""One independent checker of a tiered store's invariants (docs/architecture.md §5, docs/formats.md
§5, §6), shared by the acceptance tests and the soak bench.

It reads the store through the backend contract and the local index files through the format
readers only (never through the tiering engine), so an engine bug cannot hide itself. Failures are
``AssertionError`` naming the partition, key or file.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlm.formats import naming
from rlm.formats.indexes.remote_index import RemoteLogIndexEntry, iter_entries
from rlm.formats.indexes.remote_index_derived import derive_remote_indexes
from rlm.formats.records import iter_batches
from rlm.logdir.discovery import (
    EligibilityPolicy,
    PartitionDir,
    SegmentFiles,
    discover_partitions,
    eligible_segments,
    list_segments,
    partition_state,
    read_checkpoints,
)
from rlm.storage.api import StorageBackend
from rlm.tiering.store import object_keys

__all__ = ["PartitionCheck", "StoreCheck", "assert_manifests_complete", "check_store", "local_batches"]


@dataclass
class PartitionCheck:
    """What the checker saw of one partition: its manifests (parsed JSON), the entries of its local
    index sets, the base offsets of its eligible segments and of its local sets."""

    name: str
    manifests: list[dict[str, Any]] = field(default_factory=list)
    local_entries: list[RemoteLogIndexEntry] = field(default_factory=list)
    eligible_bases: list[int] = field(default_factory=list)
    set_bases: list[int] = field(default_factory=list)


@dataclass
class StoreCheck:
    """Every partition's :class:`PartitionCheck`, and the data keys no manifest names."""

    partitions: dict[str, PartitionCheck]
    unreferenced: set[str]  # keys under */data/ that no manifest names

    def remote_bases(self, name: str) -> list[int]:
        return [m["base_offset"] for m in self.partitions[name].manifests]


@dataclass(frozen=True)
class _Options:
    backend: StorageBackend
    url_backend: StorageBackend
    eligibility: EligibilityPolicy
    complete: bool
    deep: bool
    local_may_lag: bool
    not_tiered: frozenset[str]


def local_batches(segments: list[SegmentFiles], first: int, last: int) -> bytes | None:
    """The bytes of the local batches with base offsets in ``[first, last]``, or None unless they
    end exactly at ``last`` and none of the range was deleted locally."""
    out, covered_from, end = bytearray(), None, -1
    for seg in segments:
        data = seg.log.read_bytes()
        for b in iter_batches(data):
            if first <= b.base_offset <= last:
                covered_from = b.base_offset if covered_from is None else covered_from
                out += data[b.position : b.end_position]
                end = b.last_offset
    if covered_from is None or end != last or segments[0].base_offset > first:
        return None
    return bytes(out)


def check_store(
    log_dirs: list[Path],
    backend: StorageBackend,
    *,
    eligibility: EligibilityPolicy = "high-watermark",
    complete: bool = True,
    deep: bool = False,
    local_may_lag: bool = False,
    url_backend: StorageBackend | None = None,
    not_tiered: frozenset[str] = frozenset(),
) -> StoreCheck:
    """Assert every invariant; ``complete``: every eligible segment must be remote; ``deep``: compare
    uploaded bytes with the local .log and decode every entry's byte range; ``local_may_lag``: the
    local index may be a strict prefix of the committed entries (only right after a failed pass);
    ``url_backend``: the backend that wrote the RDIs (a wrapper names objects its own way);
    ``not_tiered``: topics the topic policy excludes (nothing of theirs may be remote).

    Retention may have removed a prefix of the remote segments; the local index must then start at
    the first remaining manifest.
    """
    opts = _Options(backend, url_backend or backend, eligibility, complete, deep, local_may_lag, not_tiered)
    referenced: set[str] = set()
    results = {part.name: _check_partition(part, opts, referenced) for part in discover_partitions(log_dirs)}
    unreferenced = {
        info.key for info in backend.list("") if "/data/" in info.key and info.key not in referenced
    }
    return StoreCheck(results, unreferenced)


def _check_partition(part: PartitionDir, opts: _Options, referenced: set[str]) -> PartitionCheck:
    pc = PartitionCheck(part.name)
    segments = list_segments(part)
    state = partition_state(part, read_checkpoints(part.log_dir))
    eligible = eligible_segments(segments, state, opts.eligibility)
    if naming.is_internal_topic(part.topic) or part.topic in opts.not_tiered:
        eligible = []  # Kafka's internal logs are never tiered: nothing may be remote
    pc.eligible_bases = [s.base_offset for s in eligible]
    remote_entries = _check_remote(pc, part, segments, opts, referenced)
    per_set = _check_local_sets(pc, part)
    _check_local_matches_remote(pc, per_set, remote_entries, opts.local_may_lag)
    if opts.complete:
        _check_complete(pc, eligible)
    return pc


def _check_remote(
    pc: PartitionCheck, part: PartitionDir, segments: list[SegmentFiles], opts: _Options, referenced: set[str]
) -> list[RemoteLogIndexEntry]:
    """Manifests parse, name their own base, do not overlap, and every object they name exists."""
    backend = opts.backend
    remote_entries: list[RemoteLogIndexEntry] = []
    previous_last = -1
    # The incarnation's root: name-only, or <name>=<topic id>/ (docs/topic-identity.md).
    root = object_keys.root(part.topic, part.partition, part.topic_id)
    for info in backend.list(f"{root}manifests/"):
        key = info.key
        if object_keys.parse_manifest_key(part.topic, part.partition, key, part.topic_id) is None:
            continue  # a lineage or log start marker, the leader's idle note (docs/formats.md §6)
        doc = json.loads(backend.read(key))
        assert key == f"{root}manifests/{doc['base_offset']:020d}.json", key
        assert doc["format_version"] == 1
        assert doc["base_offset"] <= doc["last_offset"]
        assert doc["base_offset"] > previous_last, f"{key}: overlaps the previous segment"
        previous_last = doc["last_offset"]
        for obj in doc["objects"].values():
            assert backend.head(obj["key"]).size == obj["size"], f"{key}: object {obj['key']}"
            referenced.add(obj["key"])
        pc.manifests.append(doc)
        remote_entries += _check_entries(key, doc, segments, opts)
    return remote_entries


def _check_entries(
    key: str, doc: dict[str, Any], segments: list[SegmentFiles], opts: _Options
) -> list[RemoteLogIndexEntry]:
    """One manifest's entries cover exactly the segment's bytes, back to back, and resolve to its
    log; ``deep``: its bytes are the local log's and every entry's range decodes to its offsets."""
    backend = opts.backend
    blob = backend.read(doc["objects"]["segment.remotelogindex"]["key"])
    entries = [d.entry for d in iter_entries(blob)]
    assert len(entries) == doc["index_entries"]
    log_key = doc["objects"]["log"]["key"]
    position = 0
    for e in entries:
        assert opts.url_backend.key_for_url(e.rdi.url) == log_key
        assert e.rdi.position == position
        position += e.data_length
    assert position == doc["size_bytes"] == doc["objects"]["log"]["size"]
    assert entries[0].first_offset >= doc["base_offset"]
    assert entries[-1].last_offset == doc["last_offset"]
    if opts.deep:
        # The local log's batches of the same offsets (wherever this replica rolled).
        local = local_batches(segments, doc["base_offset"], doc["last_offset"])
        if local is not None:
            assert backend.read(log_key) == local, f"{key}: bytes differ"
        for e in entries:
            start, end = e.byte_range
            batches = list(iter_batches(backend.read(log_key, start, end)))
            assert batches[0].base_offset == e.first_offset
            assert batches[-1].last_offset == e.last_offset
            assert batches[-1].position + batches[-1].size == e.data_length
            assert max(b.max_timestamp for b in batches) == e.last_timestamp
    return entries


def _check_local_sets(pc: PartitionCheck, part: PartitionDir) -> list[list[RemoteLogIndexEntry]]:
    """Every local set CRC-valid, named after its first entry, its derived files matching."""
    per_set: list[list[RemoteLogIndexEntry]] = []
    for path in sorted(part.path.glob("*" + naming.REMOTE_LOG_INDEX)):
        base = naming.parse_base_offset(path.name)
        buf = path.read_bytes()
        decoded = list(iter_entries(buf))  # CRC-verified, strict
        assert decoded, f"{path}: empty set left behind"
        assert decoded[0].entry.first_offset == base, path
        offset_bytes, time_bytes = derive_remote_indexes(buf, base)
        assert path.with_suffix(naming.REMOTE_OFFSET_INDEX).read_bytes() == offset_bytes, path
        assert path.with_suffix(naming.REMOTE_TIME_INDEX).read_bytes() == time_bytes, path
        pc.set_bases.append(base)
        per_set.append([d.entry for d in decoded])
        pc.local_entries.extend(d.entry for d in decoded)
    return per_set


def _check_local_matches_remote(
    pc: PartitionCheck,
    per_set: list[list[RemoteLogIndexEntry]],
    remote_entries: list[RemoteLogIndexEntry],
    local_may_lag: bool,
) -> None:
    """The local index holds exactly the committed segments, each once, in order."""
    name = pc.name
    # Retention: entries of deleted segments may remain only in a set that still holds live
    # entries; a set entirely below the remote log start must be gone.
    remote_start = pc.manifests[0]["base_offset"] if pc.manifests else None
    for entries_of_set in per_set:
        assert remote_start is not None and entries_of_set[-1].last_offset >= remote_start, (
            f"{name}: a local set lies entirely below the remote log start {remote_start}"
        )
    live = [e for e in pc.local_entries if remote_start is not None and e.last_offset >= remote_start]
    # Nothing lost, nothing twice.
    if local_may_lag:
        assert live == remote_entries[: len(live)], f"{name}: local index is not a committed prefix"
    else:
        assert live == remote_entries, f"{name}: local index != committed manifests"
    firsts = [e.first_offset for e in pc.local_entries]
    assert firsts == sorted(set(firsts))
    for a, b in itertools.pairwise(pc.local_entries):
        assert a.last_offset < b.first_offset, f"{name}: entries overlap"


def _check_complete(pc: PartitionCheck, eligible: list[SegmentFiles]) -> None:
    """Every eligible segment (not yet removed by retention) is remote, and nothing else is."""
    remote_bases = {m["base_offset"] for m in pc.manifests}
    first_remote = min(remote_bases, default=None)
    for seg in eligible:
        if seg.size == 0 or (first_remote is not None and seg.base_offset < first_remote):
            continue
        assert seg.base_offset in remote_bases, f"{pc.name}: eligible {seg.base_offset} not remote"
    assert remote_bases <= set(pc.eligible_bases), f"{pc.name}: a non-eligible segment is remote"


def assert_manifests_complete(backend: StorageBackend) -> set[str]:
    """What a reader may see right after a crash: every manifest parses and its objects exist.
    Returns the data keys no manifest references."""
    referenced: set[str] = set()
    for info in backend.list(""):
        root = object_keys.parse_root(info.key)
        if (
            root is not None
            and object_keys.parse_manifest_key(root.topic, root.partition, info.key, root.topic_id)
            is not None
        ):
            doc = json.loads(backend.read(info.key))
            for obj in doc["objects"].values():
                assert backend.head(obj["key"]).size == obj["size"], f"{info.key}: {obj['key']} missing"
                referenced.add(obj["key"])
    return {i.key for i in backend.list("") if "/data/" in i.key and i.key not in referenced}
