"""Topic identity: which incarnation of a partition owns remote data, progress and local index.

See docs/topic-identity.md. In short:

* An incarnation is ``(topic id, partition)``; the id comes from ``partition.metadata``. Its remote
  data lives under ``<topic>-<partition>=<id>/`` and its state under
  ``<state dir>/<topic>-<partition>=<id>/`` (:func:`state_dir_name`), so a re-created topic (new
  id, same name) starts from nothing and can never be served the old data.
* A partition without an id keeps the name-only root ``<topic>-<partition>/`` and state dir, as
  before. When an id appears on such a partition (a broker upgraded to 2.8+), the incarnation
  *adopts* what was tiered under the name if it is consistent with the local log
  (:func:`lineage_conflict`): an ``owner.json`` marker, written create-only-if-absent, records the
  adopting id in the name-only root, and the name-only state dir is moved to the id's. If it is not
  consistent, a ``retired.json`` marker records that the name-only data belongs to an older
  incarnation.
* Every other root of the same partition is an *old incarnation* (:func:`find_old_incarnations`):
  shown in status and ``rlm gc --dry-run``, and deleted with its local state once
  ``tiering.old_incarnation_grace_ms`` passed since it was first seen retired — unless
  ``tiering.keep_old_incarnations``. The grace clock is the ``retired_ms`` of its ``retired.json``.
* Without an id, a local log that ends at or below the highest tiered offset, or whose batch at a
  tiered segment's first offset differs from the tiered bytes, is a *lineage conflict*: shown in
  status, nothing is tiered, and the tiered records are never served as this log's.
"""

from __future__ import annotations

import logging
import secrets
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rlm.config import TieringSettings
from rlm.errors import (
    IdentityConflictError,
    PartitionMetadataError,
    RlmError,
)
from rlm.fsutil import FileMemo, atomic_write
from rlm.logdir.discovery import PartitionDir, SegmentFiles, list_segments
from rlm.logdir.segment import LogSegment, log_end_offset
from rlm.tiering.local import PROGRESS_FILE, PartitionContext, Progress, state_dir
from rlm.tiering.store import RemoteState, SegmentManifest, object_keys

__all__ = [
    "DIR_MARKER",
    "PROBE_BYTES",
    "SegmentHead",
    "before_pass",
    "check_lineage",
    "check_log_end",
    "lineage_conflict",
    "log_end_conflict",
    "mark_dir",
    "persisted_progress",
    "read_dir_token",
    "resolve_root",
    "same_dir",
    "served_progress",
]

log = logging.getLogger(__name__)

#: A small file rlm leaves in a partition directory it has checked: a directory deleted and created
#: again (a re-created topic) lacks it, which a running daemon and readers notice without a store read.
DIR_MARKER = ".rlm-incarnation"

#: Bytes of a tiered segment's first batch compared with the local batch: a v2 batch header
#: (61 bytes) holds its CRC, which covers every record of the batch.
PROBE_BYTES = 61

#: The first plaintext bytes of a tiered segment (``RemoteState.segment_head``).
SegmentHead = Callable[[SegmentManifest, int], bytes]


# --------------------------------------------------------------------------------------------
# lineage: is the tiered data this local log's?


def _local_bytes(segments: Sequence[SegmentFiles], offset: int, length: int) -> bytes | None:
    """``length`` bytes of the local log from the batch holding ``offset`` (None: not readable,
    or the batch there does not start at ``offset``)."""
    holding = [s for s in segments if s.base_offset <= offset][-1:]
    for files in holding:
        try:
            with LogSegment.open(files) as seg:
                batch = seg.find_batch(offset)
                if batch is None or batch.base_offset != offset:
                    return None
                return bytes(seg.buffer[batch.position : batch.position + length])
        except (OSError, RlmError):
            return None  # unreadable or corrupt: the broken-files checks report that, not this
    return None


def log_end_conflict(leo: int | None, highest_tiered: int) -> str | None:
    """The cheap half of :func:`lineage_conflict`: the log ends at or below what was tiered."""
    if highest_tiered < 0 or leo is None or leo > highest_tiered:
        return None
    return (
        f"the local log ends at offset {leo}, at or below the highest tiered offset "
        f"{highest_tiered}: the partition was re-created (or truncated below what was tiered); "
        "the tiered data is not this log's and is not served (docs/topic-identity.md)"
    )


