"""A remote index set's files built from its entries: the appending builder, the derived
``.remoteoffsetindex`` / ``.remotetimeindex`` and the searches over a ``.remotelogindex``.

The entry layout is :class:`rlm.formats.indexes.remote_index.RemoteLogIndexEntry`'s; the derived
indexes are Kafka's offset/time index layouts (:mod:`rlm.formats.indexes.offset_index`,
:mod:`rlm.formats.indexes.time_index`) with one entry per remote index entry, relative to the set's
base offset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from rlm.errors import (
    CorruptIndexError,
    InvalidArgumentError,
)
from rlm.formats.indexes.offset_index import INT32_MAX, Buffer, OffsetIndex, OffsetIndexBuilder
from rlm.formats.indexes.remote_index import DecodedEntry, RemoteLogIndexEntry, decode_entry, iter_entries
from rlm.formats.indexes.time_index import TimeIndex, TimeIndexBuilder

#: Decodes the entry at a position of a ``.remotelogindex`` (:func:`decode_entry`'s signature).
EntryDecoder = Callable[[Buffer, int], DecodedEntry]

__all__ = [
    "AppendedEntry",
    "EntryDecoder",
    "RemoteIndexSetBuilder",
    "derive_remote_indexes",
    "find_entry_for_offset",
    "find_entry_for_timestamp",
    "remote_offset_index_entries",
    "remote_time_index_entries",
]


@dataclass(frozen=True, slots=True)
class AppendedEntry:
    """The bytes one entry adds to each file of the set (``time_index`` is empty when the running
    max timestamp did not grow); ``position`` is the entry's byte position in the ``.remotelogindex``."""

    position: int
    log_index: bytes
    offset_index: bytes
    time_index: bytes


class RemoteIndexSetBuilder:
    """The three files of one remote index set, built entry by entry (pure, in memory).

    ``append(entry)`` returns what to append to each file. It enforces the set's rules: offsets
    increase across entries; the ``.remoteoffsetindex`` gets (first_offset - base, position of the
    entry in the ``.remotelogindex``); the ``.remotetimeindex`` gets (running max last_timestamp,
    last_offset - base) only when the running max strictly grows. Relative offsets and positions
    must fit int32: :meth:`fits` says whether an entry still does (rotate the set otherwise);
    ``append`` raises :class:`InvalidArgumentError` when not.
    """

    __slots__ = ("_last_offset", "_log_size", "_offsets", "_times", "base_offset")

    def __init__(self, base_offset: int) -> None:
        self.base_offset = base_offset
        self._log_size = 0
        self._last_offset: int | None = None
        self._offsets = OffsetIndexBuilder(base_offset)
        self._times = TimeIndexBuilder(base_offset)

    @classmethod
    def from_log_index(cls, buf: Buffer, base_offset: int) -> RemoteIndexSetBuilder:
        """Replay every entry of a ``.remotelogindex`` (strict: any bad entry raises)."""
        builder = cls(base_offset)
        for decoded in iter_entries(buf):
            builder.append(decoded.entry)
        return builder

    @property
    def log_index_size(self) -> int:
        """Bytes of ``.remotelogindex`` so far (the next entry's position)."""
        return self._log_size

    def __len__(self) -> int:
        return len(self._offsets)

    def fits(self, entry: RemoteLogIndexEntry) -> bool:
        """Whether ``entry`` can be appended without overflowing an int32 field of the set."""
        return (
            entry.first_offset - self.base_offset >= 0
            and entry.last_offset - self.base_offset <= INT32_MAX
            and self._log_size <= INT32_MAX
        )

    def append(self, entry: RemoteLogIndexEntry) -> AppendedEntry:
        if not self.fits(entry):
            raise InvalidArgumentError(
                f"entry [{entry.first_offset}, {entry.last_offset}] at .remotelogindex position "
                f"{self._log_size} overflows the int32 fields of the set based at {self.base_offset}: "
                "rotate the set first",
                position=self._log_size,
                offset=entry.first_offset,
            )
        if self._last_offset is not None and entry.first_offset <= self._last_offset:
            raise InvalidArgumentError(
                f"entry first offset {entry.first_offset} is not after the last indexed offset "
                f"{self._last_offset}",
                offset=entry.first_offset,
            )
        position = self._log_size
        log_bytes = entry.encode()
        offset_bytes = self._offsets.append(entry.first_offset, position)
        running_max = max(self._times.last_entry.timestamp, entry.last_timestamp)
        time_bytes = self._times.maybe_append(running_max, entry.last_offset)
        self._log_size += len(log_bytes)
        self._last_offset = entry.last_offset
        return AppendedEntry(position, log_bytes, offset_bytes, time_bytes)

    def offset_index_bytes(self) -> bytes:
        return self._offsets.to_bytes()

    def time_index_bytes(self) -> bytes:
        return self._times.to_bytes()


