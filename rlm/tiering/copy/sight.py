"""Pin on sight (docs/architecture.md §5.1): hold every rolled, committed segment not yet
tiered from the pass that first sees it until it is tiered, so the broker's retention (a rename to
``.deleted``, an unlink after ``file.delete.delay.ms``) cannot take its bytes first.

Each pass reconciles the partition's sight pins with its pending segments (:func:`hold`): pins of
segments no longer pending (tiered, below the DeleteRecords point, quarantined, merged by the
cleaner into a tiered one) are dropped; pending segments not yet pinned are pinned in base-offset
order — the same hard links a copy takes (:func:`rlm.tiering.copy.prepare.pin`: ``.log``, ``.index``,
``.timeindex``, ``.txnindex``, the producer snapshot and the leader-epoch checkpoint as it was) —
while they fit ``tiering.max_pinned_bytes`` (rlm.tiering.local.pin_ledger). A segment whose broker files
are gone but whose pin exists stays pending (:func:`pinned_only`) and its copy reads the pin: it is
tiered exactly as if the broker still had it. Only the partition's leader pins; every node drops
the pins of what was tiered. Offsets are Kafka's; sizes bytes.
"""

from __future__ import annotations

import bisect
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from rlm.errors import RlmError, SegmentVanished
from rlm.fsutil import fsync_dir, write_durable
from rlm.logdir.discovery import SegmentFiles, list_segments
from rlm.tiering.copy import prepare
from rlm.tiering.local import PIN_FILE, PartitionContext, Progress, SightPin, linked_files
from rlm.tiering.store import object_keys

__all__ = ["drop", "hold", "hold_unloaded", "pinned_only", "release_tiered"]

log = logging.getLogger(__name__)

#: (segment, its next base, the offset it is copied from): a pending segment, as
#: rlm.tiering.copy.copy_pass.PendingSegment is.
Pending = tuple[SegmentFiles, int, int]


def hold(ctx: PartitionContext, pending: Sequence[Pending], *, pin_new: bool) -> None:
    """Keep exactly the pins of ``pending`` (quarantined segments and those tiered meanwhile
    excepted) and, with ``pin_new`` (the leader), pin the ones not yet held, oldest first, until
    the bound refuses one."""
    ledger = ctx.shared.pins
    for leftover in ledger.leftovers(ctx.state_dir):  # a pin a crash cut short
        shutil.rmtree(leftover, ignore_errors=True)
    highest = ctx.progress.highest_tiered_offset
    pending = [p for p in pending if p[1] - 1 > highest and p[0].base_offset not in ctx.quarantined]
    wanted = {p[0].base_offset for p in pending}
    held = ledger.pins_of(ctx.state_dir)
    for base, pin in held.items():
        if base not in wanted:
            ledger.release(pin)
    if not pin_new or ledger.bound == 0:
        return
    for seg, next_base, _from in pending:
        if seg.base_offset in held:
            continue
        try:
            fits = _pin_one(ctx, seg, next_base)
        except OSError as err:  # pinning is a safeguard: the copy still runs without it
            log.warning("%s: could not pin segment %d: %s", ctx.part.name, seg.base_offset, err)
            return
        if not fits:
            ledger.refused(ctx.state_dir, ctx.part.log_dir, seg.base_offset, seg.size)
            return
    ledger.satisfied(ctx.state_dir, ctx.part.log_dir)


def hold_unloaded(
    ctx: PartitionContext, pending_of: Callable[[list[SegmentFiles], Progress], Sequence[Pending]]
) -> None:
    """:func:`hold` in a pass whose state did not load (the store down at a restart or after a
    failed pass): against the persisted progress; ``pending_of(listing, progress)`` is the pass's
    pending rule. Never raises: the pass fails with its own error."""
    saved = Progress.load(ctx.progress_path)
    if saved.lineage_conflict is not None:
        return  # the tiered data is not this log's (docs/topic-identity.md): nothing is copied
    try:
        hold(ctx, pending_of(list_segments(ctx.part), saved), pin_new=True)
    except (RlmError, OSError) as err:
        log.warning("%s: pinning on sight failed: %s", ctx.part.name, err)


