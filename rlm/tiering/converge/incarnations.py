"""Old incarnations of a partition: the data and state of a topic deleted and re-created.

A partition whose directory has topic id X owns exactly one root in the store (its own, or the
name-only root if it adopted it — :func:`rlm.tiering.converge.identity.resolve_root`). Every other root of
the same ``<topic>-<partition>`` belongs to an older incarnation:

* ``<topic>-<partition>=<Y>/`` for every Y ≠ X;
* the name-only root ``<topic>-<partition>/`` once it is decided not to be X's (its ``owner.json``
  names another id, or a ``retired.json`` says it was not adopted); an undecided name-only root is
  left for recovery to adopt or retire, never deleted from here;
* state dirs ``<state dir>/<topic>-<partition>=<Y>/`` (and the name-only one when not adopted).

Kafka deletes a deleted topic's remote data; rlm does the same after a grace period: the first
pass that sees an old root writes its ``retired.json`` (create-only-if-absent, so the grace clock
starts once), and GC deletes the root's objects (the marker last) and its local state once
``retired_ms + tiering.old_incarnation_grace_ms`` passed, unless ``tiering.keep_old_incarnations``.
Partitions without a topic id have no old incarnations: a name cannot tell them apart
(docs/topic-identity.md).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from rlm.config import TieringSettings
from rlm.fsutil import FileMemo, atomic_write
from rlm.storage.api import ObjectInfo
from rlm.tiering.local import PartitionContext, crash_point, loads_or_none, of_context, state_dir_name
from rlm.tiering.store import RemoteState, object_keys

#: What the last identity lookup of a partition found (docs/remote-state.md "What a restart
#: reads"): in its state dir, a cache written without fsync; anything unreadable is looked up again.
IDENTITY_FILE = "identity.json"

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class OldIncarnation:
    """One old incarnation (``topic_id`` None = the name-only root); times in ms since the epoch.

    ``retired_ms`` is when it was first seen retired (None: not marked yet); ``delete_after_ms`` =
    ``retired_ms`` + grace (None when kept or not marked); ``objects``/``bytes`` count its keys.
    """

    topic: str
    partition: int
    topic_id: str | None
    prefix: str
    objects: int
    bytes: int
    retired_ms: int | None
    delete_after_ms: int | None
    kept: bool
    state_dir: str | None
    deleted: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "topic_id": self.topic_id,
            "prefix": self.prefix,
            "objects": self.objects,
            "bytes": self.bytes,
            "retired_ms": self.retired_ms,
            "delete_after_ms": self.delete_after_ms,
            "kept": self.kept,
            "state_dir": self.state_dir,
            "deleted": self.deleted,
        }

    @classmethod
    def from_json(cls, topic: str, partition: int, doc: Any) -> OldIncarnation:
        """The inverse of :meth:`to_json`; TypeError/ValueError when ``doc`` is not one."""
        if not isinstance(doc, dict) or set(doc) != {f.name for f in fields(cls)} - {"topic", "partition"}:
            raise ValueError(f"not an old incarnation: {doc!r}")
        old = cls(topic, partition, **doc)
        if not (isinstance(old.prefix, str) and isinstance(old.objects, int) and isinstance(old.kept, bool)):
            raise TypeError(f"not an old incarnation: {doc!r}")
        return old


def _name_root_state(ctx: PartitionContext) -> str:
    """The name-only root as an id-root partition sees it: ``"decided"`` (its ``owner.json`` names
    another id or it is retired: permanent, both markers are create-only), ``"empty"`` (no object
    at all) or ``"undecided"`` (objects but no decision: recovery may still adopt or retire it)."""
    if any(o.topic_id is None for o in ctx.old_incarnations):
        return "decided"
    if _root(ctx, None).is_empty():
        return "empty"
    return "decided" if _legacy_decided_old(ctx) else "undecided"


def remember_identity(ctx: PartitionContext) -> str | None:
    """Persist what the identity lookups decided for ``ctx`` — its root (``key_id``), its old
    incarnations and the state of the name-only root — so that a restart trusting the local state
    asks the store nothing (:func:`recall_identity`). Returns the name-only root's state (None:
    nothing to remember, the partition has no id root)."""
    if ctx.part.topic_id is None or ctx.key_id is None:
        return None
    state = _name_root_state(ctx)
    doc = {
        "topic_id": ctx.part.topic_id,
        "key_id": ctx.key_id,
        "name_root": state,
        "old_incarnations": [o.to_json() for o in ctx.old_incarnations],
    }
    ctx.state_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(ctx.state_dir / IDENTITY_FILE, json.dumps(doc).encode(), durable=False)
    return state


def _recalled(ctx: PartitionContext) -> dict[str, Any] | None:
    try:
        doc = loads_or_none((ctx.state_dir / IDENTITY_FILE).read_bytes())
    except OSError:
        return None
    ok = (
        isinstance(doc, dict)
        and doc.get("topic_id") == ctx.part.topic_id
        and "key_id" in doc
        and isinstance(doc.get("old_incarnations"), list)
    )
    return doc if ok else None


def recall_identity(ctx: PartitionContext, key_id: str | None) -> list[OldIncarnation] | None:
    """The old incarnations :func:`remember_identity` persisted for this topic id and root
    ``key_id``; None when the store must be asked again (no record, or an undecided name-only
    root: recovery may still adopt or retire it).

    Nothing else can have changed in single-broker mode: only this sidecar writes the partition's
    id roots, and a re-created topic (a new id) fails the restart's checks first. An empty
    name-only root can still gain data from a replica whose broker has no ``partition.metadata``
    (a rolling upgrade); GC looks at it on its own schedule (:func:`collect_old_incarnations`),
    so a restart makes no request for it.
    """
    doc = _recalled(ctx)
    if doc is None or doc["key_id"] != key_id or doc.get("name_root") not in ("decided", "empty"):
        return None
    try:
        return [OldIncarnation.from_json(ctx.topic, ctx.partition, o) for o in doc["old_incarnations"]]
    except (TypeError, ValueError):
        return None


def _list_roots(
    ctx: PartitionContext, listing: Sequence[ObjectInfo] | None = None
) -> dict[str | None, list[ObjectInfo]]:
    """Objects of every root of this partition that is not this incarnation's (``listing``: of
    its id roots, taken now; default one listing)."""
    remote = of_context(ctx)
    # Never the partition's own id root, even when its data lives under the adopted name.
    roots: dict[str | None, list[ObjectInfo]] = {
        k: v for k, v in remote.other_id_roots(ctx.part.topic_id, listing).items()
    }
    if ctx.key_id is not None and _legacy_decided_old(ctx):
        legacy = replace(remote, key_id=None).list_partition()
        if legacy:
            roots[None] = legacy
    return roots


def _root(ctx: PartitionContext, topic_id: str | None) -> RemoteState:
    return replace(of_context(ctx), key_id=topic_id)


def _legacy_decided_old(ctx: PartitionContext) -> bool:
    legacy = _root(ctx, None)
    owner = legacy.read_marker(object_keys.OWNER_MARKER)
    if owner is not None:
        return owner.get("topic_id") != ctx.part.topic_id
    return legacy.has_marker(object_keys.RETIRED_MARKER)


def _index_state_root(root: Path) -> dict[str, tuple[str, ...]]:
    """The directories in a state root, by the ``<topic>-<partition>`` their name starts with
    (the text before ``=``): one listing serves every partition of the log dir."""
    index: dict[str, list[str]] = {}
    with os.scandir(root) as it:
        for entry in it:
            if entry.is_dir():
                index.setdefault(entry.name.partition(object_keys.ID_SEPARATOR)[0], []).append(entry.name)
    return {k: tuple(v) for k, v in index.items()}


#: GC asks this of every partition in turn: listing the state root once per partition made a GC
#: over P partitions P² directory entries and stat calls (10⁸ at 10 000 partitions). The memo is
#: kept while the root's signature stands (entries added or removed change its mtime).
_STATE_ROOTS: FileMemo[dict[str, tuple[str, ...]]] = FileMemo(_index_state_root, max_entries=64)


def _old_state_dirs(ctx: PartitionContext) -> dict[str | None, Path]:
    root = ctx.state_dir.parent
    mine = state_dir_name(ctx.part)
    found: dict[str | None, Path] = {}
    try:
        names = _STATE_ROOTS.get(root).get(ctx.part.name, ())
    except FileNotFoundError:
        return found
    for name in names:
        if name == mine:
            continue
        if name.startswith(object_keys.id_roots_prefix(ctx.topic, ctx.partition)):
            found[name.rpartition(object_keys.ID_SEPARATOR)[2]] = root / name
        elif name == ctx.part.name and ctx.key_id is not None and _legacy_decided_old(ctx):
            found[None] = root / name
    return found


#: ``reason`` of a ``retired.json`` written for a topic deleted and not re-created
#: (:mod:`rlm.tiering.expire.deleted_topics`); its grace is ``tiering.deleted_topic_grace_ms``.
DELETED_REASON = "topic deleted"


def grace_ms(settings: TieringSettings, marker: dict[str, Any] | None) -> int:
    """The grace period (ms) of a retired root: the one its marker's reason names, so whichever
    path marked it first (re-creation or deletion) decides, once (docs/topic-identity.md)."""
    if marker is not None and marker.get("reason") == DELETED_REASON:
        return settings.deleted_topic_grace_ms
    return settings.old_incarnation_grace_ms


def retired_marker(
    root: RemoteState, infos: list[ObjectInfo], new: dict[str, Any] | None, local: Path | None
) -> tuple[int | None, dict[str, Any] | None]:
    """(when the root was retired, its ``retired.json``): the marker if listed in ``infos``, else
    ``new`` created (create-only-if-absent: the grace clock starts once) when given and the root
    has objects; with only local state left, its age is the grace clock."""
    key = root.marker_key(object_keys.RETIRED_MARKER)
    listed = any(i.key == key for i in infos)
    doc = root.read_marker(object_keys.RETIRED_MARKER) if listed else None
    # Listed but gone: another process is deleting the root; never restart its grace clock.
    if doc is None and new is not None and infos and not listed:
        doc = root.create_marker(object_keys.RETIRED_MARKER, new)
    if doc is not None:
        value = doc.get("retired_ms")
        return (value if isinstance(value, int) else None), doc
    if not infos and local is not None:
        try:
            return int(local.stat().st_mtime * 1000), None
        except OSError:
            return None, None
    return None, None


def _retired_ms(
    ctx: PartitionContext, topic_id: str | None, infos: list[ObjectInfo], mark: bool, local: Path | None
) -> tuple[int | None, dict[str, Any] | None]:
    new = {"retired_by": ctx.part.topic_id, "retired_ms": ctx.shared.clock_ms()} if mark else None
    return retired_marker(_root(ctx, topic_id), infos, new, local)


def find_old_incarnations(
    ctx: PartitionContext, *, mark: bool, listing: Sequence[ObjectInfo] | None = None
) -> list[OldIncarnation]:
    """Every old incarnation of the partition (empty without a topic id); ``mark`` writes the
    ``retired.json`` of a root seen for the first time (recovery and GC, never status);
    ``listing``: of the partition's id roots, taken now (default: one listing)."""
    if ctx.part.topic_id is None:
        return []
    settings = ctx.shared.settings
    roots = _list_roots(ctx, listing)
    states = _old_state_dirs(ctx)
    out = []
    for topic_id in sorted(set(roots) | set(states), key=lambda t: (t is not None, t or "")):
        infos = roots.get(topic_id, [])
        local = states.get(topic_id)
        retired, marker = _retired_ms(ctx, topic_id, infos, mark, local)
        kept = settings.keep_old_incarnations
        due = None if kept or retired is None else retired + grace_ms(settings, marker)
        out.append(
            OldIncarnation(
                ctx.topic,
                ctx.partition,
                topic_id,
                object_keys.root(ctx.topic, ctx.partition, topic_id),
                len(infos),
                sum(i.size for i in infos),
                retired,
                due,
                kept,
                str(local) if local is not None else None,
            )
        )
    return out


