"""The local room: what rlm keeps beside the broker's log dir — a partition's context and durable
progress (`state`, `statefiles`, `journal`), the remote index family's writer (`index_family`),
gaps (`gaps`, `gap_watch`), pins of broker segments (`pin_files`, `pin_ledger`), the manifest
snapshot (`manifest_snapshot`), the upload throttle (`throttle`), metrics and their history (`metrics`,
`history`), crash points for crash tests (`crash`), and which store root a partition uses,
decided from its progress (`remote_root`). Imports only the store room.

This module is the room's public face: packages outside the room import from here, never from
its modules (tests/ops/test_rooms.py).
"""

from __future__ import annotations

from rlm.tiering.local.crash import crash_point
from rlm.tiering.local.gap_watch import note_gaps
from rlm.tiering.local.gaps import Gap, gap_at
from rlm.tiering.local.history import TieringHistory
from rlm.tiering.local.index_family import RemoteIndexFamily
from rlm.tiering.local.journal import Journal
from rlm.tiering.local.manifest_snapshot import ManifestSnapshotHeader
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.local.pin_files import PIN_FILE, SightPin, linked_files
from rlm.tiering.local.pin_ledger import PinClaim, PinLedger
from rlm.tiering.local.remote_root import RemoteView, of_context, remote_view, view_of
from rlm.tiering.local.state import (
    COMPANION_THREADS,
    PROGRESS_FILE,
    PartitionContext,
    PendingManifests,
    Progress,
    Quarantine,
    SharedResources,
    state_dir,
    state_dir_name,
    state_root_of,
)
from rlm.tiering.local.statefiles import loads_or_none
from rlm.tiering.local.throttle import TokenBucket

__all__ = [
    "COMPANION_THREADS",
    "PIN_FILE",
    "PROGRESS_FILE",
    "Gap",
    "Journal",
    "ManifestSnapshotHeader",
    "PartitionContext",
    "PendingManifests",
    "PinClaim",
    "PinLedger",
    "Progress",
    "Quarantine",
    "RemoteIndexFamily",
    "RemoteView",
    "SharedResources",
    "SightPin",
    "TieringHistory",
    "TieringMetrics",
    "TokenBucket",
    "crash_point",
    "gap_at",
    "linked_files",
    "loads_or_none",
    "note_gaps",
    "of_context",
    "remote_view",
    "state_dir",
    "state_dir_name",
    "state_root_of",
    "view_of",
]
