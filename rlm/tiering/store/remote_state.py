"""The remote state of one partition incarnation: the one place that queries it (docs/remote-state.md).

Manifests (what is committed), a segment's uploaded entries, the highest tiered offset and remote
log start, copy attempts and which of them are orphans, and which key root an incarnation uses.
The daemon (copier, recovery, GC, retention, identity, readers opening encrypted entries), the
Spark jobs (plan, verify, index) and ``rlm rewrap`` all ask here: no other module reads a manifest
or a lineage marker (tests/tiering/test_store_reader.py), so none can trust what the daemon refuses.

A :class:`RemoteState` is built from plain, picklable values — a backend, the topic, the partition
and the root's key id — so a Spark executor builds one from its :class:`~rlm.jobs.reading.plan.BackendSpec`
backend just as the daemon builds one from its partition context. Store calls are retried by the
backend itself (the one retry layer where it was opened, docs/storage.md): none here.
"""

from __future__ import annotations

import contextlib
import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from rlm.errors import FormatError, ObjectExistsError, ObjectNotFoundError, ProtectionError, RlmError
from rlm.formats.indexes.remote_index import RemoteDataIdentifier, RemoteLogIndexEntry, iter_entries
from rlm.formats.records import iter_batches
from rlm.storage.api import MAX_LIST_LIMIT, ObjectInfo, StorageBackend
from rlm.tiering.store import object_keys
from rlm.tiering.store.idle_note import IdleNote
from rlm.tiering.store.lineage import Chain, Lineage, LineageMarker, Link, resolve_chain
from rlm.tiering.store.manifest import ENTRIES_OBJECT, MAX_MANIFEST_BYTES, SegmentManifest
from rlm.tiering.store.store_protection import StoreProtection

