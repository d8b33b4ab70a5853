"""OffsetForLeaderEpoch's answer over a partition's leader-epoch lineage (#33; Kafka's
``LeaderEpochFileCache.endOffsetFor``, docs/kafka-listener.md).

A consumer asks after a leader change or an offset reset: "where did epoch E end?" — so it can
tell whether its position is past what the log still holds (truncation). The lineage is the
partition's :class:`~rlm.formats.checkpoint.EpochEntry` list (epochs ascending, each with the first
offset written in it); the log end a consumer may see is the visible end (the high watermark), not
the broker's log end.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from rlm.formats.checkpoint import EpochEntry
from rlm.kafka.protocol import Codes

__all__ = ["UNDEFINED", "end_offset_for", "fence"]

#: Kafka's UNDEFINED_EPOCH and UNDEFINED_EPOCH_OFFSET: the answer's (epoch, end offset) for an
#: epoch nothing is known about.
UNDEFINED = (-1, -1)


def end_offset_for(lineage: Sequence[EpochEntry], requested: int, log_end: int) -> tuple[int, int]:
    """``(epoch, end offset)`` for ``requested``: the latest epoch ends at ``log_end``; an older
    one at the start of the next higher epoch, answered with the largest known epoch ≤ it (or
    itself when it is older than every entry); -1, or an epoch above every entry, is
    :data:`UNDEFINED`. ``lineage``: epochs strictly ascending."""
    if requested == -1 or not lineage:
        return UNDEFINED
    if lineage[-1].epoch == requested:
        return requested, log_end
    epochs = [e.epoch for e in lineage]
    higher = bisect.bisect_right(epochs, requested)  # the first entry with epoch > requested
    if higher == len(lineage):
        return UNDEFINED
    if higher == 0:
        return requested, lineage[0].start_offset
    return lineage[higher - 1].epoch, lineage[higher].start_offset


def fence(current: int, latest: int) -> int:
    """Kafka's check of a request's ``current_leader_epoch`` (KIP-320) against the partition's
    ``latest`` epoch: -1 is not checked; an older one is FENCED_LEADER_EPOCH (the client's
    metadata is stale), a newer one UNKNOWN_LEADER_EPOCH (rlm's is: both retriable, the client
    refreshes its metadata); the same one, or no known epoch here, NONE."""
    if current < 0 or latest < 0 or current == latest:
        return Codes.NONE
    return Codes.FENCED_LEADER_EPOCH if current < latest else Codes.UNKNOWN_LEADER_EPOCH
