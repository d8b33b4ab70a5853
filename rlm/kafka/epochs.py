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

__all__ = ["UNDEFINED", "end_offset_for"]

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