def lineage_conflict(
    segments: Sequence[SegmentFiles],
    manifests: Sequence[SegmentManifest],
    highest_tiered: int,
    head: SegmentHead,
) -> str | None:
    """Why the tiered data cannot be this log's, or None when nothing contradicts it.

    Two signals: the log ends at or below ``highest_tiered``; or the first batch of the newest
    tiered segment that is still local differs, byte for byte over its header (which includes the
    batch CRC), from the same offset in the local log. One ranged read of the store (two for a
    protected segment: its entries object, then its first entry).
    """
    leo = log_end_offset(segments)
    ended = log_end_conflict(leo, highest_tiered)
    if ended is not None or leo is None or not segments:
        return ended
    local_start = segments[0].base_offset
    probe = next((m for m in reversed(manifests) if local_start <= m.base_offset < leo), None)
    if probe is None:
        return None  # nothing tiered is still local: nothing to compare
    remote = head(probe, PROBE_BYTES)
    if len(remote) < 12:
        return None
    first = int.from_bytes(remote[:8], "big", signed=True)
    length = min(len(remote), 12 + int.from_bytes(remote[8:12], "big", signed=True))
    local = _local_bytes(segments, first, length)
    if local == remote[:length]:
        return None
    return (
        f"the local batch at offset {first} differs from the tiered one (segment "
        f"{probe.base_offset}-{probe.last_offset}, {probe.log.key}): the partition was re-created "
        "under the same name; the tiered data is not this log's and is not served "
        "(docs/topic-identity.md)"
    )


def _token_in(marker: Path) -> str | None:
    try:
        return marker.read_text(encoding="ascii").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


#: The read path checks the token on every Fetch (:func:`served_progress`): the marker is read
#: again only when its stat signature changed (a directory re-created gets a new marker file).
_TOKENS: FileMemo[str | None] = FileMemo(_token_in)


#: Partition directory → its marker's path, built (and hashed: the memo's key) once rather than per
#: Fetch. A function of the name only; at most this many (then it starts over).
_MARKERS: dict[Path, Path] = {}
_MAX_MARKERS = 65_536


def read_dir_token(path: Path) -> str | None:
    """The token rlm left in the partition directory ``path`` (None: none, or unreadable)."""
    marker = _MARKERS.get(path)
    if marker is None:
        if len(_MARKERS) >= _MAX_MARKERS:
            _MARKERS.clear()
        marker = _MARKERS[path] = path / DIR_MARKER
    return _TOKENS.get(marker)


def mark_dir(ctx: PartitionContext) -> None:
    """Remember this directory (after its lineage was checked): reuse its token or leave one."""
    token = read_dir_token(ctx.part.path)
    if token is None:
        token = secrets.token_hex(8)
        atomic_write(ctx.part.path / DIR_MARKER, token.encode("ascii"))
    ctx.dir_token = token


def same_dir(ctx: PartitionContext) -> bool:
    """False when the directory was replaced since recovery (its token is gone or another)."""
    return ctx.dir_token is None or read_dir_token(ctx.part.path) == ctx.dir_token


def _root(ctx: PartitionContext, topic_id: str | None) -> RemoteState:
    """The remote state of the partition's root ``topic_id`` (None = the name-only root)."""
    return RemoteState(
        ctx.shared.backend, ctx.topic, ctx.partition, topic_id, protection=ctx.shared.protection
    )


def check_lineage(ctx: PartitionContext, manifests: Sequence[SegmentManifest], highest: int) -> None:
    """Set ``ctx.identity_conflict``; raise :class:`IdentityConflictError` when there is one."""
    conflict = lineage_conflict(list_segments(ctx.part), manifests, highest, _root(ctx, None).segment_head)
    ctx.identity_conflict = conflict
    if conflict is not None:
        raise IdentityConflictError(conflict, file=ctx.part.path)


# --------------------------------------------------------------------------------------------
# which root is ours: adoption of the name-only root


def _migrate_state(ctx: PartitionContext) -> None:
    """Move the name-only state dir to the adopting incarnation's (once; crash-safe by rename)."""
    legacy = ctx.state_dir.parent / ctx.part.name
    if legacy == ctx.state_dir or not legacy.is_dir():
        return
    target = ctx.state_dir
    if target.exists():
        if any(p.is_file() for p in target.rglob("*")):
            return  # the id's own state already holds something: never overwrite it
        shutil.rmtree(target)
    legacy.rename(target)
    log.info(
        "%s: moved the name-only state %s to %s (adopted by topic id %s)",
        ctx.part.name,
        legacy,
        target,
        ctx.part.topic_id,
    )


def resolve_root(ctx: PartitionContext, *, decide: bool) -> None:
    """Set ``ctx.key_id`` (None = the name-only root holds this incarnation's data).

    With ``decide`` (recovery only) an undecided name-only root is adopted or retired now and the
    decision written to the store; without it (status, GC) nothing is written or moved.
    """
    topic_id = ctx.part.topic_id
    if topic_id is None:
        ctx.key_id = None
        return
    # Decided in a local first: a store error below must not leave ctx on a half-decided root.
    owner = _root(ctx, None).read_marker(object_keys.OWNER_MARKER)
    if owner is None and decide:
        owner = _decide_adoption(ctx)
    adopted = owner is not None and owner.get("topic_id") == topic_id
    ctx.key_id = None if adopted else topic_id
    if adopted and decide:
        _migrate_state(ctx)


