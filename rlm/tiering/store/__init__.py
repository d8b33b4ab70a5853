"""The store room: what rlm keeps in the bucket and how it is named, written and trusted —
the key layout (`object_keys`), segment manifests (`manifest`) and their trust check (`manifest_trust`),
lineage markers (`lineage`), the keyring and protection of stored objects (`keyring`, `store_protection`),
Kafka's producer snapshots stored beside segments (`producer_state`), the one reader of a
partition's store state — every manifest and lineage marker read goes through it —
(`remote_state`, docs/remote-state.md), the readers' entry opener over it (`entry_opener`) and key
rotation (`rewrap`).

It knows nothing of local state: every other room may import it; it imports no other room.

This module is the room's public face: packages outside the room import from here, never from
its modules (tests/ops/test_rooms.py).
"""

from __future__ import annotations

from rlm.tiering.store.entry_opener import EntryOpener
from rlm.tiering.store.idle_note import IdleNote
from rlm.tiering.store.keyring import KeyRing
from rlm.tiering.store.lineage import (
    Chain,
    Lineage,
    LineageMarker,
    Link,
    Stamp,
    StoreView,
    lineage_of,
    merged_epochs,
    replica_diverged,
    resolve_chain,
)
from rlm.tiering.store.manifest import (
    ENTRIES_OBJECT,
    INDEX_OBJECT,
    LEADER_EPOCHS_OBJECT,
    LOG_OBJECT,
    PRODUCER_SNAPSHOT_OBJECT,
    TIME_INDEX_OBJECT,
    TXN_INDEX_OBJECT,
    Protection,
    SegmentManifest,
    StoredObject,
)
from rlm.tiering.store.object_keys import parse_root
from rlm.tiering.store.producer_state import open_at_end, open_at_local, open_at_remote, producer_snapshot_key
from rlm.tiering.store.remote_state import Orphan, RemoteState, Unreadable, store_manifest_keys
from rlm.tiering.store.rewrap import rewrap_store
from rlm.tiering.store.store_protection import StoreProtection

__all__ = [
    "ENTRIES_OBJECT",
    "INDEX_OBJECT",
    "LEADER_EPOCHS_OBJECT",
    "LOG_OBJECT",
    "PRODUCER_SNAPSHOT_OBJECT",
    "TIME_INDEX_OBJECT",
    "TXN_INDEX_OBJECT",
    "Chain",
    "EntryOpener",
    "IdleNote",
    "KeyRing",
    "Lineage",
    "LineageMarker",
    "Link",
    "Orphan",
    "Protection",
    "RemoteState",
    "SegmentManifest",
    "Stamp",
    "StoreProtection",
    "StoreView",
    "StoredObject",
    "Unreadable",
    "lineage_of",
    "merged_epochs",
    "open_at_end",
    "open_at_local",
    "open_at_remote",
    "parse_root",
    "producer_snapshot_key",
    "replica_diverged",
    "resolve_chain",
    "rewrap_store",
    "store_manifest_keys",
]