def remote_offset_index_entries(entries: Iterable[DecodedEntry], base_offset: int) -> bytes:
    """The ``.remoteoffsetindex`` bytes for decoded entries: (first_offset - base, entry position)."""
    builder = OffsetIndexBuilder(base_offset)
    for decoded in entries:
        builder.append(decoded.entry.first_offset, decoded.position)
    return builder.to_bytes()


def remote_time_index_entries(entries: Iterable[DecodedEntry], base_offset: int) -> bytes:
    """The ``.remotetimeindex`` bytes for decoded entries: (running max last_timestamp, last_offset -
    base), one entry each time the running max strictly grows."""
    builder = TimeIndexBuilder(base_offset)
    for decoded in entries:
        running_max = max(builder.last_entry.timestamp, decoded.entry.last_timestamp)
        builder.maybe_append(running_max, decoded.entry.last_offset)
    return builder.to_bytes()


def derive_remote_indexes(log_index: Buffer, base_offset: int) -> tuple[bytes, bytes]:
    """The exact ``(.remoteoffsetindex, .remotetimeindex)`` bytes that belong to ``log_index``.

    Strict (any bad entry raises): for a torn file, pass the valid prefix
    ``log_index[:scan_entries(log_index).valid_length]``.
    """
    decoded = list(iter_entries(log_index))
    return remote_offset_index_entries(decoded, base_offset), remote_time_index_entries(decoded, base_offset)


def _entry_at(
    log_index: Buffer, position: int, expected_first_offset: int | None, decode: EntryDecoder = decode_entry
) -> DecodedEntry:
    decoded = decode(log_index, position)
    if expected_first_offset is not None and decoded.entry.first_offset != expected_first_offset:
        raise CorruptIndexError(
            f".remoteoffsetindex points at an entry with first offset {decoded.entry.first_offset}, "
            f"expected {expected_first_offset}: the set's files disagree",
            position=position,
            offset=expected_first_offset,
        )
    return decoded


def find_entry_for_offset(
    offset_index: OffsetIndex, log_index: Buffer, target_offset: int, decode: EntryDecoder = decode_entry
) -> DecodedEntry | None:
    """The first entry whose ``last_offset >= target_offset`` (docs/formats.md §5.2), or None past the set.

    That is the entry containing the offset, or — when it lies in a compaction gap or before the
    set — the next entry, whose first offset is the next existing one. O(log n): a floor lookup in
    the ``.remoteoffsetindex``, then at most two entries decoded (CRC-verified) by ``decode``
    (:func:`decode_entry`, or a caller's memo of it).
    """
    if not offset_index or len(memoryview(log_index)) == 0:
        return None
    floor = offset_index.lookup(target_offset)
    # Below the first entry, lookup answers (base, 0): position 0 is the first entry anyway.
    expected = floor.offset if target_offset >= offset_index[0].offset else offset_index[0].offset
    decoded = _entry_at(log_index, floor.position, expected, decode)
    if decoded.entry.last_offset >= target_offset:
        return decoded
    if decoded.end_position >= len(memoryview(log_index)):
        return None
    # The floor entry ends before the target, so the next entry starts after it (a gap): it is the answer.
    return decode(log_index, decoded.end_position)


def find_entry_for_timestamp(
    time_index: TimeIndex, offset_index: OffsetIndex, log_index: Buffer, target_timestamp: int
) -> DecodedEntry | None:
    """The first entry whose ``last_timestamp >= target_timestamp`` (docs/formats.md §5.3), or None.

    Its records hold the first record with timestamp >= target (the caller scans them, docs/formats.md §4.3).
    ``target_timestamp`` must be >= 0 (ListOffsets' negative special values are the caller's).
    O(log n): the time index records each point where the running max grows, so the first entry
    with timestamp >= target marks the first entry whose own last_timestamp reaches it; every
    earlier entry's is lower. Equivalent to a floor in the time index then a forward scan, without the scan.
    """
    if target_timestamp < 0:
        raise InvalidArgumentError(f"target timestamp {target_timestamp} is negative")
    mark = time_index.ceiling(target_timestamp)
    if mark is None:
        return None
    found = find_entry_for_offset(offset_index, log_index, mark.offset)
    if found is None or found.entry.last_offset != mark.offset:
        raise CorruptIndexError(
            f".remotetimeindex entry ({mark.timestamp}, {mark.offset}) matches no entry's last offset",
            offset=mark.offset,
        )
    return found
