"""Steps 1–2 of a copy (docs/architecture.md §3): pin a rolled segment, checksum it (every
batch's CRC and the file's CRC-32C), check or rebuild its indexes, and for a partial copy cut it to
its tail — everything before the first durable step. :func:`prepare_segment` does them all;
:mod:`rlm.tiering.copy.copier` uploads the result.

Nothing here writes outside the pin dir: the broker's files are hard-linked and only read, and
every replacement (a rebuilt index, a cut tail) is a new inode in the pin dir. A segment that fails
its checksum walk is :class:`SegmentQuarantined` (docs/broker-files.md); one the log store deleted first
is :class:`SegmentVanished`.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from rlm.errors import (
    CorruptIndexError,
    FormatError,
    LogDirError,
    PinRoomExhausted,
    SegmentQuarantined,
    SegmentVanished,
)
from rlm.formats.indexes.remote_index import RemoteLogIndexEntry, build_entries
from rlm.formats.indexes.segment_index import rebuild_indexes
from rlm.formats.records import RecordBatch, iter_batches
from rlm.formats.records.scan import batches_crc32c
from rlm.logdir.discovery import LEADER_EPOCH_CHECKPOINT, SegmentFiles
from rlm.logdir.indexcheck import (
    FileVersion,
    IndexKind,
    file_version,
    fstat_version,
    note_rebuilt,
    parse_checked,
)
from rlm.tiering.copy.txn_capture import TxnCapture, capture_txn_index
from rlm.tiering.local import PartitionContext, PinClaim, crash_point
from rlm.tiering.store import object_keys

log = logging.getLogger(__name__)

__all__ = [
    "ChecksummedSegment",
    "PinnedSegment",
    "PreparedSegment",
    "SegmentQuarantined",
    "SegmentVanished",
    "check_indexes",
    "checksum_segment",
    "data_key",
    "pin",
    "pin_segment",
    "prepare_segment",
    "verify_pinned",
]


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError as err:
        if err.errno != errno.EXDEV:
            raise
        shutil.copy2(src, dst)  # staging on another file system: a copy pins just as well


def pin(segment: SegmentFiles, partition_dir: Path, pin_dir: Path) -> dict[str, Path]:
    """Hard-link the segment's files into ``pin_dir``; role → pinned path.

    The ``.log`` may already be renamed ``.log.deleted`` by the store: that name is tried too.
    Raises :class:`SegmentVanished` when the ``.log`` is gone entirely. Optional companions
    (indexes, snapshot, leader-epoch checkpoint) are pinned when present.
    """
    pin_dir.mkdir(parents=True, exist_ok=True)
    roles = {
        object_keys.LOG: segment.log,
        object_keys.OFFSET_INDEX: segment.index,
        object_keys.TIME_INDEX: segment.time_index,
        object_keys.PRODUCER_SNAPSHOT: segment.snapshot,
        object_keys.TXN_INDEX: segment.txn_index,
        object_keys.LEADER_EPOCHS: partition_dir / LEADER_EPOCH_CHECKPOINT,
    }
    pinned: dict[str, Path] = {}
    for role, src in roles.items():
        if src is None:
            continue
        dst = pin_dir / role
        for candidate in (src, src.with_name(src.name + ".deleted")):
            try:
                _link_or_copy(candidate, dst)
                pinned[role] = dst
                break
            except FileNotFoundError:
                continue
    if object_keys.LOG not in pinned:
        shutil.rmtree(pin_dir, ignore_errors=True)
        raise SegmentVanished(
            "segment deleted by the log store before it was copied",
            file=segment.log,
            offset=segment.base_offset,
        )
    return pinned


def _empty(log_path: Path, version: FileVersion) -> SegmentQuarantined:
    """A rolled ``.log`` of 0 bytes. Kafka never rolls an empty segment (it replaces one at the
    same base), so it was truncated on disk: its offsets exist nowhere else."""
    return SegmentQuarantined(
        "rolled segment's .log is empty (0 bytes)", cause="empty", file=log_path, position=0, version=version
    )


def _corrupt(err: FormatError, log_path: Path, version: FileVersion) -> SegmentQuarantined:
    """A batch of ``log_path`` that fails its CRC or framing, at ``err``'s byte position."""
    return SegmentQuarantined(
        f"corrupt segment: {err.reason}",
        file=log_path,
        position=err.position,
        offset=err.offset,
        version=version,
    )


@dataclass(frozen=True, slots=True)
class ChecksummedSegment:
    batches: list[RecordBatch]
    size: int
    crc32c: int


