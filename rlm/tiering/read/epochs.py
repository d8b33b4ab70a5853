"""A partition's leader-epoch lineage as rlm serves it (OffsetForLeaderEpoch and the leader epoch
in Metadata, docs/kafka-listener.md §5.4): Kafka's cache of ``(epoch, first offset)`` entries.

Two sources, merged as Kafka's ``LeaderEpochFileCache`` would hold them (``merged_epochs``): the
broker's own ``leader-epoch-checkpoint`` in the partition dir (the epochs of the local log; Kafka
trims it when retention moves the log start) and, for the history only the remote tier holds, the
``leader_epochs`` each tiered segment's manifest recorded, from the daemon's ``manifests.snapshot``
in the partition's state dir. Both are parsed again only when their file changed.

Without the manifests (no daemon state yet) the lineage is the local one, as Kafka's own after its
retention: an older epoch is then answered with the first local entry's start, which is never
below where a consumer that read that epoch stands, so no consumer sees a truncation that did not
happen — only a real one in the remote range goes unseen.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rlm.config import TieringSettings
from rlm.errors import FormatError
from rlm.formats.checkpoint import EpochEntry
from rlm.fsutil import FileMemo
from rlm.logdir.discovery import LEADER_EPOCH_CHECKPOINT, PartitionDir
from rlm.tiering.converge import lineage_in
from rlm.tiering.local import Progress, manifest_snapshot, state_dir
from rlm.tiering.store import merged_epochs

__all__ = ["LeaderEpochs"]

log = logging.getLogger(__name__)

Pairs = tuple[tuple[int, int], ...]


def _local_pairs(path: Path) -> Pairs:
    """The partition's ``leader-epoch-checkpoint`` (``path``) as converge reads it
    (:func:`~rlm.tiering.converge.lineage_in`: absent or unreadable = no entries, logged)."""
    return lineage_in(path.parent) or ()


def _remote_pairs(path: Path) -> Pairs:
    try:
        rows = manifest_snapshot.load(path)
    except FileNotFoundError:
        return ()
    return tuple(pair for _key, _stamp, manifest in rows for pair in manifest.leader_epochs)


class LeaderEpochs:
    """The lineages of the partitions a reader serves (one per daemon or CLI process)."""

    def __init__(self, settings: TieringSettings) -> None:
        self._settings = settings
        self._local: FileMemo[Pairs] = FileMemo(_local_pairs)
        self._remote: FileMemo[Pairs] = FileMemo(_remote_pairs, max_entries=4096)

    def lineage(self, part: PartitionDir, progress: Progress, log_start: int) -> list[EpochEntry]:
        """Epochs ascending from the one in force at ``log_start`` (moved to it). The latest
        entry is kept even when it starts past the high watermark (a new leader that has not
        written yet): Metadata, Fetch and OffsetForLeaderEpoch all name that epoch, as Kafka's do.
        Epochs the manifests know beyond the local broker's latest (another replica's uploads this
        broker has not caught up with) are left out: the latest epoch is the local broker's.
        An unreadable local checkpoint counts as empty (logged), as everywhere rlm reads it."""
        local = self._local.get(part.path / LEADER_EPOCH_CHECKPOINT)
        pairs = local
        if progress.highest_tiered_offset >= 0:
            remote = self._remote_pairs(part)
            pairs = local + (tuple(p for p in remote if p[0] <= local[-1][0]) if local else remote)
        return merged_epochs(pairs, log_start, 2**63 - 1)

    def latest(self, part: PartitionDir, progress: Progress) -> int:
        """The partition's current leader epoch as rlm serves it (:meth:`lineage`'s last, read
        from the local checkpoint alone when it has one: Metadata asks for every partition, and
        the manifests are parsed only when needed); -1 when no epoch is known."""
        local = self._local.get(part.path / LEADER_EPOCH_CHECKPOINT)
        if local:
            return max(epoch for epoch, _ in local)
        lineage = self.lineage(part, progress, 0)
        return lineage[-1].epoch if lineage else -1

    def _remote_pairs(self, part: PartitionDir) -> Pairs:
        path = state_dir(self._settings, part) / manifest_snapshot.MANIFEST_SNAPSHOT_FILE
        try:
            return self._remote.get(path)
        except (FormatError, OSError) as err:  # being rewritten, or damaged: local alone is safe
            log.debug("%s: leader epochs of the remote tier not read: %s", part.name, err)
            return ()
