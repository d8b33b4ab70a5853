"""Kafka's time index (``.timeindex``), also the layout of rlm's ``.remotetimeindex``
(docs/formats.md §4.2, §5.3).

Pure: the reader takes a buffer (bytes, bytearray, memoryview or mmap), the builder produces bytes.
"""

from __future__ import annotations

import bisect
import struct
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

from rlm.errors import CorruptIndexError, InvalidArgumentError
from rlm.formats.indexes.index_builder import IndexBuilder, IndexView, entry_image
from rlm.formats.indexes.offset_index import Buffer, check_relative

__all__ = ["NO_TIMESTAMP", "TimeIndex", "TimeIndexBuilder", "TimestampOffset", "encode_entry"]

NO_TIMESTAMP = -1
"""Kafka's ``RecordBatch.NO_TIMESTAMP``: the timestamp of an empty time index's last entry."""

_ENTRY = struct.Struct(">qi")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True, slots=True)
class TimestampOffset:
    """One time-index entry: the largest timestamp (ms) at or before absolute ``offset`` is ``timestamp``."""

    timestamp: int
    offset: int


def encode_entry(base_offset: int, timestamp: int, offset: int) -> bytes:
    """The 12 bytes of one entry: ``timestamp`` int64, ``offset - base_offset`` int32, big-endian.

    Raises :class:`InvalidArgumentError` when the timestamp is not an int64 or the relative offset
    does not fit a non-negative int32.
    """
    relative = check_relative(base_offset, offset)
    if not _INT64_MIN <= timestamp <= _INT64_MAX:
        raise InvalidArgumentError(f"timestamp {timestamp} does not fit int64", offset=offset)
    return _ENTRY.pack(timestamp, relative)


class TimeIndex(IndexView[TimestampOffset]):
    """A read-only view of a time index: a sparse map from timestamp to offset.

    File format: back-to-back 12-byte entries, no header, no checksum::

        timestamp      int64   ms
        relativeOffset int32   offset - baseOffset (baseOffset comes from the file name)

    All integers big-endian. An entry (T, O) means: the largest timestamp of any record at or
    before offset O is T, so every record with a timestamp > T comes after O. Kafka appends
    (maxTimestampSoFar, offsetOfMaxTimestampSoFar) together with an offset-index entry, and only
    when T is strictly greater than the last entry's; when a segment rolls it appends a final entry
    with the segment's max timestamp. Timestamps and offsets are therefore non-decreasing.

    Kafka preallocates the active segment's file, so a Kafka ``.timeindex`` may end with all-zero
    entries: those are not entries (``preallocated=True``, the default; a fully preallocated file
    reads as empty). rlm's ``.remotetimeindex`` is never preallocated and may legitimately start
    with (timestamp 0, relative offset 0): read it with ``preallocated=False``.

    Sanity checks (:class:`CorruptIndexError`, ``position`` = byte position of the bad entry):
    length not a multiple of 12; last (or first) offset below the base; timestamps or offsets
    decreasing.

    ``lookup(T)`` is a floor lookup: the entry with the largest timestamp ``<= T`` (inclusive; the
    last of equal ones), or ``(-1, base_offset)`` when every entry is ``> T`` or the index is empty.
    O(log n).
    """

    ENTRY_SIZE = 12
    KIND = "a time index"

    __slots__ = ("_relative", "_timestamps", "base_offset")

    def __init__(self, base_offset: int, buf: Buffer, *, preallocated: bool = True) -> None:
        self.base_offset = base_offset
        image = entry_image(buf, self.ENTRY_SIZE, "time index", preallocated=preallocated)
        self._timestamps = array("q")
        self._relative = array("i")
        for timestamp, relative in _ENTRY.iter_unpack(image):
            self._timestamps.append(timestamp)
            self._relative.append(relative)
        self._sanity_check()

    def _sanity_check(self) -> None:
        ts, rel, base = self._timestamps, self._relative, self.base_offset
        if not rel:
            return
        last = len(rel) - 1
        if rel[last] < 0:  # Kafka's own check: last offset < base offset
            raise CorruptIndexError(
                f"last offset {base + rel[last]} is below the base offset {base}",
                position=last * self.ENTRY_SIZE,
                offset=base + rel[last],
            )
        if rel[0] < 0:
            raise CorruptIndexError(
                f"first offset {base + rel[0]} is below the base offset {base}",
                position=0,
                offset=base + rel[0],
            )
        for n in range(1, len(rel)):
            if ts[n] < ts[n - 1] or rel[n] < rel[n - 1]:
                raise CorruptIndexError(
                    f"entry {n} ({ts[n]}, {base + rel[n]}) goes back from entry {n - 1} "
                    f"({ts[n - 1]}, {base + rel[n - 1]}): timestamps and offsets must not decrease",
                    position=n * self.ENTRY_SIZE,
                    offset=base + rel[n],
                )

    def _at(self, n: int) -> TimestampOffset:
        return TimestampOffset(self._timestamps[n], self.base_offset + self._relative[n])

    def __iter__(self) -> Iterator[TimestampOffset]:
        base = self.base_offset
        for ts, rel in zip(self._timestamps, self._relative, strict=True):
            yield TimestampOffset(ts, base + rel)

    @property
    def last_entry(self) -> TimestampOffset:
        """The last entry, or ``(-1, base_offset)`` when empty (Kafka's ``lastEntry``)."""
        return self[-1] if self._relative else TimestampOffset(NO_TIMESTAMP, self.base_offset)

    def lookup(self, target_timestamp: int) -> TimestampOffset:
        """Floor: the entry with the largest timestamp ``<= target_timestamp``, else ``(-1, base_offset)``."""
        slot = bisect.bisect_right(self._timestamps, target_timestamp) - 1
        if slot < 0:
            return TimestampOffset(NO_TIMESTAMP, self.base_offset)
        return self[slot]

    def ceiling(self, target_timestamp: int) -> TimestampOffset | None:
        """The first entry with timestamp ``>= target_timestamp`` (inclusive), or None.

        Because entries record a running maximum, this entry marks where the max timestamp first
        reaches the target; rlm's remote timestamp lookup uses it to stay O(log n).
        """
        slot = bisect.bisect_left(self._timestamps, target_timestamp)
        return self[slot] if slot < len(self) else None


