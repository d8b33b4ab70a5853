"""Read one local Kafka segment (``.log`` + optional ``.index`` / ``.timeindex``) through a read-only mmap.

Contracts:

* The ``.log`` is mapped read-only once, at open; a 0-byte file is not mapped (mmap cannot map
  empty files) and reads as empty. The mapping keeps the inode alive, so a ``.log`` renamed to
  ``.deleted`` (or unlinked) after :class:`LogSegment` opened it stays readable until :meth:`close`.
  Opening a ``.log`` that is already gone raises :class:`FileNotFoundError` — callers that scan a
  live log dir skip that segment.
* Index files are optional: absent, vanished or empty → ``None`` / no entries, and lookups fall back
  to scanning from position 0 (Kafka's ``(base, 0)`` floor). They are read when first needed.
* Every :class:`rlm.errors.RlmError` raised by the pure formats layer is re-raised with
  ``.in_file(path)`` so it names the ``.log`` (or index) file.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from rlm.errors import CorruptIndexError, RlmError
from rlm.formats import naming
from rlm.formats.offset_index import OffsetIndex
from rlm.formats.records import Record, RecordBatch, decode_records, iter_batches
from rlm.formats.time_index import TimeIndex
from rlm.logdir.scan import SegmentFiles

__all__ = ["LogSegment", "TimestampLookupResult"]


@dataclass(frozen=True, slots=True)
class TimestampLookupResult:
    """Answer of a timestamp search: the first record ``offset`` with timestamp ≥ the target, that
    record's ``timestamp`` and the ``batch`` holding it."""

    offset: int
    timestamp: int
    batch: RecordBatch


