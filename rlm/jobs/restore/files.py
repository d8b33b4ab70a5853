"""The files ``rlm restore`` writes into one partition directory (docs/restore.md).

:func:`restore_segment` (one segment, run in parallel) and :func:`finish_partition` turn a
:class:`RestorePlan` (which segments of the store's chain, cut where) into Kafka's files inside a
staging directory: ``<base>.log`` byte-identical to the stored
``segment.log`` (or its batches inside the cut), ``.index`` / ``.timeindex`` (the stored ones, which
the copier checked or rebuilt, else rebuilt here as Kafka's ``LogSegment.recover`` would),
``.txnindex`` and ``.snapshot`` when stored, ``leader-epoch-checkpoint`` and ``partition.metadata``.
Every object is read in ranged chunks, written to disk as it arrives and checked against the size
and CRC-32C its manifest recorded: a mismatch raises :class:`CorruptObjectError` naming the key.
Protected segments (docs/protection.md) are opened through ``RemoteState.protection`` (the one
place stored bytes become plaintext) and their plaintext checked against ``protection.log_crc32c``.

File names are the segment's base offset, 20 digits (docs/formats.md §2.1): the manifest's
``base_offset`` — the local file's base for a whole copy (after compaction it may lie below the
first batch), the first uploaded batch's for a partial copy (docs/cluster-copy.md) — or, when the
head of a segment is cut, the first kept batch's base offset.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import crc32c

from rlm.errors import CorruptObjectError, FormatError, RlmError
from rlm.formats import naming
from rlm.formats.checkpoint import format_leader_epoch_checkpoint
from rlm.formats.indexes.remote_index import RemoteLogIndexEntry
from rlm.formats.indexes.segment_index import rebuild_indexes
from rlm.formats.indexes.txn_index import encode_txn_index, parse_txn_index
from rlm.formats.partition_metadata import format_partition_metadata
from rlm.formats.records import RecordBatch, iter_batches
from rlm.logdir.discovery import LEADER_EPOCH_CHECKPOINT, PARTITION_METADATA
from rlm.tiering.local import crash_point
from rlm.tiering.store import (
    ENTRIES_OBJECT,
    INDEX_OBJECT,
    PRODUCER_SNAPSHOT_OBJECT,
    TIME_INDEX_OBJECT,
    TXN_INDEX_OBJECT,
    Link,
    RemoteState,
    SegmentManifest,
    merged_epochs,
)

__all__ = [
    "CHUNK_BYTES",
    "RestorePlan",
    "RestoredSegment",
    "finish_partition",
    "restore_segment",
]

#: Bytes per ranged read of a stored object (bounds memory whatever the segment size).
CHUNK_BYTES = 8 * 1024 * 1024

#: Called with the number of bytes just written (progress bars).
OnBytes = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class RestorePlan:
    """What to restore of one partition: its ``segments`` in offset order, read through ``state``
    (the incarnation's root); ``log_start`` is the visible log start (DeleteRecords included);
    ``topic_id`` goes into ``partition.metadata`` (None: no file, a name-only partition)."""

    topic: str
    partition: int
    topic_id: str | None
    state: RemoteState
    segments: tuple[Link, ...]
    log_start: int

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True, slots=True)
class RestoredSegment:
    """A segment as written: its file base offset, last offset, ``.log`` size (bytes), whether it
    was cut and whether its indexes were rebuilt here (not the stored ones)."""

    base_offset: int
    last_offset: int
    size: int
    cut: bool
    rebuilt_indexes: bool


def download(state: RemoteState, m: SegmentManifest, path: Path, on_bytes: OnBytes) -> None:
    """Write the segment's plaintext ``.log`` to ``path`` in ranged reads of at most
    :data:`CHUNK_BYTES` (each retried by the state's policy), checking the stored bytes against the
    manifest's size and CRC-32C; a protected segment (docs/protection.md) is opened entry by entry
    through ``state.protection`` and its plaintext checked against ``protection.log_crc32c``."""
    obj = m.log
    stored_crc = plain_crc = written = 0
    with path.open("wb") as fh:
        for start, end, entries in _read_plan(state, m):
            stored = state.read_range(obj.key, start, end)
            if len(stored) != end - start:
                break
            stored_crc = crc32c.crc32c(stored, stored_crc)
            plain = stored if not entries else state.protection.open_entries(m, entries, stored, start)
            fh.write(plain)
            plain_crc = crc32c.crc32c(plain, plain_crc)
            written += len(stored)
            on_bytes(len(stored))
    if written != obj.size:
        raise CorruptObjectError(f"object is {written} bytes, its manifest records {obj.size}", file=obj.key)
    if stored_crc != obj.crc32c:
        raise CorruptObjectError(
            f"CRC-32C 0x{stored_crc:08x} differs from its manifest's 0x{obj.crc32c:08x}", file=obj.key
        )
    if plain_crc != m.content_crc32c:
        raise CorruptObjectError(
            f"the opened segment's CRC-32C 0x{plain_crc:08x} differs from its "
            f"manifest's protection.log_crc32c 0x{m.content_crc32c:08x}",
            file=obj.key,
        )


def _read_plan(state: RemoteState, m: SegmentManifest) -> list[tuple[int, int, list[RemoteLogIndexEntry]]]:
    """``(start, end, entries)`` reads of the stored ``.log``: plain chunks of a plaintext segment
    (no entries to open); for a protected one, runs of whole stored entries up to
    :data:`CHUNK_BYTES` (an entry opens only whole), which must tile the object."""
    size = m.log.size
    if m.protection is None:
        return [(lo, min(size, lo + CHUNK_BYTES), []) for lo in range(0, size, CHUNK_BYTES)]
    reads: list[tuple[int, int, list[RemoteLogIndexEntry]]] = []
    at = 0
    for entry in state.segment_entries(m):
        lo, hi = entry.byte_range
        if lo != at:
            raise CorruptObjectError(
                f"entry {entry.first_offset}-{entry.last_offset} is stored at byte "
                f"{lo}, the previous one ends at {at}: the entries do not tile the "
                "object",
                file=m.objects[ENTRIES_OBJECT].key,
            )
        if reads and hi - reads[-1][0] <= CHUNK_BYTES:
            reads[-1] = (reads[-1][0], hi, [*reads[-1][2], entry])
        else:
            reads.append((lo, hi, [entry]))
        at = hi
    return reads


def read_object(state: RemoteState, m: SegmentManifest, name: str) -> bytes:
    """A small object of the segment (an index, a snapshot), checked against the manifest's size and
    CRC-32C of its stored bytes, then opened (decrypted when the segment is encrypted)."""
    obj = m.objects[name]
    data = state.read_range(obj.key, 0, obj.size) if obj.size else b""
    if len(data) != obj.size:
        raise CorruptObjectError(
            f"object is {len(data)} bytes, its manifest records {obj.size}", file=obj.key
        )
    if crc32c.crc32c(data) != obj.crc32c:
        raise CorruptObjectError(
            f"CRC-32C 0x{crc32c.crc32c(data):08x} differs from its manifest's 0x{obj.crc32c:08x}",
            file=obj.key,
        )
    return state.protection.open_object(m, obj.key, data)


def _batches(path: Path) -> list[RecordBatch]:
    """Every batch of a downloaded ``.log`` (headers; the object CRC already covered the bytes);
    a segment that does not end on a batch boundary is not loadable and is refused."""
    with path.open("rb") as fh:
        size = fh.seek(0, 2)
        if size == 0:
            return []
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            try:
                batches = list(iter_batches(buf, verify_crc=False))
            except FormatError as err:
                raise err.in_file(path) from err
    end = batches[-1].position + batches[-1].size if batches else 0
    if end != size:
        raise CorruptObjectError(
            f"segment ends with {size - end} bytes that are not a complete batch", file=path, position=end
        )
    return batches


def _kept(plan: Link, batches: Sequence[RecordBatch], key: str) -> list[RecordBatch]:
    """The batches inside the plan's offsets. A batch straddling ``first_offset`` means the two
    overlapping links hold different batches (docs/cluster.md): refused, as the read path does."""
    kept = []
    for batch in batches:
        if batch.base_offset < plan.first_offset <= batch.last_offset:
            raise RlmError(
                f"batch {batch.base_offset}-{batch.last_offset} straddles offset "
                f"{plan.first_offset}, where the previous stored segment ends: the "
                "replicas' batches differ (docs/cluster.md)",
                file=key,
                position=batch.position,
            )
        if batch.base_offset >= plan.first_offset and batch.last_offset <= plan.last_offset:
            kept.append(batch)
    return kept


def _write_indexes(directory: Path, base: int, batches: Sequence[RecordBatch], interval: int) -> None:
    index, time_index = rebuild_indexes(base, batches, interval)
    (directory / naming.segment_file_name(base, naming.INDEX)).write_bytes(index)
    (directory / naming.segment_file_name(base, naming.TIME_INDEX)).write_bytes(time_index)


def _write_txn_index(state: RemoteState, m: SegmentManifest, path: Path, below: int | None) -> None:
    """The stored ``.txnindex``; ``below``: drop entries ending at or above it (Kafka's
    ``TransactionIndex.truncateTo``) for a segment cut at its tail."""
    obj = m.objects.get(TXN_INDEX_OBJECT)
    if obj is None:
        return
    data = read_object(state, m, TXN_INDEX_OBJECT)
    if below is not None:
        try:
            entries = parse_txn_index(data)
        except FormatError as err:
            raise err.in_file(obj.key) from err
        data = encode_txn_index(e for e in entries if e.last_offset < below)
    if data:
        path.write_bytes(data)


def restore_segment(
    state: RemoteState, plan: Link, directory: Path, interval: int, on_bytes: OnBytes
) -> RestoredSegment | None:
    """Write one segment's files into ``directory``; None when the cut leaves no batch."""
    done = _restore_segment(state, plan, directory, interval, on_bytes)
    crash_point("restore_after_segment")
    return done


def _restore_segment(
    state: RemoteState, plan: Link, directory: Path, interval: int, on_bytes: OnBytes
) -> RestoredSegment | None:
    m = plan.manifest
    base = m.base_offset
    log_path = directory / naming.segment_file_name(base, naming.LOG)
    download(state, m, log_path, on_bytes)
    if plan.whole:
        missing = [n for n, name in enumerate((INDEX_OBJECT, TIME_INDEX_OBJECT)) if name not in m.objects]
        rebuilt = rebuild_indexes(base, _batches(log_path), interval) if missing else None
        for n, (name, suffix) in enumerate(
            ((INDEX_OBJECT, naming.INDEX), (TIME_INDEX_OBJECT, naming.TIME_INDEX))
        ):
            data = rebuilt[n] if rebuilt is not None and n in missing else read_object(state, m, name)
            (directory / naming.segment_file_name(base, suffix)).write_bytes(data)
        _write_txn_index(state, m, directory / naming.segment_file_name(base, naming.TXN_INDEX), None)
        snapshot = m.objects.get(PRODUCER_SNAPSHOT_OBJECT)
        if snapshot is not None and not m.partial:  # a partial copy's snapshot is its source file's
            (directory / naming.segment_file_name(base, naming.SNAPSHOT)).write_bytes(
                read_object(state, m, PRODUCER_SNAPSHOT_OBJECT)
            )
        return RestoredSegment(base, m.last_offset, log_path.stat().st_size, False, bool(missing))
    return _restore_cut(state, plan, log_path, interval)


def _restore_cut(state: RemoteState, plan: Link, log_path: Path, interval: int) -> RestoredSegment | None:
    """A segment cut at batch boundaries: its kept bytes under the kept head's name, indexes
    rebuilt for them, its ``.txnindex`` truncated; no producer snapshot (it describes the state
    at another offset than the cut's)."""
    m = plan.manifest
    directory = log_path.parent
    batches = _batches(log_path)
    kept = _kept(plan, batches, m.log.key)
    if not kept:
        log_path.unlink()
        return None
    base = m.base_offset if kept[0] is batches[0] else kept[0].base_offset
    start, end = kept[0].position, kept[-1].position + kept[-1].size
    target = directory / naming.segment_file_name(base, naming.LOG)
    if (start, end) != (0, log_path.stat().st_size):
        staged = directory / f"{target.name}.cut"
        with log_path.open("rb") as src, staged.open("wb") as dst:
            src.seek(start)
            _copy_bytes(src, dst, end - start)
        log_path.unlink()
        staged.rename(target)
    rebased = _batches(target)
    _write_indexes(directory, base, rebased, interval)
    _write_txn_index(
        state, m, directory / naming.segment_file_name(base, naming.TXN_INDEX), kept[-1].last_offset + 1
    )
    return RestoredSegment(base, kept[-1].last_offset, end - start, True, True)


def _copy_bytes(src: BinaryIO, dst: BinaryIO, n: int) -> None:
    """Copy ``n`` bytes in :data:`CHUNK_BYTES` pieces (a cut segment never sits in memory whole)."""
    while n > 0:
        chunk = src.read(min(n, CHUNK_BYTES))
        if not chunk:
            raise CorruptObjectError(f"{n} bytes missing from a downloaded segment", file=src.name)
        dst.write(chunk)
        n -= len(chunk)


def finish_partition(
    plan: RestorePlan, directory: Path, done: Sequence[tuple[Link, RestoredSegment | None]]
) -> list[RestoredSegment]:
    """The partition's own files beside its restored segments (``done``: each planned segment and
    what :func:`restore_segment` wrote of it, in offset order); returns the segments written."""
    written = [r for _seg, r in done if r is not None]
    used = [seg.manifest for seg, r in done if r is not None]
    if written:
        log_start = max(plan.log_start, written[0].base_offset)
        pairs = (pair for m in used for pair in m.leader_epochs)
        epochs = merged_epochs(pairs, log_start, written[-1].last_offset + 1)
        (directory / LEADER_EPOCH_CHECKPOINT).write_text(format_leader_epoch_checkpoint(epochs))
        if plan.topic_id is not None:
            (directory / PARTITION_METADATA).write_bytes(format_partition_metadata(plan.topic_id))
    return written
