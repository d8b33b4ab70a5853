"""What Kafka's offset and time indexes share (its ``AbstractIndex``): reading a file image of
fixed-size entries, and an in-memory index being written.

An index being written is a ``bytearray`` of fixed-size big-endian entries plus the decoded
entries; subclasses define the entry layout and the append rules. Truncation and the file image
(trimmed, or zero-padded as Kafka preallocates the active segment's index) are common.
"""

from __future__ import annotations

import bisect
import mmap
from array import array
from collections.abc import Sequence
from typing import ClassVar, Generic, Protocol, Self, TypeVar, overload

from rlm.errors import CorruptIndexError, InvalidArgumentError

__all__ = ["IndexBuilder", "IndexView", "entry_image"]


def entry_image(
    buf: bytes | bytearray | memoryview | mmap.mmap, entry_size: int, what: str, *, preallocated: bool
) -> bytes:
    """The bytes of an index file's real entries.

    A length that is not a multiple of ``entry_size`` is :class:`CorruptIndexError` (``position``
    = where the partial entry starts). With ``preallocated`` (Kafka's own files) the zero tail
    Kafka leaves in the active segment's index — everything after the last non-zero byte, entry 0
    included — is not entries; rlm's files are never preallocated, so there every entry is real.
    """
    raw = bytes(memoryview(buf))
    if len(raw) % entry_size:
        raise CorruptIndexError(
            f"{what} length {len(raw)} is not a multiple of {entry_size}",
            position=len(raw) - len(raw) % entry_size,
        )
    used = len(raw.rstrip(b"\x00")) if preallocated else len(raw)
    return raw[: -(-used // entry_size) * entry_size]


class _HasOffset(Protocol):
    @property
    def offset(self) -> int: ...


E = TypeVar("E", bound=_HasOffset)


class IndexView(Sequence[E]):
    """The read-only sequence side of a parsed index: subclasses keep the relative offsets in
    ``_relative`` and decode entry ``n`` in :meth:`_at`; ``KIND`` names the index in errors."""

    ENTRY_SIZE: ClassVar[int]
    KIND: ClassVar[str]

    __slots__ = ()

    base_offset: int
    _relative: array[int]

    def _at(self, n: int) -> E:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._relative)

    @overload
    def __getitem__(self, n: int) -> E: ...

    @overload
    def __getitem__(self, n: slice) -> Sequence[E]: ...

    def __getitem__(self, n: int | slice) -> E | Sequence[E]:
        if isinstance(n, slice):
            return [self._at(i) for i in range(*n.indices(len(self)))]
        return self._at(n)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_offset={self.base_offset}, entries={len(self)})"

    @property
    def entries(self) -> Sequence[E]:
        """The real entries (zero tail excluded), in file order; decoded lazily."""
        return self

    def entry(self, n: int) -> E:
        """The ``n``-th entry, 0-based; :class:`InvalidArgumentError` when ``n`` is not in [0, len)."""
        if not 0 <= n < len(self):
            raise InvalidArgumentError(f"entry {n} requested from {self.KIND} of {len(self)} entries")
        return self._at(n)

    @property
    def valid_bytes(self) -> int:
        """Length of the real entries: what Kafka's ``trimToValidSize`` would truncate the file to."""
        return len(self) * self.ENTRY_SIZE


class IndexBuilder(Generic[E]):
    """Entries of ``ENTRY_SIZE`` bytes relative to ``base_offset``; ``max_index_size`` in bytes
    (Kafka's ``segment.index.bytes``) enables the subclasses' full checks."""

    ENTRY_SIZE: ClassVar[int]

    __slots__ = ("_buf", "_entries", "base_offset", "max_index_size")

    def __init__(self, base_offset: int, *, max_index_size: int | None = None) -> None:
        self.base_offset = base_offset
        self.max_index_size = max_index_size
        self._buf = bytearray()
        self._entries: list[E] = []

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def entries(self) -> Sequence[E]:
        return tuple(self._entries)

    def _limit(self, max_index_size: int | None) -> int | None:
        return max_index_size if max_index_size is not None else self.max_index_size

    @classmethod
    def from_index(cls, index: IndexView[E], *, max_index_size: int | None = None) -> Self:
        """Resume appending after the real entries of an existing index (zero tail dropped)."""
        builder = cls(index.base_offset, max_index_size=max_index_size)
        for entry in index:
            builder._push(builder._encode(entry), entry)
        return builder

    def _encode(self, entry: E) -> bytes:
        """The entry's ``ENTRY_SIZE`` bytes on disk, relative to ``base_offset`` (the subclass's layout)."""
        raise NotImplementedError

    def _push(self, data: bytes, entry: E) -> bytes:
        self._buf += data
        self._entries.append(entry)
        return data

    def truncate_to(self, offset: int) -> None:
        """Kafka's ``truncateTo``: remove every entry whose offset is ``>= offset``."""
        keep = bisect.bisect_left([e.offset for e in self._entries], offset)
        del self._entries[keep:]
        del self._buf[keep * self.ENTRY_SIZE :]

    def truncate(self) -> None:
        """Remove every entry."""
        self.truncate_to(-(2**63))

    def to_bytes(self, *, preallocate_to: int | None = None) -> bytes:
        """The file content. ``preallocate_to`` pads with zeros up to that size rounded down to a
        multiple of the entry size, as Kafka preallocates the active segment's index; default:
        trimmed to the entries."""
        data = bytes(self._buf)
        if preallocate_to is not None:
            target = preallocate_to - preallocate_to % self.ENTRY_SIZE
            data += bytes(max(0, target - len(data)))
        return data
