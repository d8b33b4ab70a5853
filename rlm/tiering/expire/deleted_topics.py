"""Deleted topics: the remote data of a topic deleted on the broker and not re-created.

A topic deleted *and re-created* is handled per partition by :mod:`rlm.tiering.converge.incarnations`.
A topic deleted and not re-created has no partition directory left, so no partition pass sees it;
this module finds its roots from what outlives the partition — the state dirs
``<state dir>/<topic>-<partition>=<id>`` rlm kept for it, and the ``<topic>-<partition>.<uniq>-delete``
directories Kafka renames a deleted partition to (their ``partition.metadata`` still names the id).

A candidate is deleted only when that is certain (docs/topic-identity.md "Deleted topics"):

* the KRaft metadata image was read whole (no gap) and no longer has the topic id
  (``RemoveTopicRecord``); a broker without a readable metadata log never deletes here;
* no live partition directory of ``<topic>-<partition>`` exists in this broker's log dirs (any id:
  a re-created partition is the old-incarnation path's business, a live one with the same id means
  the broker has not applied the removal yet).

A replica merely moved away from this broker keeps its topic id in the image, so it is never a
candidate. Then the root gets the same ``retired.json`` as an old incarnation (reason
``"topic deleted"``, create-only-if-absent: the grace clock starts once, whoever writes it), and
is deleted ``tiering.deleted_topic_grace_ms`` later by :func:`rlm.tiering.converge.incarnations.delete_root`
(objects first, the marker last). A deleted topic has no leader, so any sidecar may do both: the
conditional create and the idempotent deletes make concurrent sidecars safe.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rlm.config import Settings
from rlm.errors import RlmError
from rlm.logdir.discovery import discover_partitions, read_topic_id
from rlm.logdir.kraft import MetadataImage
from rlm.storage.api import StorageBackend
from rlm.tiering.converge import DELETED_REASON, OldIncarnation, delete_root, grace_ms, retired_marker
from rlm.tiering.local import TieringMetrics, state_root_of
from rlm.tiering.store import RemoteState, StoreProtection, object_keys

__all__ = ["Candidate", "DeletedTopics", "collect_deleted_topics", "find_candidates", "find_deleted_topics"]

log = logging.getLogger(__name__)

_DELETE_SUFFIX = "-delete"


@dataclass(frozen=True, slots=True)
class Candidate:
    """A partition incarnation rlm knows of that may belong to a deleted topic."""

    topic: str
    partition: int
    topic_id: str
    state_dir: Path | None


def _deleting_dirs(log_dir: Path) -> dict[tuple[str, int, str], None]:
    """``(topic, partition, id)`` of every ``<topic>-<partition>.<uniq>-delete`` dir of ``log_dir``."""
    found: dict[tuple[str, int, str], None] = {}
    try:  # scandir: a path is built only for a -delete dir, not for each of thousands of partitions
        with os.scandir(log_dir) as listing:
            names = [e.name for e in listing if e.name.endswith(_DELETE_SUFFIX) and e.is_dir()]
    except OSError:
        return found
    for dir_name in names:
        name, dot, _uniq = dir_name[: -len(_DELETE_SUFFIX)].rpartition(".")
        root = object_keys.parse_root(f"{name}/") if dot else None
        try:
            topic_id = read_topic_id(log_dir / dir_name)
        except (RlmError, OSError):  # half-deleted by the broker meanwhile: the state dir remains
            continue
        if root is not None and topic_id is not None:
            found[(root.topic, root.partition, topic_id)] = None
    return found


@functools.lru_cache(maxsize=65_536)
def _root_of_state_dir(name: str) -> object_keys.Root | None:
    """The root a state dir's name stands for: GC lists every state dir each run."""
    return object_keys.parse_root(f"{name}/")


def find_candidates(
    settings: Settings, keep: Callable[[str, int, str], bool] | None = None
) -> list[Candidate]:
    """Every id'd incarnation with a state dir or a ``-delete`` dir in this broker's log dirs;
    ``keep(topic, partition, topic_id)``: only those it keeps (checked before a path is built)."""
    found: dict[tuple[str, int, str], tuple[Path, str] | None] = {}
    for log_dir in settings.log.dirs:
        found.update(_deleting_dirs(log_dir))
    for state_root in {state_root_of(settings.tiering, d) for d in settings.log.dirs}:
        try:  # scandir: the entry's type comes with the listing, no stat per partition
            with os.scandir(state_root) as listing:
                names = [e.name for e in listing if e.is_dir()]
        except OSError:
            continue
        for name in names:
            root = _root_of_state_dir(name)
            if root is not None and root.topic_id is not None:
                found[(root.topic, root.partition, root.topic_id)] = (state_root, name)
    return [
        Candidate(t, p, i, None if s is None else s[0] / s[1])
        for (t, p, i), s in sorted(found.items())
        if keep is None or keep(t, p, i)
    ]


def _certain(
    image: MetadataImage | None, live: set[tuple[str, int]], topic: str, partition: int, topic_id: str
) -> bool:
    if image is None or image.offset < 0 or image.gaps:
        return False
    return topic_id not in image.topics_by_id and (topic, partition) not in live


