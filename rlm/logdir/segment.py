"""Read one local Kafka segment (``.log`` + optional ``.index`` / ``.timeindex``) through a read-only mmap.

Contracts:

* The ``.log`` is mapped read-only once, at open; a 0-byte file is not mapped (mmap cannot map
  empty files) and reads as empty. The mapping keeps the inode alive, so a ``.log`` renamed to
  ``.deleted`` (or unlinked) after :class:`LogSegment` opened it stays readable until :meth:`close`.
  Opening a ``.log`` that is already gone raises :class:`FileNotFoundError` — callers that scan a
  live log dir skip that segment.
* Index files are optional: absent, vanished or empty → ``None`` / no entries, and lookups fall back
  to scanning from position 0 (Kafka's ``(base, 0)`` floor). They are read when first needed and
  checked before use (:mod:`rlm.logdir.indexcheck`, docs/broker-files.md): one that fails is
  rebuilt from the ``.log`` with Kafka's rules (``index_interval_bytes``) and the rebuild is used.
* Every :class:`rlm.errors.RlmError` raised by the pure formats layer is re-raised with
  ``.in_file(path)`` so it names the ``.log`` (or index) file.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from rlm.errors import CorruptIndexError, RlmError
from rlm.formats import naming
from rlm.formats.indexes.offset_index import OffsetIndex
from rlm.formats.indexes.segment_index import DEFAULT_INDEX_INTERVAL_BYTES, rebuild_indexes
from rlm.formats.indexes.time_index import TimeIndex
from rlm.formats.records import Record, RecordBatch, decode_records, iter_batches
from rlm.fsutil import SETTLE_NS
from rlm.logdir.discovery import SegmentFiles
from rlm.logdir.indexcheck import (
    IndexKind,
    cached_rebuild,
    file_version,
    fstat_version,
    note_rebuilt,
    parse_checked,
    read_index_file,
)

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
        index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
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
            self._log_version = fstat_version(handle.fileno())
        self.index_interval_bytes = index_interval_bytes
        self._buf: mmap.mmap | bytes = self._mmap if self._mmap is not None else b""
        self._offset_index: OffsetIndex | None = None
        self._time_index: TimeIndex | None = None
        self._indexes_loaded = False

    @classmethod
    def open(
        cls, files: SegmentFiles, *, index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES
    ) -> LogSegment:
        """Open a segment found by :func:`rlm.logdir.discovery.list_segments` (only its listed indexes)."""
        segment = cls(
            files.log,
            index_path=files.index,
            time_index_path=files.time_index,
            base_offset=files.base_offset,
            index_interval_bytes=index_interval_bytes,
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
        loaded = self._load_checked("index", self.index_path)
        assert loaded is None or isinstance(loaded, OffsetIndex)
        self._offset_index = loaded
        times = self._load_checked("timeindex", self.time_index_path)
        assert times is None or isinstance(times, TimeIndex)
        self._time_index = times
        self._indexes_loaded = True

    def _load_checked(self, kind: IndexKind, path: Path | None) -> OffsetIndex | TimeIndex | None:
        """Parse and check one index file; a failed one is rebuilt from the ``.log`` (and reported
        once per file version by :func:`~rlm.logdir.indexcheck.note_rebuilt`)."""
        entry = OffsetIndex.ENTRY_SIZE if kind == "index" else TimeIndex.ENTRY_SIZE
        raw = read_index_file(path, entry)
        if not raw:
            return None
        assert path is not None
        try:
            index = parse_checked(kind, self.base_offset, raw)
            return self._within_log(index, raw)
        except CorruptIndexError as err:
            return self._rebuilt(kind, path, err)

    def _rebuilt(self, kind: IndexKind, path: Path, err: RlmError) -> OffsetIndex | TimeIndex:
        version = file_version(path)
        note_rebuilt(path, err, version)

        def build() -> bytes:
            batches: list[RecordBatch] = []
            with contextlib.suppress(RlmError):  # a corrupt .log: index what precedes the damage
                batches.extend(iter_batches(self._buf, verify_crc=False))
            return rebuild_indexes(self.base_offset, batches, self.index_interval_bytes)[
                0 if kind == "index" else 1
            ]

        key = (kind, version, self._log_version, self.size, self.index_interval_bytes)
        data = cached_rebuild(key, build)
        # A rebuilt index is exactly its entries: no zero tail to strip.
        if kind == "index":
            return OffsetIndex(self.base_offset, data, preallocated=False)
        return TimeIndex(self.base_offset, data, preallocated=False)

    def _grew(self) -> bool:
        """Whether the ``.log`` on disk is longer than the mapping (the active segment): index
        entries past the mapped data are then new, not corrupt."""
        try:
            return self.path.stat().st_size > self.size
        except OSError:
            return False

    def _within_log(self, index: OffsetIndex | TimeIndex, raw: bytes) -> OffsetIndex | TimeIndex:
        """Kafka's sanity check covers the index alone; a reader also needs its last entry inside
        the mapped ``.log``: an offset entry at a batch start holding offsets up to its offset, a
        time entry at an offset the log holds. Entries past the mapping of a growing log are
        dropped (they describe data appended after the mapping was taken)."""
        if not index:
            return index
        if isinstance(index, OffsetIndex):
            last = index[len(index) - 1]
            if last.position >= self.size and self._grew():
                keep = sum(1 for e in index if e.position < self.size)
                return OffsetIndex(self.base_offset, raw[: keep * index.ENTRY_SIZE])
            self._check_entry(last.offset, last.position, (len(index) - 1) * index.ENTRY_SIZE)
            return index
        last_offset = self._last_offset()
        final = index[len(index) - 1]
        if last_offset is not None and final.offset > last_offset:
            if self._grew():
                keep = sum(1 for e in index if e.offset <= last_offset)
                return TimeIndex(self.base_offset, raw[: keep * index.ENTRY_SIZE])
            raise CorruptIndexError(
                f"last entry ({final.timestamp}, {final.offset}) names an offset past the end of the "
                f"log (last offset {last_offset})",
                position=(len(index) - 1) * index.ENTRY_SIZE,
                offset=final.offset,
            )
        return index

    def _check_entry(self, offset: int, position: int, entry_position: int) -> None:
        """An offset-index entry ``(offset, position)`` must point at a batch start inside the log
        whose last offset is at most ``offset`` (Kafka: the last offset of the append there)."""
        batch = None
        with contextlib.suppress(RlmError):
            batch = next(iter_batches(self._buf, position, verify_crc=False), None)
        if batch is None or batch.last_offset > offset:
            raise CorruptIndexError(
                f"entry ({offset}, {position}) does not point at a batch holding offsets up to "
                f"{offset} (the log has {self.size} bytes)",
                position=entry_position,
                offset=offset,
            )

    def _last_offset(self) -> int | None:
        """The mapped log's last offset, scanning from the offset index's last entry (None when
        the log is empty or unreadable there)."""
        index = self._offset_index
        start = index[len(index) - 1].position if index else 0
        last = None
        try:
            for batch in iter_batches(self._buf, start, verify_crc=False):
                last = batch.last_offset
        except RlmError:
            return None
        return last

    @property
    def offset_index(self) -> OffsetIndex | None:
        """The parsed and checked ``.index`` (rebuilt from the log when it failed a check);
        ``None`` when absent or empty."""
        self._load_indexes()
        return self._offset_index

    @property
    def time_index(self) -> TimeIndex | None:
        """The parsed and checked ``.timeindex`` (rebuilt when it failed); ``None`` when absent or empty."""
        self._load_indexes()
        return self._time_index

    def floor_position(self, offset: int) -> int:
        """Byte position of the offset-index floor of ``offset`` (0 without an index). The entry
        used is checked against the log first; an index that fails is rebuilt from the log."""
        index = self.offset_index
        if index is None:
            return 0
        floor = index.lookup(offset)
        if floor.position == 0:
            return 0
        try:
            self._check_entry(floor.offset, floor.position, 0)
        except CorruptIndexError as err:
            assert self.index_path is not None
            rebuilt = self._rebuilt("index", self.index_path, err)
            assert isinstance(rebuilt, OffsetIndex)
            self._offset_index = rebuilt
            return rebuilt.lookup(offset).position
        return floor.position

    def verified_offset_index(self) -> OffsetIndex | None:
        """The ``.index`` with every entry checked against the log (one batch header each; a
        planner cuts the log at these positions), rebuilt from the log when one fails."""
        index = self.offset_index
        if index is None:
            return None
        for n, entry in enumerate(index):
            try:
                self._check_entry(entry.offset, entry.position, n * index.ENTRY_SIZE)
            except CorruptIndexError as err:
                assert self.index_path is not None
                rebuilt = self._rebuilt("index", self.index_path, err)
                assert isinstance(rebuilt, OffsetIndex)
                self._offset_index = rebuilt
                return rebuilt
        return index

    # -- lookups -------------------------------------------------------------------------------

    def find_batch(self, offset: int) -> RecordBatch | None:
        """The first batch whose ``last_offset ≥ offset``, scanning from the offset-index floor.

        Like Kafka's ``translateOffset``: an offset that was compacted away, or lies before the
        first batch, resolves to the next batch; ``None`` when ``offset`` is past the last batch.
        """
        for batch in self.batches(self.floor_position(offset)):
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
        for batch in self.batches(self.floor_position(max(floor_offset, start))):
            if batch.max_timestamp < timestamp:
                continue
            for record in self.read_records(batch):
                if record.timestamp >= timestamp and record.offset >= start:
                    return TimestampLookupResult(
                        offset=record.offset, timestamp=record.timestamp, batch=batch
                    )
        return None


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
        st = os.stat(active.log)
        # Readers ask on every request: the answer is kept while the active .log is unchanged.
        memo_key = (str(active.log), st.st_ino, st.st_size, st.st_mtime_ns)
        known = _LOG_END_MEMO.get(memo_key)
        if known is not None:
            return known
        with LogSegment.open(active) as seg:
            index = seg.offset_index
            start = index[len(index) - 1].position if index else 0
            last = None
            for batch in seg.batches(start, verify_crc=False):
                last = batch
            end = last.last_offset + 1 if last is not None else active.base_offset
    except (OSError, RlmError):
        return None
    if st.st_mtime_ns >= time.time_ns() - SETTLE_NS:
        return end  # changed within a timestamp tick: a rewrite could keep this signature
    if len(_LOG_END_MEMO) >= 4096:
        _LOG_END_MEMO.clear()  # a bound, not an LRU: a miss only costs the scan again
    _LOG_END_MEMO[memo_key] = end
    return end


#: log_end_offset's answers by (path, inode, size, mtime ns) of the active .log
_LOG_END_MEMO: dict[tuple[str, int, int, int], int] = {}