def checksum_segment(log_path: Path) -> ChecksummedSegment:
    """CRC-verify every batch; a rolled segment that is empty, ends with a torn tail or has a bad
    CRC is corrupt (:class:`SegmentQuarantined`, naming the byte position)."""
    with log_path.open("rb") as fh:
        version = fstat_version(fh.fileno())
        size = fh.seek(0, 2)
        if size == 0:
            raise _empty(log_path, version)
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            batches: list[RecordBatch] = []
            add = batches.append
            try:
                # A Python loop, not list(): the C walk yields the GIL at the interpreter's switch
                # interval (5 ms) instead of holding it for the whole segment (~25 ms per 128 MiB,
                # 130 ms cold) while the upload's part threads wait for it (#35).
                for batch in iter_batches(buf, verify_crc=True):
                    add(batch)
            except FormatError as err:
                raise _corrupt(err, log_path, version) from err
            valid = batches[-1].position + batches[-1].size if batches else 0
            if valid != size:
                raise SegmentQuarantined(
                    f"rolled segment ends with {size - valid} bytes that are not a complete batch",
                    cause="torn_tail",
                    file=log_path,
                    position=valid,
                    version=version,
                )
            checksum = batches_crc32c(buf, batches)  # the batches start at 0 and end at size
    return ChecksummedSegment(batches, size, checksum)


_INDEX_ROLES: tuple[tuple[str, IndexKind], ...] = (
    (object_keys.OFFSET_INDEX, "index"),
    (object_keys.TIME_INDEX, "timeindex"),
)


def check_indexes(
    ctx: PartitionContext, segment: SegmentFiles, pinned: dict[str, Path], checksummed: ChecksummedSegment
) -> None:
    """Check the pinned ``.index`` / ``.timeindex`` against the checksummed batches (docs/broker-files.md);
    a failed or missing one is replaced in the pin dir by the index Kafka's ``recover`` would
    build, so the rebuild is what gets uploaded. The broker's own files are never written."""
    rebuilt: tuple[bytes, bytes] | None = None
    interval = ctx.shared.index_interval_bytes
    for n, (role, kind) in enumerate(_INDEX_ROLES):
        path = pinned.get(role)
        original = segment.index if kind == "index" else segment.time_index
        try:
            if path is None:
                raise FileNotFoundError(role)
            raw = path.read_bytes()
            index = parse_checked(kind, segment.base_offset, raw, checksummed.batches)
            if index.valid_bytes == len(raw):
                continue
            data = raw[: index.valid_bytes]  # a rolled index is trimmed (Kafka's trimToValidSize)
        except FileNotFoundError:
            log.info("%s: no %s file; uploading one rebuilt from the .log", segment.log, kind)
            rebuilt = rebuilt or rebuild_indexes(segment.base_offset, checksummed.batches, interval)
            data = rebuilt[n]
        except CorruptIndexError as err:
            assert path is not None
            note_rebuilt(original or path, err, file_version(path))
            rebuilt = rebuilt or rebuild_indexes(segment.base_offset, checksummed.batches, interval)
            data = rebuilt[n]
        target = path or pinned[object_keys.LOG].with_name(role)
        tmp = target.with_name(target.name + ".rebuilt")
        tmp.write_bytes(data)
        os.replace(tmp, target)  # a new inode: the hard link to the broker's file is dropped, not written
        pinned[role] = target


@dataclass(slots=True)
class PinnedSegment:
    """A segment pinned for its copy (step 1; nothing durable yet besides the pin, which recovery
    drops): :func:`pin_segment` makes one, :func:`verify_pinned` checksums it.

    ``source_position`` is set for a partial copy (docs/cluster-copy.md): the pinned ``.log`` is
    then the tail of the segment file from that byte.
    """

    segment: SegmentFiles
    attempt: str
    pin_dir: Path
    pinned: dict[str, Path]
    claim: PinClaim
    source_position: int | None = None
    version: FileVersion | None = None  # of the broker's file, when the pinned .log is a cut tail

    def discard(self) -> None:
        shutil.rmtree(self.pin_dir, ignore_errors=True)
        self.claim.release()