def _decide_adoption(ctx: PartitionContext) -> dict[str, Any] | None:
    """Adopt the name-only root when it has data consistent with the local log, else retire it."""
    legacy = _root(ctx, None)
    if legacy.has_marker(object_keys.RETIRED_MARKER):
        return None
    manifests = legacy.list_manifests()
    legacy_progress = Progress.load(ctx.state_dir.parent / ctx.part.name / PROGRESS_FILE)
    highest = max(manifests[-1].last_offset if manifests else -1, legacy_progress.highest_tiered_offset)
    if highest < 0:
        return None  # nothing was tiered under the name: this incarnation uses its own root
    now = ctx.shared.clock_ms()
    own = _root(ctx, ctx.part.topic_id)
    if own.manifest_keys(own.list_prefix(object_keys.manifests_prefix(ctx.topic, ctx.partition, own.key_id))):
        # This incarnation already tiered under its own root: adopting now would split one log
        # over two roots (and make its own root look like an old incarnation to GC).
        conflict: str | None = (
            f"topic id {ctx.part.topic_id} already has segments under its own root; "
            "the data tiered under the name is another log's"
        )
    else:
        conflict = lineage_conflict(list_segments(ctx.part), manifests, highest, legacy.segment_head)
    if conflict is None:
        owner = legacy.create_marker(
            object_keys.OWNER_MARKER, {"topic_id": ctx.part.topic_id, "adopted_ms": now}
        )
        log.info(
            "%s: topic id %s adopted the data tiered under the name (up to offset %d)",
            ctx.part.name,
            ctx.part.topic_id,
            highest,
        )
        return owner
    legacy.create_marker(
        object_keys.RETIRED_MARKER, {"retired_by": ctx.part.topic_id, "retired_ms": now, "reason": conflict}
    )
    log.warning(
        "%s: the data tiered under the name is not topic id %s's: %s",
        ctx.part.name,
        ctx.part.topic_id,
        conflict,
    )
    return None


def served_progress(
    part: PartitionDir, progress: Progress, segments: Sequence[SegmentFiles] | None = None
) -> Progress:
    """The progress readers may use for ``part``: nothing tiered when the identity is unknown
    (malformed ``partition.metadata``), the progress is another incarnation's, a lineage conflict
    was recorded, or the local log ends at or below what it says was tiered (a re-created
    partition the daemon has not looked at yet)."""
    if progress.highest_tiered_offset < 0:
        return progress
    if (
        part.identity_error is not None
        or progress.lineage_conflict is not None
        or (progress.topic_id is not None and progress.topic_id != part.topic_id)
        or (progress.dir_token is not None and read_dir_token(part.path) != progress.dir_token)
    ):
        return Progress(topic_id=part.topic_id)
    if part.topic_id is not None:
        # A re-created partition has a new id (caught above); a replica whose log ends below what
        # another replica's leader tiered is normal in a cluster (docs/cluster.md).
        return progress
    segments = list_segments(part) if segments is None else segments
    if log_end_conflict(log_end_offset(segments), progress.highest_tiered_offset) is not None:
        return Progress(topic_id=part.topic_id)
    return progress


def persisted_progress(
    settings: TieringSettings, part: PartitionDir, load: Callable[[Path], Progress] = Progress.load
) -> Progress:
    """What readers without a live daemon may use for ``part``: the progress the daemon persisted
    for it (``load`` reads the file; readers pass a memo), as :func:`served_progress` allows."""
    return served_progress(part, load(state_dir(settings, part) / PROGRESS_FILE))


def before_pass(ctx: PartitionContext) -> None:
    """Refuse a partition whose identity is unknown; recover again a directory that was deleted
    and created again since the last recovery (its :data:`DIR_MARKER` token is gone)."""
    if ctx.part.identity_error is not None:
        raise PartitionMetadataError(ctx.part.identity_error)
    if ctx.recovered and not same_dir(ctx):
        ctx.recovered = False


def check_log_end(ctx: PartitionContext, segments: Sequence[SegmentFiles]) -> None:
    """The per-pass half of :func:`check_lineage` (no store read): a log that now ends at or below
    the highest tiered offset raises :class:`IdentityConflictError` and needs recovery again."""
    if ctx.shared.cluster:
        return  # a replica's log may end below what a leader tiered; epochs decide (docs/cluster.md)
    conflict = log_end_conflict(log_end_offset(segments), ctx.progress.highest_tiered_offset)
    if conflict is not None:
        ctx.identity_conflict = conflict
        ctx.recovered = False
        ctx.save_progress()
        raise IdentityConflictError(conflict, file=ctx.part.path)
