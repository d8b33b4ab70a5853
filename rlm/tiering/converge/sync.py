"""Learn a partition's remote state from the store and keep the local index equal to it (docs/cluster.md).

Every sidecar beside a replica of a partition answers for everything any sidecar tiered, so each
one syncs from the store: one listing of the partition's ``manifests/`` prefix per call, a read of
each manifest or lineage marker not seen before (manifests are immutable; a key deleted and
created again is told apart by its listing's size/etag/time),
:func:`~rlm.tiering.store.lineage.resolve_chain`, then the local ``.remotelogindex`` family is
brought to that chain:

* links already held locally are kept — after a restart this is checked entry by entry (each local
  entry's object must be its link's segment object and the link's last offset must end it);
* the first link that differs and everything after it are rebuilt from their segments' uploaded
  entries (clipped to the link's offsets), so an overlap or divergence found later rewinds the local
  index exactly to where it stops matching;
* sets wholly below the remote log start are dropped, as retention does.

The leader also records what its own ``leader-epoch-checkpoint`` says: when that lineage cuts tiered
data no marker cuts yet, it writes a :class:`~rlm.tiering.store.lineage.LineageMarker` (create only if
absent), so every sidecar stops serving the diverged offsets, and it uncommits (deletes the manifests
of) segments that are wholly diverged or wholly superseded — their data objects become orphans for GC,
after its grace, so a sidecar still reading them is not cut off mid-read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from rlm.errors import FormatError, ObjectNotFoundError, RlmError
from rlm.formats.checkpoint import parse_leader_epoch_checkpoint
from rlm.formats.indexes.remote_index import RemoteLogIndexEntry
from rlm.logdir.discovery import LEADER_EPOCH_CHECKPOINT
from rlm.storage.api import ObjectInfo, StorageBackend
from rlm.tiering.local import PartitionContext, crash_point, of_context
from rlm.tiering.store import (
    Chain,
    IdleNote,
    Lineage,
    LineageMarker,
    Link,
    RemoteState,
    SegmentManifest,
    Stamp,
    StoreView,
    lineage_of,
    object_keys,
    replica_diverged,
    resolve_chain,
)

__all__ = [
    "SyncResult",
    "index_links",
    "lineage_in",
    "local_divergence",
    "local_lineage",
    "note_committed",
    "note_deleted",
    "note_divergence",
    "note_log_start",
    "reconcile",
    "refresh",
    "resolve",
    "settle",
    "sync_partition",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


def _stamp(info: ObjectInfo) -> Stamp:
    """Which version of an object a listing shows: its size and ETag where the store gives one (on
    S3 a hash of the content, answered alike by a create and a listing), else its size and mtime."""
    return (info.size, info.etag, None) if info.etag else (info.size, None, info.last_modified)


@dataclass(frozen=True, slots=True)
class SyncResult:
    chain: Chain
    new_manifests: int  # manifests read this time
    rebuilt_from: int | None  # first offset re-indexed after a rewind, None when only appended/kept
    appended_links: int
    marker_written: LineageMarker | None = None
    uncommitted: tuple[int, ...] = ()  # base offsets whose manifests the leader deleted
    local_diverged_from: int | None = None  # where this replica's own log left the lineage


def local_lineage(ctx: PartitionContext) -> Lineage | None:
    """The local ``leader-epoch-checkpoint`` as a lineage; None when absent or unreadable."""
    return lineage_in(ctx.part.path)


def lineage_in(partition_path: Path) -> Lineage | None:
    """The ``leader-epoch-checkpoint`` of the partition directory ``partition_path`` as a
    lineage; None when absent or unreadable (readers resolve the store's chain with it too)."""
    path = partition_path / LEADER_EPOCH_CHECKPOINT
    try:
        return lineage_of(parse_leader_epoch_checkpoint(path.read_text()).entries) or None
    except FileNotFoundError:
        return None
    except (OSError, FormatError, UnicodeDecodeError) as err:
        log.warning("%s: ignoring unreadable %s: %s", partition_path.name, path, err)
        return None


def _reuse(
    keys_: Iterable[str],
    infos: dict[str, ObjectInfo],
    known: dict[str, tuple[Stamp, T]],
    read: Callable[[str], T],
) -> tuple[dict[str, tuple[Stamp, T]], int]:
    """``key -> (stamp, parsed)`` for ``keys_``: what ``known`` holds under the same stamp, the rest
    read now; and how many were read."""
    out: dict[str, tuple[Stamp, T]] = {}
    fresh = 0
    for key in keys_:
        stamp = _stamp(infos[key])
        held = known.get(key)
        if held is None or held[0] != stamp:
            held = (stamp, read(key))
            fresh += 1
        out[key] = held
    return out, fresh


def _refresh(remote: RemoteState, view: StoreView, listing: Sequence[ObjectInfo]) -> int:
    """Update ``view`` from a listing of the manifests prefix; return how many manifests were read."""
    infos = {i.key: i for i in listing}
    view.manifests, read = _reuse(
        (k for _, k in remote.manifest_keys(listing)), infos, view.manifests, remote.read_manifest
    )
    view.markers, _ = _reuse(
        (k for _, k in remote.lineage_marker_keys(listing)), infos, view.markers, remote.read_lineage_marker
    )
    view.log_start = max(view.log_start, remote.log_start_marker(listing))
    note = infos.get(object_keys.idle_note_key(remote.topic, remote.partition, remote.key_id))
    view.idle_note = None if note is None else _idle_note(remote, note, view.idle_note)
    return read


def _idle_note(
    remote: RemoteState, info: ObjectInfo, known: tuple[Stamp, IdleNote | None] | None
) -> tuple[Stamp, IdleNote | None]:
    """The idle note a listing shows, read when its stamp is new. One that does not parse is
    named once (per stamp) and counts as none: it is advisory (docs/cluster.md)."""
    stamp = _stamp(info)
    if known is not None and known[0] == stamp:
        return known
    try:
        return stamp, remote.read_idle_note(info.key)
    except ObjectNotFoundError:  # replaced since the listing: the next listing reads the new one
        return stamp, None
    except FormatError as err:
        log.warning("%s (ignored: followers list the partition every pass)", err)
        return stamp, None


def _lineages(view: StoreView) -> list[Lineage]:
    return [m.lineage for _s, m in sorted(view.markers.values(), key=lambda sm: sm[1].epoch)]


def _names(backend: StorageBackend, url: str, key: str) -> bool:
    """Whether an entry's object URL names ``key``. Compared as keys, through the store's own
    mapping: a URL may encode the key (a local file URL percent-encodes the ``=`` of a topic-id
    root), so its text need not end with the key. A URL of another store names none of its keys."""
    try:
        return backend.key_for_url(url) == key
    except ValueError:
        return False


def _held_prefix(ctx: PartitionContext, links: Sequence[Link]) -> int:
    """How many leading links the local index holds exactly (read from the local entry files)."""
    entries: list[RemoteLogIndexEntry] = [d.entry for s in ctx.family.sets for d in s.entries()]
    backend = ctx.shared.backend
    start = links[0].first_offset if links else 0
    i = 0
    while i < len(entries) and entries[i].last_offset < start:
        i += 1  # sets partly below the remote log start (retention drops whole sets only)
    held = 0
    for link in links:
        key, end = link.manifest.log.key, None
        while i < len(entries) and entries[i].first_offset <= link.last_offset:
            e = entries[i]
            if not _names(backend, e.rdi.url, key) or e.first_offset < link.first_offset:
                return held
            end = e.last_offset
            i += 1
        if end != link.last_offset:
            return held
        held += 1
    return held


def reconcile(
    ctx: PartitionContext, view: StoreView, chain: Chain, *, staged: bool = False
) -> tuple[int | None, int]:
    """Bring the local index to ``chain``; return (first offset re-indexed after a rewind or None,
    links appended). ``staged`` (recovery's rebuild): the changed sets are published together at
    the end (:meth:`RemoteIndexFamily.staged`), never one link at a time."""
    links = chain.links
    signatures = tuple(link.signature for link in links)
    if view.held is None:
        held = _held_prefix(ctx, links)
    else:
        old = view.held
        try:
            at = old.index(signatures[0]) if signatures else len(old)
        except ValueError:
            at = len(old)
        held = 0
        while held < len(signatures) and at + held < len(old) and old[at + held] == signatures[held]:
            held += 1
    keep_last = links[held - 1].last_offset if held else (links[0].first_offset - 1 if links else -1)
    rewound = None
    remote = of_context(ctx)
    with ctx.family.staged() if staged else nullcontext():
        if ctx.family.last_offset > keep_last:
            dropped = ctx.family.truncate_after(keep_last)
            if dropped or held < len(links):
                rewound = keep_last + 1
        index_links(ctx, chain, (remote.link_entries(link) for link in links[held:]))
    view.held, view.chain = signatures, chain
    return rewound, len(links) - held


def index_links(
    ctx: PartitionContext, chain: Chain, entries: Iterable[Sequence[RemoteLogIndexEntry]]
) -> None:
    """Append to the local index the entries of ``chain``'s links it does not hold yet
    (``entries``: each such link's, in chain order, as :meth:`RemoteState.link_entries` gives
    them), each above what the index holds; then drop the sets wholly below the chain's start, as
    retention does. Recovery, sync and the Spark ``rebuild_index`` (rlm/jobs/index.py) all index
    the store's chain here."""
    for link_entries in entries:
        floor = ctx.family.last_offset
        ctx.family.append_segment([e for e in link_entries if e.first_offset > floor])
        crash_point("mid_index_rebuild")
    if chain.links:
        ctx.family.remove_below(chain.start)


def _leader_marks(
    ctx: PartitionContext, remote: RemoteState, view: StoreView, lineage: Lineage, node_id: int | None
) -> LineageMarker | None:
    """Write a lineage marker when the local lineage cuts what the markers alone do not."""
    manifests = [m for _s, m in view.manifests.values()]
    by_markers = resolve_chain(manifests, _lineages(view)).first_diverged
    with_local = resolve_chain(manifests, [*_lineages(view), lineage]).first_diverged
    if with_local is None or (by_markers is not None and by_markers <= with_local):
        return None
    marker = remote.create_lineage_marker(
        LineageMarker(
            epoch=lineage[-1][0],
            lineage=lineage,
            diverged_from=with_local,
            node_id=node_id,
            written_ms=ctx.shared.clock_ms(),
        )
    )
    log.warning(
        "%s: tiered data from offset %d is not on this leader's lineage (leader epochs %s): "
        "diverged after an unclean election; it is no longer served and will be removed",
        ctx.part.name,
        with_local,
        list(lineage),
    )
    return marker


def _uncommit(ctx: PartitionContext, remote: RemoteState, chain: Chain) -> tuple[int, ...]:
    """Leader only: delete the manifests nobody may serve (wholly diverged or superseded)."""
    done = []
    dead = [(m, "diverged") for m, _cut in chain.diverged]
    dead += [(m, "wholly overlapped by an earlier segment") for m in chain.superseded]
    for manifest, why in dead:
        remote.delete_manifest(manifest.base_offset)
        done.append(manifest.base_offset)
        log.warning(
            "%s: uncommitted remote segment %d-%d (attempt %s): %s",
            ctx.part.name,
            manifest.base_offset,
            manifest.last_offset,
            manifest.attempt_id,
            why,
        )
    return tuple(done)


def note_committed(
    ctx: PartitionContext, manifest: SegmentManifest, stored: ObjectInfo | None = None
) -> None:
    """This node committed ``manifest`` (or found it already committed) and indexed all of it:
    extend the view's chain and what the local index holds. ``stored``: the manifest object as the
    store acknowledged the create; a listing that shows it under the same stamp (:func:`_stamp`: the
    ETag an S3 PUT answers, the mtime a ``local`` put does) does not read it back, else the next
    listing reads it once to learn its stamp."""
    view = ctx.store
    key = object_keys.manifest_key(ctx.topic, ctx.partition, manifest.base_offset, ctx.key_id)
    stamp = _stamp(stored) if stored is not None and stored.key == key else (-1, None, None)
    view.manifests[key] = (stamp, manifest)
    first = max(manifest.base_offset, view.chain.highest + 1)
    link = Link(manifest, first, manifest.last_offset)
    view.chain = Chain((*view.chain.links, link))
    if view.held is not None:
        view.held = (*view.held, link.signature)


def note_deleted(ctx: PartitionContext, manifest: SegmentManifest) -> None:
    """Retention on this node deleted ``manifest``: drop it from the view's chain."""
    view = ctx.store
    view.manifests = {k: sm for k, sm in view.manifests.items() if sm[1] is not manifest}
    links = tuple(lk for lk in view.chain.links if lk.manifest is not manifest)
    view.chain = Chain(links, view.chain.superseded, view.chain.diverged)
    if view.held is not None:
        view.held = tuple(lk.signature for lk in links)


def refresh(ctx: PartitionContext, listing: Sequence[ObjectInfo] | None = None) -> int:
    """List the manifests prefix (unless ``listing`` is given) and read what is new into
    ``ctx.store``; return how many manifests were read."""
    remote = of_context(ctx)
    if listing is None:
        listing = remote.list_manifests_prefix()
    return _refresh(remote, ctx.store, listing)


def resolve(ctx: PartitionContext, lineage: Lineage | None = None) -> Chain:
    """The chain of what ``ctx.store`` holds, under its markers' lineages and the local one."""
    lineage = lineage if lineage is not None else local_lineage(ctx)
    lineages = _lineages(ctx.store) + ([lineage] if lineage else [])
    return resolve_chain([m for _s, m in ctx.store.manifests.values()], lineages)


def local_divergence(ctx: PartitionContext, lineage: Lineage | None = None) -> int | None:
    """The first offset of this replica's own log that the store's lineage markers contradict
    (``lineage``: its ``leader-epoch-checkpoint``, read now when not given); None when none does.
    From there on the log holds records an unclean election threw away: its broker truncates them
    when it rejoins the cluster, until then no reader may see them (docs/cluster.md)."""
    lineage = lineage if lineage is not None else local_lineage(ctx)
    return replica_diverged(lineage, _lineages(ctx.store)) if lineage else None


def note_log_start(ctx: PartitionContext) -> bool:
    """Raise the DeleteRecords point to the log start the store's markers name (rlm's own
    DeleteRecords, maybe written by another sidecar or before the state dir was lost; docs/cli.md
    ``rlm delete-records``); True when it moved, so the caller saves the progress."""
    if ctx.store.log_start <= ctx.progress.delete_records_offset:
        return False
    log.info(
        "%s: the store's log start is %d (delete-records): nothing below it is served",
        ctx.part.name,
        ctx.store.log_start,
    )
    ctx.progress.delete_records_offset = ctx.store.log_start
    return True


def note_divergence(ctx: PartitionContext, diverged_from: int | None) -> bool:
    """Record in the progress where this replica's log left the lineage (readers stop there; -1:
    it did not); True when that changed, so the caller saves the progress. One line each way."""
    cut = -1 if diverged_from is None else diverged_from
    if cut == ctx.progress.local_diverged_from:
        return False
    if cut >= 0:
        log.warning(
            "%s: this replica's log diverged from the store's lineage at offset %d (an unclean "
            "leader election threw its records from there away; the broker truncates them when it "
            "rejoins): nothing at or above it is served",
            ctx.part.name,
            cut,
        )
    else:
        log.info("%s: this replica's log is on the store's lineage again: served up to its HW", ctx.part.name)
    ctx.progress.local_diverged_from = cut
    return True


def settle(ctx: PartitionContext, *, leader: bool, read: int = 0, staged: bool = False) -> SyncResult:
    """Resolve the chain of what :func:`refresh` read and bring the local index to it; the leader
    records its lineage and uncommits what nobody may serve. Sets ``ctx.manifests``. ``staged``:
    see :func:`reconcile`."""
    remote, view = of_context(ctx), ctx.store
    lineage = local_lineage(ctx)
    node_id = ctx.shared.node_id
    marker = _leader_marks(ctx, remote, view, lineage, node_id) if leader and lineage else None
    if marker is not None:
        view.markers[f"written:{marker.epoch}"] = ((0, None, None), marker)
    resolved = chain = resolve(ctx, lineage)
    uncommitted: tuple[int, ...] = ()
    if leader and (chain.diverged or chain.superseded):
        uncommitted = _uncommit(ctx, remote, chain)
        dead = set(uncommitted)
        view.manifests = {k: sm for k, sm in view.manifests.items() if sm[1].base_offset not in dead}
        chain = Chain(chain.links)
    try:
        rewound, appended = reconcile(ctx, view, chain, staged=staged)
    except FormatError as err:
        raise RlmError(f"cannot index the remote segments: {err}") from err
    ctx.manifests = chain.manifests
    diverged = local_divergence(ctx, lineage)
    return SyncResult(resolved, read, rewound, appended, marker, uncommitted, diverged)


def sync_partition(ctx: PartitionContext, *, leader: bool) -> SyncResult:
    """One listing of the store, then :func:`settle` (a pass in cluster mode; docs/cluster.md)."""
    return settle(ctx, leader=leader, read=refresh(ctx))
