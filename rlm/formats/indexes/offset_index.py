"""Kafka's offset index (``.index``), also the layout of rlm's ``.remoteoffsetindex``
(docs/formats.md §4.1, §5.2).

Pure: the reader takes a buffer (bytes, bytearray, memoryview or mmap), the builder produces bytes.
"""

from __future__ import annotations

import bisect
import mmap
import struct
import sys
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeAlias

from rlm.errors import CorruptIndexError, InvalidArgumentError
from rlm.formats.indexes.index_builder import IndexBuilder, IndexView, entry_image

__all__ = [
    "INT32_MAX",
    "Buffer",
    "OffsetIndex",
    "OffsetIndexBuilder",
    "OffsetPosition",
    "check_relative",
    "encode_entry",
]

Buffer: TypeAlias = bytes | bytearray | memoryview | mmap.mmap
"""Every buffer type the readers of rlm.formats accept."""

INT32_MAX = 2**31 - 1

_ENTRY = struct.Struct(">ii")
# array('i') is the fast path for decoding many big-endian int32; it needs 4-byte items.
assert array("i").itemsize == 4


@dataclass(frozen=True, slots=True)
class OffsetPosition:
    """One offset-index entry: absolute ``offset`` and byte ``position`` in the indexed file."""

    offset: int
    position: int


def check_relative(base_offset: int, offset: int) -> int:
    relative = offset - base_offset
    # Kafka stores offset - base as int32; beyond it the segment (or remote index set) must be
    # rolled first, which only the caller can do.
    if not 0 <= relative <= INT32_MAX:
        raise InvalidArgumentError(
            f"offset {offset} is not in [base {base_offset}, base + 2^31-1]: relative offset overflows "
            "int32 (roll the segment / rotate the index set first)",
            offset=offset,
        )
    return relative


def encode_entry(base_offset: int, offset: int, position: int) -> bytes:
    """The 8 bytes of one entry ``(offset - base_offset, position)``, big-endian int32 each.

    Raises :class:`InvalidArgumentError` when the relative offset or the position does not fit a
    non-negative int32.
    """
    relative = check_relative(base_offset, offset)
    if not 0 <= position <= INT32_MAX:
        raise InvalidArgumentError(f"position {position} does not fit a non-negative int32", offset=offset)
    return _ENTRY.pack(relative, position)


def _int32_pairs(raw: bytes) -> tuple[array[int], array[int]]:
    values = array("i", raw)
    if sys.byteorder == "little":
        values.byteswap()
    return values[0::2], values[1::2]


