"""The checks room: ``rlm verify`` — a scrub of the remote store and the local index sets as a
Spark job (`scrub`): stage 1 per partition from one listing of its root (`verify_store`), stage 2
``--deep`` per segment (`verify_deep`), the local ``.remotelogindex`` sets against the store
(`verify_index`), the broker's own rolled segments (`verify_local`), each finding a `problem`
(docs/cli.md ``rlm verify``). Imports the reading room.

This module is the room's public face: code outside the room imports from here, never from its
modules (tests/ops/test_rooms.py).
"""

from __future__ import annotations

from rlm.jobs.checks.problem import Problem
from rlm.jobs.checks.scrub import VerifyReport, verify

__all__ = ["Problem", "VerifyReport", "verify"]