def _pin_one(ctx: PartitionContext, seg: SegmentFiles, next_base: int) -> bool:
    """Pin one segment; False when it does not fit the bound. A segment the broker deleted before
    it could be pinned is left to the copy, which counts it (True: nothing to hold)."""
    ledger = ctx.shared.pins
    room = ledger.room(ctx.part.log_dir)
    if room is not None and seg.size > room:
        return False  # cannot fit: not even linked
    staged = ctx.pins_dir / f"{seg.base_offset:020d}.tmp"
    shutil.rmtree(staged, ignore_errors=True)
    try:
        pinned = prepare.pin(seg, ctx.part.path, staged)
    except SegmentVanished:
        return True
    epochs = pinned.get(object_keys.LEADER_EPOCHS)
    if epochs is not None:  # the partition's, rewritten as the log start moves: kept as it is now
        _own_copy(epochs)
    pin = SightPin(
        ctx.state_dir,
        ctx.part.log_dir,
        ctx.part.path,
        seg.base_offset,
        next_base,
        ctx.shared.clock_ms(),
        linked_files(staged),
    )
    try:
        # staged is published whole by admit's rename: pin.json needs no rename of its own, and
        # the fsync of staged makes its links and pin.json durable before that rename
        write_durable(staged / PIN_FILE, pin.to_json())
        fsync_dir(staged)
        if ledger.admit(pin, staged):  # the exact check, on the linked inodes
            return True
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    shutil.rmtree(staged, ignore_errors=True)
    return False


def _own_copy(path: Path) -> None:
    """Replace the hard link ``path`` by a copy of its bytes (a few bytes: the leader-epoch
    checkpoint). Kafka renames a new checkpoint over the old one, which a link survives too; a copy
    does not depend on that."""
    tmp = path.with_name(path.name + ".copy")
    tmp.write_bytes(path.read_bytes())
    os.replace(tmp, path)


def pinned_only(
    ctx: PartitionContext, segments: Sequence[SegmentFiles], progress: Progress
) -> list[tuple[SegmentFiles, int]]:
    """Segments the broker deleted whose pins hold them and which are still to be tiered: each
    under its broker names (the files are gone) with its next base. A pin is left out once its
    offsets are tiered, below the DeleteRecords point, or reach the first listed segment: retention
    deletes from the start, so only a pin below it holds what retention took; one inside the
    listed offsets was merged by the cleaner (the listed file is what is copied) or truncated away
    by an unclean leader election (not part of the log any more)."""
    pins = ctx.shared.pins.pins_of(ctx.state_dir)
    if not pins:
        return []
    listed = [s.base_offset for s in segments]
    found = []
    for base, pin in sorted(pins.items()):
        if pin.next_base - 1 <= progress.highest_tiered_offset:
            continue
        if pin.next_base <= progress.delete_records_offset:
            continue
        at = bisect.bisect_right(listed, base) - 1
        if at >= 0 or (listed and pin.next_base > listed[0]):
            continue  # listed, or inside a listed segment's offsets
        found.append((pin.original(), pin.next_base))
    return found


def release_tiered(ctx: PartitionContext) -> None:
    """Drop the pins whose offsets are all tiered now (right after a commit)."""
    highest = ctx.progress.highest_tiered_offset
    ledger = ctx.shared.pins
    for pin in ledger.pins_of(ctx.state_dir).values():
        if pin.next_base - 1 <= highest:
            ledger.release(pin)


def drop(ctx: PartitionContext, base: int) -> None:
    """Drop the pin of segment ``base`` (quarantined: its bytes are damaged, and once the broker
    removes its file the partition goes on past it, docs/broker-files.md)."""
    pin = ctx.shared.pins.pins_of(ctx.state_dir).get(base)
    if pin is not None:
        ctx.shared.pins.release(pin)