class LogSegment:
    """A read-only view of one segment; a context manager (``close`` releases the mapping).

    ``base_offset`` comes from the file name unless given. ``index_path`` / ``time_index_path``
    default to the sibling ``<base>.index`` / ``<base>.timeindex``; ``use_indexes=False`` ignores
    index files entirely (every lookup scans from position 0).
    """

    def __init__(
        self,
        log_path: Path | str,
        *,
        index_path: Path | str | None = None,
        time_index_path: Path | str | None = None,
        base_offset: int | None = None,
        use_indexes: bool = True,
    ) -> None:
        self.path = Path(log_path)
        self.base_offset = naming.parse_base_offset(self.path.name) if base_offset is None else base_offset
        stem = self.path.with_name(naming.segment_file_name(self.base_offset, ""))
        self.index_path: Path | None = None
        self.time_index_path: Path | None = None
        if use_indexes:
            self.index_path = (
                Path(index_path) if index_path is not None else stem.with_name(stem.name + naming.INDEX)
            )
            self.time_index_path = (
                Path(time_index_path)
                if time_index_path is not None
                else stem.with_name(stem.name + naming.TIME_INDEX)
            )
        self._mmap: mmap.mmap | None = None
        with open(self.path, "rb") as handle:  # FileNotFoundError propagates: the segment is gone
            size = os.fstat(handle.fileno()).st_size
            if size > 0:
                self._mmap = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        self._buf: mmap.mmap | bytes = self._mmap if self._mmap is not None else b""
        self._offset_index: OffsetIndex | None = None
        self._time_index: TimeIndex | None = None
        self._indexes_loaded = False

    @classmethod
    def open(cls, files: SegmentFiles) -> LogSegment:
        """Open a segment found by :func:`rlm.logdir.scan.list_segments` (only its listed indexes)."""
        segment = cls(
            files.log, index_path=files.index, time_index_path=files.time_index, base_offset=files.base_offset
        )
        # An index missing from the listing must not be picked up by name later.
        if files.index is None:
            segment.index_path = None
        if files.time_index is None:
            segment.time_index_path = None
        return segment

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Release the mapping. Batches/records already returned stay valid (they hold copies)."""
        if self._mmap is not None:
            mapping, self._mmap = self._mmap, None
            self._buf = b""
            # A caller may still hold a view into the mapping; it is then released with that view.
            with contextlib.suppress(BufferError):
                mapping.close()

    def __enter__(self) -> LogSegment:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LogSegment({str(self.path)!r}, base_offset={self.base_offset}, size={self.size})"

    # -- raw access ----------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Bytes in the ``.log`` as mapped at open."""
        return len(self._buf)

    @property
    def buffer(self) -> mmap.mmap | bytes:
        """The mapped ``.log`` bytes (``b""`` for an empty or closed segment)."""
        return self._buf

    def batches(self, start_position: int = 0, *, verify_crc: bool = True) -> Iterator[RecordBatch]:
        """Batch headers from ``start_position`` (a batch boundary) to the end; stops at a torn tail.

        Errors name this file (``.in_file``); ``verify_crc=False`` yields bad batches with
        ``crc_valid=False`` instead of raising.
        """
        try:
            yield from iter_batches(self._buf, start_position, verify_crc=verify_crc)
        except RlmError as exc:
            raise exc.in_file(self.path) from exc

    def read_records(self, batch: RecordBatch) -> list[Record]:
        """Decode (and decompress) the records of ``batch``, which must come from this segment."""
        try:
            return decode_records(self._buf, batch)
        except RlmError as exc:
            raise exc.in_file(self.path) from exc

    # -- indexes -------------------------------------------------------------------------------

    def _load_indexes(self) -> None:
        if self._indexes_loaded:
            return
        raw = _read_optional(self.index_path)
        if raw:
            assert self.index_path is not None
            try:
                self._offset_index = OffsetIndex(self.base_offset, raw)
            except RlmError as exc:
                raise exc.in_file(self.index_path) from exc
        raw = _read_optional(self.time_index_path)
        if raw:
            assert self.time_index_path is not None
            try:
                self._time_index = TimeIndex(self.base_offset, raw)
            except RlmError as exc:
                raise exc.in_file(self.time_index_path) from exc
        self._indexes_loaded = True

    @property
    def offset_index(self) -> OffsetIndex | None:
        """The parsed ``.index``; ``None`` when absent or empty."""
        self._load_indexes()
        return self._offset_index

    @property
    def time_index(self) -> TimeIndex | None:
        """The parsed ``.timeindex``; ``None`` when absent or empty."""
        self._load_indexes()
        return self._time_index

    def _floor_position(self, offset: int) -> int:
        """Byte position of the offset-index floor of ``offset`` (0 without an index)."""
        index = self.offset_index
        if index is None:
            return 0
        position = index.lookup(offset).position
        if position > self.size:
            # An index pointing past the data would silently skip batches: that is corruption.
            raise CorruptIndexError(
                f"offset index floor of {offset} points at byte {position}, "
                f"past the end of the log ({self.size} bytes)",
                file=self.index_path,
                offset=offset,
            )
        return position

    # -- lookups -------------------------------------------------------------------------------

    def find_batch(self, offset: int) -> RecordBatch | None:
        """The first batch whose ``last_offset ≥ offset``, scanning from the offset-index floor.

        Like Kafka's ``translateOffset``: an offset that was compacted away, or lies before the
        first batch, resolves to the next batch; ``None`` when ``offset`` is past the last batch.
        """
        for batch in self.batches(self._floor_position(offset)):
            if batch.last_offset >= offset:
                return batch
        return None

    def find_offset_by_timestamp(
        self, timestamp: int, starting_offset: int | None = None
    ) -> TimestampLookupResult | None:
        """The first record with timestamp ≥ ``timestamp`` and offset ≥ ``starting_offset``
        (default: the base offset), exactly as Kafka's ``LogSegment.findOffsetByTimestamp``.

        Time-index floor ``(T0, O0)`` → offset-index floor of ``max(O0, starting_offset)`` → scan
        batches from that position → in the first batches with ``max_timestamp ≥ timestamp``, the
        first qualifying record (decompressing as needed). ``None`` when no record qualifies, e.g.
        ``timestamp`` > the segment's max timestamp.
        """
        start = self.base_offset if starting_offset is None else starting_offset
        time_index = self.time_index
        floor_offset = time_index.lookup(timestamp).offset if time_index is not None else self.base_offset
        for batch in self.batches(self._floor_position(max(floor_offset, start))):
            if batch.max_timestamp < timestamp:
                continue
            for record in self.read_records(batch):
                if record.timestamp >= timestamp and record.offset >= start:
                    return TimestampLookupResult(
                        offset=record.offset, timestamp=record.timestamp, batch=batch
                    )
        return None


def _read_optional(path: Path | None) -> bytes:
    """The bytes of an index file, or ``b""`` when there is none (absent, vanished, empty)."""
    if path is None:
        return b""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def log_end_offset(segments: Sequence[SegmentFiles]) -> int | None:
    """Last offset + 1 of a partition: of the active (last) segment's last batch, or its base
    offset when it is empty; None without segments or when the active segment cannot be read.

    Scans only from the active segment's last offset-index entry, so it costs at most
    ``index.interval.bytes`` of reading.
    """
    if not segments:
        return None
    active = segments[-1]
    try:
        with LogSegment.open(active) as seg:
            index = seg.offset_index
            start = index[len(index) - 1].position if index else 0
            last = None
            for batch in seg.batches(start, verify_crc=False):
                last = batch
            return last.last_offset + 1 if last is not None else active.base_offset
    except (OSError, RlmError):
        return None
