"""Which store root a partition's incarnation reads and writes, decided from its local progress
(docs/topic-identity.md), and the daemon's :class:`~rlm.tiering.store.remote_state.RemoteState` of
a partition context. The store room knows nothing of local state; this is where the two meet."""

from __future__ import annotations

from dataclasses import dataclass

from rlm.config import TieringSettings
from rlm.logdir.discovery import PartitionDir
from rlm.storage.api import StorageBackend
from rlm.tiering.local.state import PROGRESS_FILE, PartitionContext, Progress, state_dir
from rlm.tiering.store import RemoteState, StoreProtection, object_keys

__all__ = ["RemoteView", "of_context", "remote_view", "view_of"]


@dataclass(frozen=True, slots=True)
class RemoteView:
    """What a reader outside the daemon (the Spark planner) may treat as ``part``'s remote data:
    the root's key id (None = name-only), or nothing when ``servable`` is False."""

    servable: bool
    key_id: str | None

    def state(
        self,
        backend: StorageBackend,
        part: PartitionDir,
        protection: StoreProtection | None = None,
    ) -> RemoteState:
        """The :class:`RemoteState` of that root."""
        return RemoteState(backend, part.topic, part.partition, self.key_id, protection or StoreProtection())


def remote_view(settings: TieringSettings, part: PartitionDir) -> RemoteView:
    """Which root the incarnation of ``part`` uses, from its persisted progress (its root after
    adoption, a recorded conflict); before the daemon ever ran for it, the incarnation's own root
    (docs/topic-identity.md). The daemon decides the root in ``identity.resolve_root``."""
    if part.identity_error is not None:
        return RemoteView(False, None)
    return view_of(part, Progress.load(state_dir(settings, part) / PROGRESS_FILE))


def view_of(part: PartitionDir, progress: Progress) -> RemoteView:
    """:func:`remote_view` with the progress at hand (a reader's, live in the daemon)."""
    if part.identity_error is not None or progress.lineage_conflict is not None:
        return RemoteView(False, None)
    parsed = object_keys.parse_root(progress.remote_root) if progress.remote_root else None
    return RemoteView(True, parsed.topic_id if parsed is not None else part.topic_id)


def of_context(ctx: PartitionContext) -> RemoteState:
    """The daemon's view of a partition: its current root (``ctx.key_id``, which recovery may
    change)."""
    return RemoteState(ctx.shared.backend, ctx.topic, ctx.partition, ctx.key_id, ctx.shared.protection)