def delete_root(remote: RemoteState, state_dir: str | None) -> None:
    """Delete a retired root: objects first, the ``retired.json`` last (a crash midway leaves the
    marker, so the next GC finds the root and finishes), then the local state. Idempotent: a key
    another process deleted meanwhile deletes as a no-op."""
    marker = remote.marker_key(object_keys.RETIRED_MARKER)
    found = [i.key for i in remote.list_partition()]
    for n, key in enumerate(sorted(found, key=lambda k: k == marker)):
        if n == 1:
            crash_point("mid_root_delete")
        remote.delete(key)  # deleting an absent key succeeds (docs/storage.md)
    if state_dir is not None:
        shutil.rmtree(state_dir, ignore_errors=True)


def _delete(ctx: PartitionContext, old: OldIncarnation) -> None:
    delete_root(replace(of_context(ctx), key_id=old.topic_id), old.state_dir)  # old.prefix is that root


def collect_old_incarnations(
    ctx: PartitionContext, *, dry_run: bool = False, listing: Sequence[ObjectInfo] | None = None
) -> list[OldIncarnation]:
    """Delete the old incarnations whose grace period passed (``dry_run``: only list them);
    return every old incarnation, ``deleted`` set on those removed now (``listing``: of the
    partition's id roots, :func:`find_old_incarnations`)."""
    now = ctx.shared.clock_ms()
    olds = find_old_incarnations(ctx, mark=not dry_run, listing=listing)
    result = []
    for old in olds:
        if not dry_run and old.delete_after_ms is not None and now >= old.delete_after_ms:
            _delete(ctx, old)
            log.info(
                "%s: deleted old incarnation %s (%d objects, %d bytes, retired at %d ms)",
                ctx.part.name,
                old.prefix,
                old.objects,
                old.bytes,
                old.retired_ms or 0,
            )
            ctx.series(ctx.shared.metrics.orphans_deleted).inc(old.objects)
            old = replace(old, deleted=True)
        result.append(old)
    ctx.old_incarnations = [o for o in result if not o.deleted]
    if not dry_run and ctx.recovered:
        before = _recalled(ctx)
        if remember_identity(ctx) == "undecided" and (before or {}).get("name_root") == "empty":
            # Data appeared under the name since the root was decided: the partition's next pass
            # recovers, which adopts or retires it (docs/topic-identity.md).
            log.info("%s: data appeared under the name-only root: recovering at the next pass", ctx.part.name)
            ctx.recovered = False
    return result


__all__ = [
    "DELETED_REASON",
    "IDENTITY_FILE",
    "OldIncarnation",
    "collect_old_incarnations",
    "delete_root",
    "find_old_incarnations",
    "grace_ms",
    "recall_identity",
    "remember_identity",
    "retired_marker",
]