class OffsetIndex(IndexView[OffsetPosition]):
    """A read-only view of an offset index: a sparse map from offset to byte position.

    File format: back-to-back 8-byte entries, no header, no checksum::

        relativeOffset int32   offset - baseOffset (baseOffset comes from the file name)
        position       int32   byte position in the indexed file (the .log; for a
                               .remoteoffsetindex, the .remotelogindex) where that entry starts

    All integers big-endian. The index is sparse: Kafka adds an entry only after more than
    ``index.interval.bytes`` were appended since the previous one, and the entry is (last offset of
    that append, position where that append starts). Offsets are strictly increasing, positions
    non-decreasing.

    Kafka preallocates the file of the active segment and fills it lazily, so a Kafka ``.index`` may
    end with all-zero entries: those are not entries (``preallocated=True``, the default; a real
    Kafka entry is never all-zero, its position is past the first ``index.interval.bytes``). rlm's
    ``.remoteoffsetindex`` is never preallocated and legitimately starts with (relative 0,
    position 0): read it with ``preallocated=False``, where every entry is real.

    Sanity checks (:class:`CorruptIndexError`, ``position`` = byte position of the bad entry):
    length not a multiple of 8; first offset or last offset below the base; offsets not strictly
    increasing; positions negative or decreasing.

    ``lookup(t)`` is a floor lookup: the entry with the largest offset ``<= t`` (inclusive), or
    ``(base_offset, 0)`` when every entry is ``> t`` or the index is empty. O(log n).
    """

    ENTRY_SIZE = 8
    KIND = "an offset index"

    __slots__ = ("_positions", "_relative", "base_offset")

    def __init__(self, base_offset: int, buf: Buffer, *, preallocated: bool = True) -> None:
        self.base_offset = base_offset
        image = entry_image(buf, self.ENTRY_SIZE, "offset index", preallocated=preallocated)
        self._relative, self._positions = _int32_pairs(image)
        self._sanity_check()

    def _sanity_check(self) -> None:
        rel, pos = self._relative, self._positions
        if not rel:
            return
        last = len(rel) - 1
        if rel[last] < 0:  # Kafka's own check: last offset < base offset
            raise CorruptIndexError(
                f"last offset {self.base_offset + rel[last]} is below the base offset {self.base_offset}",
                position=last * self.ENTRY_SIZE,
                offset=self.base_offset + rel[last],
            )
        if rel[0] < 0 or pos[0] < 0:
            raise CorruptIndexError(
                f"first entry ({self.base_offset + rel[0]}, {pos[0]}) is below the base offset "
                f"{self.base_offset} or has a negative position",
                position=0,
                offset=self.base_offset + rel[0],
            )
        for n in range(1, len(rel)):
            if rel[n] <= rel[n - 1] or pos[n] < pos[n - 1]:
                raise CorruptIndexError(
                    f"entry {n} ({self.base_offset + rel[n]}, {pos[n]}) does not follow entry {n - 1} "
                    f"({self.base_offset + rel[n - 1]}, {pos[n - 1]}): offsets must increase strictly, "
                    "positions must not decrease",
                    position=n * self.ENTRY_SIZE,
                    offset=self.base_offset + rel[n],
                )

    def columns(self) -> tuple[array[int], array[int]]:
        """The entries as two arrays (not to be modified): offsets relative to ``base_offset``,
        and byte positions."""
        return self._relative, self._positions

    def _at(self, n: int) -> OffsetPosition:
        return OffsetPosition(self.base_offset + self._relative[n], self._positions[n])

    def __iter__(self) -> Iterator[OffsetPosition]:
        base = self.base_offset
        for rel, pos in zip(self._relative, self._positions, strict=True):
            yield OffsetPosition(base + rel, pos)

    @property
    def last_offset(self) -> int:
        """The last entry's offset, or the base offset when the index is empty (as Kafka)."""
        return self.base_offset + self._relative[-1] if self._relative else self.base_offset

    def lookup(self, target_offset: int) -> OffsetPosition:
        """Floor: the entry with the largest offset ``<= target_offset``, else ``(base_offset, 0)``."""
        slot = bisect.bisect_right(self._relative, target_offset - self.base_offset) - 1
        if slot < 0:
            return OffsetPosition(self.base_offset, 0)
        return self[slot]


class OffsetIndexBuilder(IndexBuilder[OffsetPosition]):
    """An in-memory offset index being written, with Kafka's append / truncate rules.

    ``append(offset, position)`` requires ``offset`` > the last entry's offset (any offset >= base
    for the first entry, as Kafka), ``position`` >= the last position, both fitting int32 relative
    to the base; violations raise :class:`InvalidArgumentError` (the caller rolls / rotates before an
    int32 overflow). ``max_index_size`` (bytes, Kafka's ``segment.index.bytes``) enables Kafka's full
    check: appending to a full index raises.
    """

    ENTRY_SIZE = OffsetIndex.ENTRY_SIZE

    __slots__ = ()

    @property
    def last_offset(self) -> int:
        """The last entry's offset, or the base offset when empty (as Kafka)."""
        return self._entries[-1].offset if self._entries else self.base_offset

    def is_full(self, max_index_size: int | None = None) -> bool:
        """Kafka's ``isFull``: entries >= max_index_size // 8 (argument, else the constructor's limit)."""
        limit = self._limit(max_index_size)
        return limit is not None and len(self._entries) >= limit // self.ENTRY_SIZE

    def _encode(self, entry: OffsetPosition) -> bytes:
        return encode_entry(self.base_offset, entry.offset, entry.position)

    def _add(self, offset: int, position: int) -> bytes:
        entry = OffsetPosition(offset, position)
        return self._push(self._encode(entry), entry)

    def append(self, offset: int, position: int) -> bytes:
        """Append ``(offset, position)``; returns the 8 bytes appended (for writing to a file)."""
        if self.is_full():
            raise InvalidArgumentError(f"attempt to append to a full offset index ({len(self)} entries)")
        if self._entries:
            last = self._entries[-1]
            if offset <= last.offset:
                raise InvalidArgumentError(
                    f"attempt to append offset {offset} to an offset index whose last offset is "
                    f"{last.offset}",
                    offset=offset,
                )
            if position < last.position:
                raise InvalidArgumentError(
                    f"attempt to append position {position} after position {last.position}", offset=offset
                )
        return self._add(offset, position)

    def would_fit(self, offset: int, position: int) -> bool:
        """Whether ``(offset, position)`` fits the int32 fields (so the caller can rotate beforehand)."""
        return 0 <= offset - self.base_offset <= INT32_MAX and 0 <= position <= INT32_MAX
