"""The converge room: bringing local state to the store's truth — the follower's sync of the
chain (`sync`), topic identity and incarnations (`identity`, `incarnations`), crash recovery
(`recovery`) and offsets the log cleaner compacted after they were tiered (`compaction`)
(docs/cluster.md, docs/topic-identity.md, docs/remote-state.md). Imports local and store.

This module is the room's public face: packages outside the room import from here, never from
its modules (tests/ops/test_rooms.py).
"""

from __future__ import annotations

from rlm.tiering.converge.compaction import RewrittenRange, find_rewrites, rewrite_findings
from rlm.tiering.converge.identity import log_end_conflict, persisted_progress, read_dir_token, resolve_root
from rlm.tiering.converge.incarnations import (
    DELETED_REASON,
    OldIncarnation,
    collect_old_incarnations,
    delete_root,
    find_old_incarnations,
    grace_ms,
    recall_identity,
    remember_identity,
    retired_marker,
)
from rlm.tiering.converge.recovery import observe, progress_after, rebuild_local_index, recover
from rlm.tiering.converge.sync import (
    SyncResult,
    index_links,
    lineage_in,
    note_committed,
    note_deleted,
    note_divergence,
    note_log_start,
    refresh,
    sync_partition,
)

__all__ = [
    "DELETED_REASON",
    "OldIncarnation",
    "RewrittenRange",
    "SyncResult",
    "collect_old_incarnations",
    "delete_root",
    "find_old_incarnations",
    "find_rewrites",
    "grace_ms",
    "index_links",
    "lineage_in",
    "log_end_conflict",
    "note_committed",
    "note_deleted",
    "note_divergence",
    "note_log_start",
    "observe",
    "persisted_progress",
    "progress_after",
    "read_dir_token",
    "rebuild_local_index",
    "recall_identity",
    "recover",
    "refresh",
    "remember_identity",
    "resolve_root",
    "retired_marker",
    "rewrite_findings",
    "sync_partition",
]
