"""``verify`` stage 1, one executor task per partition: what the store holds for one partition
incarnation, checked from one listing of its root (docs/cli.md ``rlm verify``).

Manifests parse and name their own key; every object a manifest names exists under the manifest's
attempt with the recorded size; the uploaded entries object is CRC-valid, covers the log object
back to back and agrees with the manifest. Only what the store serves is checked: the chain of
manifests under the lineage markers (docs/cluster.md); what the chain leaves out is a warning.
Data attempts no manifest references are orphans, by the age rule of docs/remote-state.md. Every
store query goes through :class:`~rlm.tiering.store.remote_state.RemoteState`; the task's arguments are
plain picklable data (:class:`~rlm.jobs.reading.plan.BackendSpec`, topic, partition, key id).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rlm.errors import FormatError, ProtectionError, TamperedObjectError
from rlm.formats.indexes.remote_index import iter_entries
from rlm.jobs.checks.problem import Problem
from rlm.jobs.reading import BackendSpec
from rlm.storage.api import ObjectInfo, StorageBackend
from rlm.tiering.store import (
    ENTRIES_OBJECT,
    Chain,
    Orphan,
    RemoteState,
    SegmentManifest,
    Unreadable,
    object_keys,
    resolve_chain,
)

__all__ = ["PartitionFacts", "scrub_partition"]


@dataclass
class PartitionFacts:
    """What stage 1 found for one partition, shipped back to the driver (plain, picklable data)."""

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


def _unreadable_problem(topic: str, partition: int, u: Unreadable) -> Problem:
    """The report line of a manifest or lineage marker RemoteState found no reader may use
    (docs/protection.md §9): unparsable, moved or forged, or its MAC key not in the ring."""
    if u.kind == "lineage_marker":
        return Problem("lineage_marker", topic, partition, u.error.reason, key=u.key, offset=u.at)
    if isinstance(u.error, FormatError):
        check = "manifest_unreadable"
    else:
        check = "manifest_key" if isinstance(u.error, TamperedObjectError) else "protection"
    return Problem(check, topic, partition, u.error.reason, base_offset=u.at, key=u.key)


def scrub_partition(
    spec: BackendSpec, topic: str, partition: int, grace_ms: int, now_ms: int, key_id: str | None = None
) -> PartitionFacts:
    """Stage 1 of ``rlm verify`` for one partition, a scrub of its store root (runs in an
    executor): every manifest, marker, object and orphan attempt checked; ``key_id``: its incarnation's root
    (docs/topic-identity.md; None = the name-only root)."""
    remote = RemoteState(spec.create(), topic, partition, key_id, protection=spec.protection())
    problems: list[Problem] = []
    listing: dict[str, ObjectInfo] = {i.key: i for i in remote.list_partition()}
    # What a manifest says is what RemoteState reads for the daemon too; its report mode names
    # the ones no reader may use instead of raising (docs/remote-state.md).
    manifests, unreadable = remote.manifests_of(listing.values(), report=True)
    problems += [_unreadable_problem(topic, partition, u) for u in unreadable]
    # A manifest names its attempt, readable or not: that attempt is not called an orphan.
    untrusted = {u.at for u in unreadable}
    chain = _resolve(remote, listing.values(), manifests, problems)  # only what is served is checked
    entries: dict[int, bytes] = {}
    objects = 0
    for m in chain.manifests:
        objects += len(m.objects)
        problems += _check_objects(remote, m, listing)
        blob = _valid_entries_blob(remote, m, listing, problems)
        if blob is not None:
            entries[m.base_offset] = blob
    clipped = {}
    for link in chain.links:
        if not link.whole and link.manifest.base_offset in entries:
            clipped[link.manifest.base_offset] = b"".join(e.encode() for e in remote.link_entries(link))
    attempts = {r: i for r, i in remote.attempts(listing.values()).items() if r.base_offset not in untrusted}
    orphans = remote.unreferenced(attempts, manifests, now_ms)
    problems += [_orphan_problem(o, grace_ms, key_id) for o in orphans]
    return PartitionFacts(
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


def _check_objects(remote: RemoteState, m: SegmentManifest, listing: dict[str, ObjectInfo]) -> list[Problem]:
    """Every object ``m`` names lies under its own attempt and is listed with the recorded size."""
    topic, partition = remote.topic, remote.partition
    problems: list[Problem] = []
    for name, stored in sorted(m.objects.items()):
        ref = object_keys.parse_data_key(topic, partition, stored.key, remote.key_id)
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
    return problems


def _valid_entries_blob(
    remote: RemoteState, m: SegmentManifest, listing: dict[str, ObjectInfo], problems: list[Problem]
) -> bytes | None:
    """The segment's uploaded entries object when it exists, opens and agrees with ``m``; else
    None, with a problem appended saying why (nothing when the object is missing: reported as
    ``object_missing``)."""
    topic, partition = remote.topic, remote.partition
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
        return None
    if entries_obj.key not in listing:
        return None
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
        return None
    found = _check_entries(topic, partition, remote.backend, m, blob, entries_obj.key)
    problems += found
    return None if found else blob


def _resolve(
    remote: RemoteState,
    listing: Iterable[ObjectInfo],
    manifests: list[SegmentManifest],
    problems: list[Problem],
) -> Chain:
    """The store's chain under its lineage markers (docs/cluster.md). What it leaves out is a
    warning: the partition's leader uncommits such segments on its next pass."""
    topic, partition = remote.topic, remote.partition
    lineages, unreadable = remote.lineages_of(listing, report=True)
    problems += [_unreadable_problem(topic, partition, u) for u in unreadable]
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
        key=object_keys.attempt_prefix(o.topic, o.partition, o.base_offset, o.attempt_id, key_id),
    )
