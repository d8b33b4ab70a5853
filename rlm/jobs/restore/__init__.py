"""The restore room: ``rlm restore`` — Kafka partition directories rebuilt from the remote tier:
which segments of the store's chain, cut where, restored in parallel and checked (`partitions`),
and the files written into one partition directory (`files`) (docs/restore.md). Imports no other
room of rlm.jobs.

This module is the room's public face: code outside the room imports from here, never from its
modules (tests/ops/test_rooms.py).
"""

from __future__ import annotations

from rlm.jobs.restore.partitions import PartitionRestore, RestoreResult, StartAt, plan_restore, restore

__all__ = ["PartitionRestore", "RestoreResult", "StartAt", "plan_restore", "restore"]