__all__ = ["Orphan", "RemoteState", "Unreadable", "attempt_age_ms", "store_manifest_keys"]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Orphan:
    """A copy attempt no manifest references: its objects, their total size (bytes) and its age
    (ms, by :func:`attempt_age_ms`)."""

    topic: str
    partition: int
    base_offset: int
    attempt_id: str
    keys: tuple[str, ...]
    bytes: int
    age_ms: int


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A manifest or lineage marker of a listing that no reader may use, and why.

    ``at`` is what its key says: the manifest's base offset or the marker's leader epoch.
    ``error`` is what reading it raised: a :class:`FormatError` (it does not parse, is larger than
    rlm writes) or a :class:`ProtectionError` (moved or forged, its MAC key not in the ring:
    docs/protection.md §9); ``error.reason`` says it in one line.
    """

    kind: Literal["manifest", "lineage_marker"]
    key: str
    at: int
    error: FormatError | ProtectionError


def store_manifest_keys(
    backend: StorageBackend,
    topics: frozenset[str] | None,
    *,
    page_size: int = MAX_LIST_LIMIT,
) -> Iterator[tuple[str, str | None]]:
    """``(manifest key, etag)`` of every segment manifest in the store (every root, every
    incarnation, retired ones too: their data is as readable as any), in key order; only
    ``topics`` when given. One listing of the whole store: roots are the key's first component,
    and a topic's name is no safe listing prefix (``t-0`` is a prefix of ``t-0x-1``). Page by
    page, each page retried on its own (by the store): only manifest keys are kept, never the whole
    listing. ``rlm rewrap`` walks the store with it (its etags guard the overwrite)."""
    token: str | None = None
    while True:
        page = backend.list_page("", token=token, limit=page_size)
        for info in page.objects:
            root = object_keys.parse_root(info.key)
            if root is None or (topics is not None and root.topic not in topics):
                continue
            base = object_keys.parse_manifest_key(root.topic, root.partition, info.key, root.topic_id)
            if base is not None:
                yield info.key, info.etag
        if page.next_token is None:
            return
        token = page.next_token


def attempt_age_ms(attempt_id: str, infos: Sequence[ObjectInfo], now_ms: int) -> int:
    """How long ago an attempt last wrote (ms): from the latest of the creation time in its id and
    its objects' store timestamps; with neither readable, 0.

    The rule is the safe one: an attempt is as young as its newest object, so a slow copy still
    uploading — by any sidecar on the store, not only this process — is never deleted before the
    grace period has passed since its own last write; an attempt whose age cannot be read counts
    as just created (docs/remote-state.md).
    """
    stamps = [int(i.last_modified * 1000) for i in infos if i.last_modified is not None]
    created = object_keys.attempt_created_ms(attempt_id)
    if created is not None:
        stamps.append(created)
    return now_ms - max(stamps) if stamps else 0


@dataclass(frozen=True, slots=True)
class RemoteState:
    """Queries of one partition incarnation's root (``key_id`` None = the name-only root)."""

    backend: StorageBackend
    topic: str
    partition: int
    key_id: str | None = None
    #: Opens protected objects and entries (docs/protection.md); plaintext passes through.
    protection: StoreProtection = field(default_factory=StoreProtection)

    @classmethod
    def of_root(cls, backend: StorageBackend, key: str, protection: StoreProtection) -> RemoteState | None:
        """The state of the root ``key`` lies under (any key of it: a manifest, a data object),
        None when its first component is no root (docs/topic-identity.md)."""
        root = object_keys.parse_root(key)
        return None if root is None else cls(backend, root.topic, root.partition, root.topic_id, protection)

    @classmethod
    def of_data_key(
        cls, backend: StorageBackend, key: str, protection: StoreProtection
    ) -> tuple[RemoteState, object_keys.AttemptRef] | None:
        """The state of the root a segment data key (``…/data/<base>-<attempt>/<name>``) lies under
        and the attempt it belongs to, None for a key outside that layout: readers holding only an
        entry's object key find its segment's manifest with ``manifest_at(ref.base_offset)``."""
        state = cls.of_root(backend, key, protection)
        ref = (
            None
            if state is None
            else object_keys.parse_data_key(state.topic, state.partition, key, state.key_id)
        )
        return None if state is None or ref is None else (state, ref)

    def list_prefix(self, prefix: str) -> list[ObjectInfo]:
        """Every object under ``prefix`` (one listing)."""
        return list(self.backend.list(prefix))

    def list_partition(self) -> list[ObjectInfo]:
        """Every object under the incarnation's root (manifests, data and markers)."""
        return self.list_prefix(object_keys.partition_prefix(self.topic, self.partition, self.key_id))

    def is_empty(self) -> bool:
        """Whether the incarnation's root holds no object at all: one listing of one key."""
        prefix = object_keys.partition_prefix(self.topic, self.partition, self.key_id)
        return not self.backend.list_page(prefix, limit=1).objects

    def list_manifests_prefix(self) -> list[ObjectInfo]:
        """Every object under ``manifests/`` (manifests and lineage markers): one listing."""
        return self.list_prefix(object_keys.manifests_prefix(self.topic, self.partition, self.key_id))

    def manifest_keys(self, listing: Iterable[ObjectInfo]) -> list[tuple[int, str]]:
        """``(base offset, key)`` of the manifest keys in ``listing``, in key (= offset) order."""
        found = []
        for info in listing:
            base = object_keys.parse_manifest_key(self.topic, self.partition, info.key, self.key_id)
            if base is not None:
                found.append((base, info.key))
        return sorted(found)

    def read_manifest(self, key: str, *, trust_unauthenticated: bool = False) -> SegmentManifest:
        """One manifest, checked as docs/protection.md §9 says (FormatError names ``key`` when it
        does not parse); remembered, so readers of this process find its data key without a GET.
        ``trust_unauthenticated``: a manifest without a MAC is trusted once (``rlm rewrap
        --authenticate`` only, docs/security.md §5). The one mechanism: StoreProtection's."""
        return self.protection.read_manifest(
            self.backend.read, key, trust_unauthenticated=trust_unauthenticated
        )

    def manifest_at(self, base_offset: int) -> SegmentManifest:
        """The manifest of the segment at ``base_offset`` (ObjectNotFoundError when none)."""
        return self.read_manifest(
            object_keys.manifest_key(self.topic, self.partition, base_offset, self.key_id)
        )

    def list_manifests(self) -> list[SegmentManifest]:
        """Every committed segment, in offset order (a manifest that does not parse raises)."""
        return self.manifests_of(self.list_manifests_prefix())[0]

    def manifests_of(
        self, listing: Iterable[ObjectInfo], *, report: bool = False
    ) -> tuple[list[SegmentManifest], list[Unreadable]]:
        """The manifests of ``listing`` (of ``manifests/`` or the whole root), each read by
        :meth:`read_manifest`, in offset order, and the ones no reader may use. One that does not
        parse or may not be trusted raises — the daemon's and the readers' way — or, with
        ``report`` (``rlm verify``: report, don't raise), is left out and named with its error.
        One read per manifest; a manifest gone since the listing raises ObjectNotFoundError."""
        found, unreadable = self._read_each(
            "manifest", self.manifest_keys(listing), self.read_manifest, report
        )
        found.sort(key=lambda m: m.base_offset)
        return found, unreadable

    def lineages_of(
        self, listing: Iterable[ObjectInfo], *, report: bool = False
    ) -> tuple[list[Lineage], list[Unreadable]]:
        """The lineages the markers of ``listing`` record, in epoch order, as :meth:`manifests_of`
        reads manifests (``report``: a marker that does not parse is named, not raised)."""
        found, unreadable = self._read_each(
            "lineage_marker", self.lineage_marker_keys(listing), self.read_lineage_marker, report
        )
        return [m.lineage for m in found], unreadable

    def _read_each(
        self,
        kind: Literal["manifest", "lineage_marker"],
        at_keys: Iterable[tuple[int, str]],
        read: Callable[[str], _T],
        report: bool,
    ) -> tuple[list[_T], list[Unreadable]]:
        found: list[_T] = []
        unreadable: list[Unreadable] = []
        for at, key in at_keys:
            try:
                found.append(read(key))
            except (FormatError, ProtectionError) as err:
                if not report:
                    raise
                unreadable.append(Unreadable(kind, key, at, err))
        return found, unreadable

    def chain(self, lineage: Lineage | None = None) -> Chain:
        """What the store serves (docs/cluster.md): every manifest under the lineage markers (and
        ``lineage``, e.g. the local leader-epoch-checkpoint), overlaps and diverged offsets left out.
        One listing of ``manifests/`` plus one read per manifest and marker."""
        listing = self.list_manifests_prefix()
        manifests = self.manifests_of(listing)[0]
        lineages = self.lineages_of(listing)[0] + ([lineage] if lineage else [])
        return resolve_chain(manifests, lineages)

    def entries_blob(self, manifest: SegmentManifest) -> bytes:
        """The segment's uploaded entries object (decrypted when the segment is encrypted)."""
        return self.protection.read_object(self.backend, manifest, ENTRIES_OBJECT)

    def read_object(self, manifest: SegmentManifest, name: str) -> bytes:
        """``manifest.objects[name]`` whole, as plaintext (one GET)."""
        return self.protection.read_object(self.backend, manifest, name)

    def entry_bytes(self, manifest: SegmentManifest, entry: RemoteLogIndexEntry) -> bytes:
        """One entry's batches (one ranged read of its stored bytes, opened when transformed)."""
        start, end = entry.byte_range
        return self.protection.open_entry(manifest, entry, self.read_range(manifest.log.key, start, end))

    def segment_head(self, manifest: SegmentManifest, length: int) -> bytes:
        """Up to ``length`` plaintext bytes from the start of the segment: one ranged read, or for a
        protected segment its entries object and its first entry (two reads)."""
        if manifest.protection is None:
            return self.read_range(manifest.log.key, 0, min(length, manifest.size_bytes))
        entries = self.segment_entries(manifest)
        return self.entry_bytes(manifest, entries[0])[:length] if entries else b""

    def segment_entries(self, manifest: SegmentManifest) -> list[RemoteLogIndexEntry]:
        """The segment's own entries, as uploaded with it, CRC-verified (FormatError names the key)."""
        data = self.entries_blob(manifest)
        try:
            return [d.entry for d in iter_entries(data)]
        except FormatError as err:
            raise err.in_file(manifest.objects[ENTRIES_OBJECT].key) from err

    def link_entries(self, link: Link) -> list[RemoteLogIndexEntry]:
        """The entries of ``link``'s offsets (docs/cluster.md): the segment's own entries, the ones
        at its clipped ends re-cut at a batch boundary (one ranged read of the data each)."""
        entries = self.segment_entries(link.manifest)
        if link.whole:
            return entries
        out: list[RemoteLogIndexEntry] = []
        for entry in entries:
            if entry.last_offset < link.first_offset or entry.first_offset > link.last_offset:
                continue
            if link.first_offset <= entry.first_offset and entry.last_offset <= link.last_offset:
                out.append(entry)
            else:
                out.extend(self._clip_entry(link, entry))
        return out

    def _clip_entry(self, link: Link, entry: RemoteLogIndexEntry) -> list[RemoteLogIndexEntry]:
        """The part of ``entry`` inside ``link``: its whole batches there, as one entry."""
        key = link.manifest.log.key
        pos = entry.rdi.position
        if entry.transformed:
            # A stored (compressed/encrypted) entry is one unit: its batches cannot be addressed
            # as a byte range of the object (docs/protection.md, "Limits").
            raise RlmError(
                f"entry {entry.first_offset}-{entry.last_offset} is stored transformed and "
                f"cannot be clipped to the served range {link.first_offset}-{link.last_offset}",
                file=key,
                position=pos,
            )
        data = self.read_range(key, pos, pos + entry.data_length)
        kept = []
        for batch in iter_batches(data):
            inside = link.first_offset <= batch.base_offset and batch.last_offset <= link.last_offset
            outside = batch.last_offset < link.first_offset or batch.base_offset > link.last_offset
            if not (inside or outside):
                raise RlmError(
                    f"batch {batch.base_offset}-{batch.last_offset} straddles the served range "
                    f"{link.first_offset}-{link.last_offset} of the segment: the replicas' "
                    "batches differ (docs/cluster.md)",
                    file=key,
                    position=pos + batch.position,
                )
            if inside:
                kept.append(batch)
        if not kept:
            return []
        first, last = kept[0], kept[-1]
        return [
            RemoteLogIndexEntry(
                first_offset=first.base_offset,
                last_offset=last.last_offset,
                first_timestamp=first.base_timestamp if first.magic >= 2 else -1,
                last_timestamp=max(b.max_timestamp for b in kept),
                data_length=last.position + last.size - first.position,
                rdi=RemoteDataIdentifier(entry.rdi.url, pos + first.position),
            )
        ]

    # -- lineage markers (docs/cluster.md) -------------------------------------------------------

    def lineage_marker_keys(self, listing: Iterable[ObjectInfo]) -> list[tuple[int, str]]:
        """``(epoch, key)`` of the lineage markers in a listing of the manifests prefix."""
        found = []
        for info in listing:
            epoch = object_keys.parse_lineage_marker_key(self.topic, self.partition, info.key, self.key_id)
            if epoch is not None:
                found.append((epoch, info.key))
        return sorted(found)

    def read_lineage_marker(self, key: str) -> LineageMarker:
        """One lineage marker (FormatError names ``key`` when it does not parse or is too large)."""
        return LineageMarker.from_json(
            self.backend.read_at_most(key, MAX_MANIFEST_BYTES, what="lineage marker"), key=key
        )

    def create_lineage_marker(self, marker: LineageMarker) -> LineageMarker:
        """Write ``marker`` unless one for its epoch exists; return the one in the store."""
        key = object_keys.lineage_marker_key(self.topic, self.partition, marker.epoch, self.key_id)
        try:
            self.backend.put(key, marker.to_json(), if_absent=True)
        except ObjectExistsError:
            return self.read_lineage_marker(key)
        return marker

    def log_start_marker(self, listing: Iterable[ObjectInfo]) -> int:
        """The highest log start a marker in a listing of the manifests prefix names (rlm's
        DeleteRecords, docs/formats.md §6.8); -1 when none. The key alone says it: no read."""
        found = (
            object_keys.parse_log_start_marker_key(self.topic, self.partition, info.key, self.key_id)
            for info in listing
        )
        return max((o for o in found if o is not None), default=-1)

    def create_log_start_marker(self, offset: int, doc: dict[str, object]) -> None:
        """Write the marker raising the log start to ``offset`` (create only if absent: one
        already there says the same)."""
        key = object_keys.log_start_marker_key(self.topic, self.partition, offset, self.key_id)
        body = json.dumps({"log_start_offset": offset, **doc}, sort_keys=True).encode()
        with contextlib.suppress(ObjectExistsError):  # one already there says the same
            self.backend.put(key, body, if_absent=True)

    def read_idle_note(self, key: str) -> IdleNote:
        """One idle note (FormatError names ``key`` when it does not parse or is too large)."""
        return IdleNote.from_json(self.backend.read_at_most(key, MAX_MANIFEST_BYTES, what="note"), key=key)

    def write_idle_note(self, note: IdleNote) -> None:
        self.backend.put(object_keys.idle_note_key(self.topic, self.partition, self.key_id), note.to_json())

    def list_id_roots(self) -> list[ObjectInfo]:
        """Every object of every topic-id root of this partition (one listing)."""
        return self.list_prefix(object_keys.id_roots_prefix(self.topic, self.partition))

    def other_id_roots(
        self, exclude: str | None, listing: Iterable[ObjectInfo] | None = None
    ) -> dict[str, list[ObjectInfo]]:
        """The objects of every topic-id root of this partition but ``exclude``'s, by topic id
        (the other incarnations, docs/topic-identity.md), from ``listing`` (default: one
        :meth:`list_id_roots`)."""
        roots: dict[str, list[ObjectInfo]] = defaultdict(list)
        for info in self.list_id_roots() if listing is None else listing:
            root = object_keys.parse_root(info.key)
            if root is not None and root.topic_id is not None and root.topic_id != exclude:
                roots[root.topic_id].append(info)
        return roots

    def attempts(self, listing: Iterable[ObjectInfo]) -> dict[object_keys.AttemptRef, list[ObjectInfo]]:
        """The data objects of ``listing`` grouped by copy attempt."""
        groups: dict[object_keys.AttemptRef, list[ObjectInfo]] = defaultdict(list)
        for info in listing:
            ref = object_keys.parse_data_key(self.topic, self.partition, info.key, self.key_id)
            if ref is not None:
                groups[ref].append(info)
        return groups

    def unreferenced(
        self,
        attempts: dict[object_keys.AttemptRef, list[ObjectInfo]],
        manifests: Iterable[SegmentManifest],
        now_ms: int,
        in_flight: Iterable[str] = (),
    ) -> list[Orphan]:
        """The attempts no manifest names and none in ``in_flight`` (attempt ids), whatever their
        age, ordered by base offset then attempt id."""
        live = {(m.base_offset, m.attempt_id) for m in manifests}
        busy = set(in_flight)
        out = []
        for ref, infos in sorted(attempts.items(), key=lambda kv: (kv[0].base_offset, kv[0].attempt_id)):
            if (ref.base_offset, ref.attempt_id) in live or ref.attempt_id in busy:
                continue
            out.append(
                Orphan(
                    self.topic,
                    self.partition,
                    ref.base_offset,
                    ref.attempt_id,
                    tuple(i.key for i in infos),
                    sum(i.size for i in infos),
                    attempt_age_ms(ref.attempt_id, infos, now_ms),
                )
            )
        return out

    def orphans(
        self,
        now_ms: int,
        grace_ms: int,
        in_flight: Iterable[str] = (),
        manifests: Callable[[], Iterable[SegmentManifest]] | None = None,
        listing: Iterable[ObjectInfo] | None = None,
    ) -> list[Orphan]:
        """Unreferenced attempts at least ``grace_ms`` old (see :func:`attempt_age_ms`).
        ``manifests`` lists the committed ones (default :meth:`list_manifests`; the daemon's
        reuses what it read before, docs/remote-state.md); ``listing``, a listing that holds
        the root's data objects, taken now (default: one listing of them)."""
        if listing is None:
            listing = self.list_prefix(object_keys.data_prefix(self.topic, self.partition, self.key_id))
        attempts = self.attempts(listing)
        # Manifests are listed *after* the data: an attempt that commits in between is then seen live.
        found = self.unreferenced(attempts, (manifests or self.list_manifests)(), now_ms, in_flight)
        return [o for o in found if o.age_ms >= grace_ms]

    def delete_attempt(self, base_offset: int, attempt_id: str) -> list[str]:
        """Delete every object of one attempt (idempotent); return the keys deleted."""
        prefix = object_keys.attempt_prefix(self.topic, self.partition, base_offset, attempt_id, self.key_id)
        found = [o.key for o in self.list_prefix(prefix)]
        for key in found:
            self.delete(key)
        return found

    def delete_manifest(self, base_offset: int) -> None:
        """Uncommit the segment at ``base_offset`` (idempotent): readers stop seeing it."""
        self.delete(object_keys.manifest_key(self.topic, self.partition, base_offset, self.key_id))

    def delete(self, key: str) -> None:
        self.backend.delete(key)

    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of one object (one ranged read)."""
        return self.backend.read(key, start, end)

    # -- markers: small JSON objects in the root saying who owns it (docs/topic-identity.md) ----

    def marker_key(self, name: str) -> str:
        return object_keys.marker_key(self.topic, self.partition, name, self.key_id)

    def has_marker(self, name: str) -> bool:
        return self.backend.exists(self.marker_key(name))

    def read_marker(self, name: str) -> dict[str, Any] | None:
        """The marker object ``name`` of this root, None when absent; malformed → FormatError."""
        key = self.marker_key(name)
        try:
            doc = json.loads(self.backend.read_at_most(key, MAX_MANIFEST_BYTES, what="marker object"))
        except ObjectNotFoundError:
            return None
        except ValueError as err:
            raise FormatError(f"{key}: malformed marker object: {err}") from None
        except RecursionError:
            raise FormatError(f"{key}: malformed marker object: JSON nested too deeply") from None
        if not isinstance(doc, dict):
            raise FormatError(f"{key}: malformed marker object: not a JSON object")
        return doc

    def create_marker(self, name: str, doc: dict[str, Any]) -> dict[str, Any]:
        """Create the marker unless it exists (conditional create); return the one in the store."""
        data = json.dumps(doc, sort_keys=True).encode()
        try:
            self.backend.put(self.marker_key(name), data, if_absent=True)
        except ObjectExistsError:
            return self.read_marker(name) or doc
        return doc