@dataclass(slots=True)
class PreparedSegment:
    """A pinned and checksummed segment, ready to upload (steps 1–2 of the protocol; nothing durable
    yet besides the pin, which recovery drops). :func:`prepare_segment` makes one.

    ``source_position`` is set for a partial copy (docs/cluster-copy.md): the pinned ``.log`` is
    then the tail of the segment file from that byte, and ``checksummed`` describes the tail only.
    ``entries`` are the copy's remote index entries, naming the attempt's ``.log`` object (built
    here, ahead of the upload, off the copy's critical path); empty when there is no batch.
    """

    segment: SegmentFiles
    attempt: str
    pin_dir: Path
    pinned: dict[str, Path]
    checksummed: ChecksummedSegment
    source_position: int | None = None
    txn: TxnCapture | None = None  # the aborted transactions to upload (docs/transactions.md)
    claim: PinClaim | None = None  # the pin's bytes in the log dir's account (rlm.tiering.local.pin_ledger)
    entries: list[RemoteLogIndexEntry] = field(default_factory=list)

    @property
    def base_offset(self) -> int:
        """The base offset the copy is named by: the segment file's, or for a partial copy the
        first uploaded batch's (a whole segment keeps its file base even when compaction left its
        first batch above it)."""
        if self.source_position is None or not self.checksummed.batches:
            return self.segment.base_offset
        return self.checksummed.batches[0].base_offset

    def discard(self) -> None:
        shutil.rmtree(self.pin_dir, ignore_errors=True)
        if self.claim is not None:
            self.claim.release()


def data_key(ctx: PartitionContext, base: int, attempt: str, name: str) -> str:
    """The store key of object ``name`` (an ``object_keys`` role) of copy attempt ``attempt`` of
    the segment named by ``base``."""
    return object_keys.data_key(ctx.topic, ctx.partition, base, attempt, name, ctx.key_id)


def _cut_tail(segment: SegmentFiles, pinned: dict[str, Path], from_offset: int) -> tuple[int, FileVersion]:
    """Replace the pinned ``.log`` by its tail from the first batch whose base offset is at least
    ``from_offset``; return that byte position and the version of the segment file.

    The tail is written to a new file in the pin dir (the broker's file, hard-linked there, is only
    read). A batch holding ``from_offset - 1`` and ``from_offset`` both means this replica's batches
    are not the ones that were tiered: :class:`LogDirError`, never a silent skip. Framing errors
    before the cut quarantine the segment like any corrupt segment.
    """
    highest = from_offset - 1
    src = pinned[object_keys.LOG]
    with src.open("rb") as fh:
        version = fstat_version(fh.fileno())
        size = fh.seek(0, 2)
        if size == 0:
            raise _empty(segment.log, version)
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            position = size
            try:
                for batch in iter_batches(buf, verify_crc=False):
                    if batch.base_offset > highest:
                        position = batch.position
                        break
                    if batch.last_offset > highest:
                        raise LogDirError(
                            f"batch {batch.base_offset}-{batch.last_offset} holds both the highest tiered "
                            f"offset {highest} and the offsets after it: this replica's batches are not "
                            "the ones that were tiered (the lineages disagree); not copying from it",
                            file=segment.log,
                            position=batch.position,
                            offset=batch.base_offset,
                        )
            except FormatError as err:
                raise _corrupt(err, segment.log, version) from err
        tail = src.with_name(src.name + ".tail")
        fh.seek(position)
        with tail.open("wb") as out:
            shutil.copyfileobj(fh, out, 1 << 20)  # streamed: a segment may be 1 GiB
    os.replace(tail, src)  # a new inode: the hard link to the broker's file is dropped, not written
    return position, version


def _tail_indexes(ctx: PartitionContext, pinned: dict[str, Path], checksummed: ChecksummedSegment) -> None:
    """``.index`` / ``.timeindex`` for the uploaded tail, rebuilt as Kafka's ``recover`` would for a
    segment holding exactly those batches (the broker's indexes describe the whole file)."""
    if not checksummed.batches:
        return
    built = rebuild_indexes(
        checksummed.batches[0].base_offset, checksummed.batches, ctx.shared.index_interval_bytes
    )
    for (role, _), data in zip(_INDEX_ROLES, built, strict=True):
        target = pinned[object_keys.LOG].with_name(role)
        tmp = target.with_name(target.name + ".rebuilt")
        tmp.write_bytes(data)
        os.replace(tmp, target)  # replaces the pinned hard link (if any): the broker's file is untouched
        pinned[role] = target


def prepare_segment(
    ctx: PartitionContext, segment: SegmentFiles, from_offset: int | None = None
) -> PreparedSegment:
    """Pin and checksum one segment (:func:`pin_segment`, then :func:`verify_pinned`). The manager
    runs this for the next segment while the current one uploads, so the CRC-verifying walk
    overlaps the network instead of adding to it. Raises as those two do; the pin is then dropped.
    """
    pinned = pin_segment(ctx, segment, from_offset)
    try:
        return verify_pinned(ctx, pinned)
    except BaseException:
        pinned.discard()
        raise