def find_deleted_topics(
    settings: Settings,
    backend: StorageBackend,
    image: MetadataImage | None,
    now_ms: int,
    *,
    mark: bool,
    protection: StoreProtection | None = None,
    live: set[tuple[str, int]] | None = None,
) -> list[tuple[OldIncarnation, RemoteState]]:
    """The incarnations of deleted topics (certain, see the module doc) that still hold remote
    objects or local state, each with its root; ``mark`` writes the ``retired.json`` of one seen
    for the first time (GC, never status). Times in ms since the epoch. ``live``: every partition
    dir in the log dirs, when the caller just listed them (a GC: one discovery per run)."""
    if live is None:
        live = {(p.topic, p.partition) for p in discover_partitions(settings.log.dirs)}
    t = settings.tiering
    out = []
    for cand in find_candidates(
        settings, lambda topic, n, topic_id: _certain(image, live, topic, n, topic_id)
    ):
        root = RemoteState(
            backend, cand.topic, cand.partition, cand.topic_id, protection or StoreProtection()
        )
        infos = root.list_partition()
        local = cand.state_dir if cand.state_dir is not None and cand.state_dir.is_dir() else None
        if not infos and local is None:
            continue
        new = {"retired_by": None, "reason": DELETED_REASON, "retired_ms": now_ms} if mark else None
        retired, marker = retired_marker(root, infos, new, local)
        kept = t.keep_old_incarnations
        due = None if kept or retired is None else retired + grace_ms(t, marker)
        prefix = object_keys.root(cand.topic, cand.partition, cand.topic_id)
        old = OldIncarnation(
            cand.topic,
            cand.partition,
            cand.topic_id,
            prefix,
            len(infos),
            sum(i.size for i in infos),
            retired,
            due,
            kept,
            str(local) if local is not None else None,
        )
        out.append((old, root))
    return out


def collect_deleted_topics(
    settings: Settings,
    backend: StorageBackend,
    image: MetadataImage | None,
    now_ms: int,
    *,
    dry_run: bool = False,
    protection: StoreProtection | None = None,
    live: set[tuple[str, int]] | None = None,
) -> list[OldIncarnation]:
    """Delete the deleted topics' roots whose grace passed (``dry_run``: only list them); return
    every one found, ``deleted`` set on those removed now. ``live``: as :func:`find_deleted_topics`."""
    result = []
    for old, root in find_deleted_topics(
        settings, backend, image, now_ms, mark=not dry_run, protection=protection, live=live
    ):
        if not dry_run and old.delete_after_ms is not None and now_ms >= old.delete_after_ms:
            delete_root(root, old.state_dir)
            log.info(
                "deleted topic %s-%d (id %s): deleted %s (%d objects, %d bytes) at %d ms (marked at %d ms)",
                old.topic,
                old.partition,
                old.topic_id,
                old.prefix,
                old.objects,
                old.bytes,
                now_ms,
                old.retired_ms or 0,
            )
            old = replace(old, deleted=True)
        result.append(old)
    return result


class DeletedTopics:
    """The daemon's view of deleted topics: each GC marks them and deletes those past
    ``tiering.deleted_topic_grace_ms``; :meth:`status` (``GET /v1/deleted-topics``) answers what
    the last one found waiting, from memory. Any sidecar collects, not only a leader: a deleted
    topic has none (docs/topic-identity.md "Deleted topics")."""

    def __init__(
        self,
        settings: Settings,
        backend: StorageBackend,
        image: Callable[[], MetadataImage | None],
        clock_ms: Callable[[], int],
        protection: StoreProtection | None,
        metrics: TieringMetrics | None = None,
    ) -> None:
        self._settings, self._backend, self._image = settings, backend, image
        self._clock_ms, self._protection, self._metrics = clock_ms, protection, metrics
        #: Deleted topics' roots waiting for their grace, as the last collection found them.
        self.waiting: list[OldIncarnation] = []

    def collect(
        self, *, dry_run: bool = False, live: set[tuple[str, int]] | None = None
    ) -> list[OldIncarnation]:
        """One GC's pass over deleted topics; ``live``: the partition dirs the GC just listed."""
        found = collect_deleted_topics(
            self._settings,
            self._backend,
            self._image(),
            self._clock_ms(),
            dry_run=dry_run,
            protection=self._protection,
            live=live,
        )
        self.waiting = [d for d in found if not d.deleted]
        self._publish()
        return found

    def _publish(self) -> None:
        if self._metrics is None:
            return
        due = [d.delete_after_ms for d in self.waiting if d.delete_after_ms is not None]
        self._metrics.deleted_topic_partitions.set(len(self.waiting))
        self._metrics.deleted_topic_bytes.set(sum(d.bytes for d in self.waiting))
        self._metrics.deleted_topic_next_delete.set(min(due) / 1000 if due else float("inf"))

    def status(self) -> list[dict[str, Any]]:
        return [{"topic": d.topic, "partition": d.partition, **d.to_json()} for d in self.waiting]