class TimeIndexBuilder(IndexBuilder[TimestampOffset]):
    """An in-memory time index being written, with Kafka's ``maybeAppend`` rules.

    ``maybe_append(ts, offset)`` appends only when ``ts`` > the last entry's timestamp (initially
    -1, so v0 data never adds entries); ``offset`` below the last entry's offset or ``ts`` below
    its timestamp is a caller bug (:class:`InvalidArgumentError`, Kafka's InvalidOffsetException /
    IllegalStateException). With ``max_index_size`` set, Kafka's full check applies: the index is
    full one entry early (``entries >= max_entries - 1``) so that the final entry written on roll
    with ``skip_full_check=True`` always has room.
    """

    ENTRY_SIZE = TimeIndex.ENTRY_SIZE

    __slots__ = ()

    @property
    def last_entry(self) -> TimestampOffset:
        """The last entry, or ``(-1, base_offset)`` when empty (Kafka's ``lastEntry``)."""
        return self._entries[-1] if self._entries else TimestampOffset(NO_TIMESTAMP, self.base_offset)

    def is_full(self, max_index_size: int | None = None) -> bool:
        """Kafka's ``TimeIndex.isFull``: entries >= max_index_size // 12 - 1 (one slot kept for the roll)."""
        limit = self._limit(max_index_size)
        return limit is not None and len(self._entries) >= limit // self.ENTRY_SIZE - 1

    def _encode(self, entry: TimestampOffset) -> bytes:
        return encode_entry(self.base_offset, entry.timestamp, entry.offset)

    def _add(self, timestamp: int, offset: int) -> bytes:
        entry = TimestampOffset(timestamp, offset)
        return self._push(self._encode(entry), entry)

    def maybe_append(self, timestamp: int, offset: int, *, skip_full_check: bool = False) -> bytes:
        """Kafka's ``maybeAppend(timestamp, offset, skipFullCheck)``.

        Returns the 12 bytes appended, or ``b""`` when ``timestamp`` is not strictly greater than the
        last entry's (no entry; e.g. the roll-time entry when the max timestamp is already indexed).
        """
        if not skip_full_check and self.is_full():
            raise InvalidArgumentError(f"attempt to append to a full time index ({len(self)} entries)")
        last = self.last_entry
        if self._entries and offset < last.offset:
            raise InvalidArgumentError(
                f"attempt to append offset {offset} to a time index whose last offset is {last.offset}",
                offset=offset,
            )
        if self._entries and timestamp < last.timestamp:
            raise InvalidArgumentError(
                f"attempt to append timestamp {timestamp} to a time index whose last timestamp is "
                f"{last.timestamp}",
                offset=offset,
            )
        if timestamp > last.timestamp:
            return self._add(timestamp, offset)
        return b""