def pin_segment(
    ctx: PartitionContext, segment: SegmentFiles, from_offset: int | None = None
) -> PinnedSegment:
    """Pin one segment for a new copy attempt (step 1).

    ``from_offset`` above the segment's base makes a partial copy (docs/cluster-copy.md): the
    pinned ``.log`` is cut to the batches from the first one with base offset ≥ ``from_offset``.
    Raises :class:`SegmentVanished`, :class:`PinRoomExhausted`, or :class:`SegmentQuarantined` /
    :class:`LogDirError` from the cut; the pin is then dropped.
    """
    attempt = object_keys.new_attempt_id(ctx.shared.clock_ms())
    pin_dir = ctx.staging_dir / f"{segment.base_offset:020d}-{attempt}"
    pinned, claim = _pin_for_copy(ctx, segment, pin_dir)
    crash_point("after_pin")
    try:
        if from_offset is not None and from_offset > segment.base_offset:
            position, version = _cut_tail(segment, pinned, from_offset)
            return PinnedSegment(segment, attempt, pin_dir, pinned, claim, position, version)
    except BaseException:
        shutil.rmtree(pin_dir, ignore_errors=True)
        claim.release()
        raise
    return PinnedSegment(segment, attempt, pin_dir, pinned, claim)


def verify_pinned(ctx: PartitionContext, pin: PinnedSegment) -> PreparedSegment:
    """Checksum a pinned segment (step 2): CRC-verify every batch, check or rebuild its indexes
    (for a partial copy: build them for the tail), capture its aborted transactions, build its
    remote index entries. Raises :class:`SegmentQuarantined` naming the broker's file; the pin
    is left to the caller (the ``.log`` may still be uploading from it)."""
    segment, pinned, position = pin.segment, pin.pinned, pin.source_position
    try:
        if position is not None and pinned[object_keys.LOG].stat().st_size == 0:
            checksummed = ChecksummedSegment([], 0, 0)  # no batch at or above from_offset: nothing to copy
        else:
            checksummed = checksum_segment(pinned[object_keys.LOG])
    except SegmentQuarantined as err:
        named = err.in_file(segment.log, base_position=position or 0)  # the broker's file, not the pin
        if pin.version is not None:
            cast(SegmentQuarantined, named).version = pin.version  # the quarantine follows the broker's file
        raise named from err
    if position is None:
        check_indexes(ctx, segment, pinned, checksummed)
    else:
        _tail_indexes(ctx, pinned, checksummed)
    prep = PreparedSegment(segment, pin.attempt, pin.pin_dir, pinned, checksummed, position, None, pin.claim)
    if checksummed.batches:
        prep.txn = capture_txn_index(segment, pinned, checksummed.batches, position)
        prep.entries = build_entries(
            checksummed.batches,
            object_url=ctx.shared.backend.url(data_key(ctx, prep.base_offset, pin.attempt, object_keys.LOG)),
            index_entry_bytes=ctx.shared.settings.index_entry_bytes,
        )
    return prep


def _pin_for_copy(
    ctx: PartitionContext, segment: SegmentFiles, pin_dir: Path
) -> tuple[dict[str, Path], PinClaim]:
    """Pin the broker's files for the copy or, once the broker deleted them, the files its sight
    pin holds (rlm.tiering.copy.sight), and count them in the log dir's pinned bytes. Raises
    :class:`SegmentVanished` when neither has the ``.log``, :class:`PinRoomExhausted` when the
    pin must wait for room (rlm.tiering.local.pin_ledger)."""
    held = ctx.shared.pins.pins_of(ctx.state_dir).get(segment.base_offset)
    try:
        pinned = pin(segment, ctx.part.path, pin_dir)
    except SegmentVanished:
        if held is None:
            raise
        pinned = pin(held.held(), held.path, pin_dir)
        log.info("%s: segment deleted by the log store; copying it from its pin %s", segment.log, held.path)
    epochs = held.path / object_keys.LEADER_EPOCHS if held is not None else None
    try:
        if epochs is not None and epochs.exists():
            # The leader-epoch checkpoint as it was when the segment was first seen, committed: the
            # broker's own is truncated from the start as its log start moves past the segment
            # (Kafka's truncateFromStart), which moves the first epoch's start offset up.
            replaced = pin_dir / object_keys.LEADER_EPOCHS
            replaced.unlink(missing_ok=True)
            _link_or_copy(epochs, replaced)
            pinned[object_keys.LEADER_EPOCHS] = replaced
        claim = ctx.shared.pins.claim_copy(ctx.part.log_dir, pin_dir)
    except BaseException:
        shutil.rmtree(pin_dir, ignore_errors=True)
        raise
    if claim is None:
        shutil.rmtree(pin_dir, ignore_errors=True)
        raise PinRoomExhausted(
            "waiting for room under tiering.max_pinned_bytes to pin the segment for its copy",
            file=segment.log,
            offset=segment.base_offset,
        )
    return pinned, claim
