"""The copy room: one pass's copy task — the pending segments and their order (`copy_pass`),
pin on sight (`sight`), pin and checksum (`prepare`), the copy protocol (`copier`, `seal`, `upload`),
transaction facts captured at copy time (`txn_capture`), quarantine of segments that cannot be
copied (`quarantine`) and the stalled-copy watchdog (`watchdog`) (docs/architecture.md §3).
Imports converge, local and store; never expire or read.

This module is the room's public face: packages outside the room import from here, never from
its modules (tests/ops/test_rooms.py).
"""

from __future__ import annotations

from rlm.tiering.copy.copy_pass import PendingSegment, copy_pending, pending_segments, publish_lag
from rlm.tiering.copy.prepare import checksum_segment
from rlm.tiering.copy.quarantine import reexamine_quarantine
from rlm.tiering.copy.sight import hold, hold_unloaded
from rlm.tiering.copy.watchdog import CopyWatchdog

__all__ = [
    "CopyWatchdog",
    "PendingSegment",
    "checksum_segment",
    "copy_pending",
    "hold",
    "hold_unloaded",
    "pending_segments",
    "publish_lag",
    "reexamine_quarantine",
]
