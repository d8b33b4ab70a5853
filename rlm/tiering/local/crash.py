"""Named crash points on the copy, delete, export and restore paths, for crash tests.

``RLM_CRASH_AT=<point>`` (optionally ``<point>:<n>`` to crash at the n-th time the point is
reached, 1-based) makes the process SIGKILL itself there: no ``finally``, no flush, exactly
like a power cut as far as the process's own files are concerned. Unset, a crash point costs
one dict lookup.
"""

from __future__ import annotations

import os
import signal
import threading

__all__ = [
    "DELETE_RECORDS_POINTS",
    "EXPORT_POINTS",
    "GC_POINTS",
    "POINTS",
    "RECOVERY_POINTS",
    "RESTORE_POINTS",
    "crash_point",
]

POINTS = (
    "after_pin",  # segment files hard-linked into staging
    "after_journal_start",  # COPY_STARTED durable, nothing uploaded
    "mid_upload",  # the .log upload is half sent
    "after_data",  # data + entries uploaded, no manifest
    "after_next_start",  # pipelined: the next segment's COPY_STARTED durable and its upload
    # running, this one's manifest not written, its own upload done or draining (two attempts open)
    "after_manifest",  # committed remotely, local index not yet appended
    "mid_local_append",  # part of the segment's entries appended locally
    "before_fsync",  # local index bytes written, not yet fsynced
    "before_journal_finish",  # local index durable, COPY_FINISHED not written
    "after_journal_finish",  # COPY_FINISHED durable, the run's progress.json not saved yet
    "after_delete_manifest",  # retention: manifest deleted, data still there
)

#: ``rlm delete-records`` (rlm/tiering/delete_records.py; tests/tiering/test_delete_records_crash.py).
DELETE_RECORDS_POINTS = (
    "after_log_start_marker",  # the store's log start marker written, progress.json not yet
)

#: Recovery's rebuild of the local remote index (tests/tiering/test_missing_family.py): reached
#: after each link of the store's chain was indexed.
RECOVERY_POINTS = (
    "mid_index_rebuild",  # some links of the chain indexed (staged), the rest not yet
)

#: ``rlm export`` (kept apart: the tiering crash tests drive every point of POINTS with ``rlm run``).
EXPORT_POINTS = (
    "export_before_commit",  # iceberg: data files written, table snapshot not committed
)

#: GC deleting a retired root (an old incarnation or a deleted topic; docs/topic-identity.md).
GC_POINTS = (
    "mid_root_delete",  # the root's first object deleted, the rest and its retired.json not
)

#: ``rlm restore`` (docs/restore.md "Never half-written"; tests/jobs/test_restore.py).
RESTORE_POINTS = (
    "restore_after_segment",  # a segment's files written into its staging dir
    "restore_mid_commit",  # one partition renamed into place, the others and the checkpoints not
)

_counts: dict[str, int] = {}
_lock = threading.Lock()


def crash_point(name: str) -> None:
    """SIGKILL this process if ``RLM_CRASH_AT`` names ``name`` (and its count is reached)."""
    spec = os.environ.get("RLM_CRASH_AT")
    if not spec:
        return
    point, _, nth = spec.partition(":")
    if point != name:
        return
    with _lock:
        _counts[name] = _counts.get(name, 0) + 1
        reached = _counts[name] >= (int(nth) if nth else 1)
    if reached:
        os.kill(os.getpid(), signal.SIGKILL)
