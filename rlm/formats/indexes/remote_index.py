"""rlm's remote index set: ``.remotelogindex`` entries and the lookups through the set (docs/formats.md §5).

A set is three files with the same 20-digit base name (the set's base offset = first offset of its
first entry): the ``.remotelogindex`` (entries below), a ``.remoteoffsetindex`` (Kafka ``.index``
layout, see :class:`~rlm.formats.indexes.offset_index.OffsetIndex`) and a ``.remotetimeindex`` (Kafka
``.timeindex`` layout, see :class:`~rlm.formats.indexes.time_index.TimeIndex`). The two small indexes are
derivable from the ``.remotelogindex``: :func:`derive_remote_indexes` gives their exact bytes, for
torn-tail repair and rebuild.

Pure: buffers in, dataclasses / bytes out.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from rlm.errors import (
    CorruptRemoteIndexError,
    FormatError,
    InvalidArgumentError,
    UnsupportedMagicError,
)
from rlm.formats.indexes.offset_index import INT32_MAX, Buffer

__all__ = [
    "ENTRY_HEADER_SIZE",
    "REMOTE_LOG_INDEX_MAGIC",
    "STORED_ENTRY_HEADER_SIZE",
    "STORED_ENTRY_MAGIC",
    "TRANSFORM_AES_GCM",
    "TRANSFORM_ZSTD",
    "BatchLike",
    "DecodedEntry",
    "RemoteDataIdentifier",
    "RemoteIndexScan",
    "RemoteLogIndexEntry",
    "build_entries",
    "decode_entry",
    "iter_entries",
    "scan_entries",
]

REMOTE_LOG_INDEX_MAGIC = 0
#: An entry whose stored bytes are transformed (compressed and/or encrypted, docs/protection.md).
STORED_ENTRY_MAGIC = 1
#: ``transform`` bits of a magic 1 entry, applied in this order when written: zstd, then AES-256-GCM.
TRANSFORM_ZSTD = 0x01
TRANSFORM_AES_GCM = 0x02
_TRANSFORMS = TRANSFORM_ZSTD | TRANSFORM_AES_GCM

# magic int16, length int16, crc uint32, firstOffset, lastOffset, firstTimestamp, lastTimestamp
# (int64 each), dataLength int32, rdiLength int16 — then rdiLength bytes of UTF-8.
_HEADER = struct.Struct(">hhIqqqqih")
# magic 1: the same, with storedLength int32 and transform int8 after dataLength.
_HEADER_1 = struct.Struct(">hhIqqqqiibh")
ENTRY_HEADER_SIZE = _HEADER.size  # 46
STORED_ENTRY_HEADER_SIZE = _HEADER_1.size  # 51
_PREFIX = struct.Struct(">hh")  # magic, length: what is needed to know the entry's extent
_CRC_START = 8  # the CRC covers [8, end of entry)
_LENGTH_BASE = ENTRY_HEADER_SIZE - _PREFIX.size  # length = 42 + rdiLength
_LENGTH_BASE_1 = STORED_ENTRY_HEADER_SIZE - _PREFIX.size  # length = 47 + rdiLength
_INT16_MAX = 2**15 - 1
_MAX_RDI_BYTES = _INT16_MAX - _LENGTH_BASE_1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True, slots=True)
class RemoteDataIdentifier:
    """Where an entry's bytes live: ``<object url>#<byte position>`` (the url may itself contain ``#``)."""

    url: str
    position: int

    def __post_init__(self) -> None:
        if not self.url:
            raise InvalidArgumentError("remote data identifier needs a non-empty object URL")
        if not 0 <= self.position <= _INT64_MAX:
            raise InvalidArgumentError(f"remote data identifier position {self.position} is negative")

    def __str__(self) -> str:
        return f"{self.url}#{self.position}"

    @classmethod
    def parse(cls, text: str) -> RemoteDataIdentifier:
        """Split at the **last** ``#``; :class:`InvalidArgumentError` if there is none or the position
        is not a non-negative decimal integer."""
        url, sep, position = text.rpartition("#")
        if not sep or not position.isascii() or not position.isdigit():
            raise InvalidArgumentError(f"remote data identifier {text!r} is not <url>#<byte position>")
        return cls(url, int(position))


@dataclass(frozen=True, slots=True)
class RemoteLogIndexEntry:
    """One ``.remotelogindex`` entry: a run of whole batches of one segment, stored remotely.

    Binary layout (magic 0, big-endian, entries back to back, no file header or trailer)::

        off size field
          0   2  magic int16 = 0
          2   2  length int16 = bytes after this field = 42 + rdiLength
          4   4  crc: CRC-32 (IEEE, zlib.crc32) over bytes [8, end of entry), as uint32 bits
          8   8  firstOffset    base offset of the entry's first batch
         16   8  lastOffset     last offset of the entry's last batch (inclusive)
         24   8  firstTimestamp first batch's baseTimestamp (-1 for magic 0/1 batches)
         32   8  lastTimestamp  MAX maxTimestamp over all the entry's batches (not the last one's:
                                timestamps may go backwards inside a segment)
         40   4  dataLength     bytes covered: end of last batch - start of first batch
         44   2  rdiLength
         46   n  rdi            UTF-8 "<object URL>#<byte position of the first batch in the object>"

    The remote byte range is half-open: ``[rdi.position, rdi.position + data_length)``.
    Offsets are inclusive: the entry covers ``[first_offset, last_offset]`` (compaction may leave gaps).

    Magic 1 (docs/formats.md §5.1, docs/protection.md): the entry's batches are stored
    *transformed* — the same fields, and after ``dataLength`` (which stays the plaintext length)::

         44   4  storedLength   bytes of the entry in the object (compressed and/or encrypted)
         48   1  transform      bit 0 (0x01) zstd, bit 1 (0x02) AES-256-GCM; at least one is set
         49   2  rdiLength
         51   n  rdi            "<object URL>#<byte position of the stored entry in the object>"

    with ``length = 47 + rdiLength``; the remote byte range is then ``[rdi.position, rdi.position +
    storedLength)``. An entry stored as is keeps magic 0, so old and new entries mix in one set.
    Construction validates field ranges (:class:`InvalidArgumentError`).
    """

    first_offset: int
    last_offset: int
    first_timestamp: int
    last_timestamp: int
    data_length: int
    rdi: RemoteDataIdentifier
    magic: int = REMOTE_LOG_INDEX_MAGIC
    transform: int = 0  # magic 1 only: TRANSFORM_* bits
    stored_length: int = 0  # magic 1 only: bytes in the object

    def __post_init__(self) -> None:
        if self.magic == REMOTE_LOG_INDEX_MAGIC:
            if self.transform or self.stored_length:
                raise InvalidArgumentError("a magic 0 entry has no transform or stored length")
        elif self.magic == STORED_ENTRY_MAGIC:
            if not 0 < self.transform <= _TRANSFORMS:
                raise InvalidArgumentError(
                    f"entry transform {self.transform:#04x} is not a combination "
                    "of zstd (0x01) and AES-256-GCM (0x02)"
                )
            if not 0 < self.stored_length <= INT32_MAX:
                raise InvalidArgumentError(f"stored length {self.stored_length} is not in [1, 2^31-1]")
        else:
            raise InvalidArgumentError(f"remote log index entry magic {self.magic} is not supported")
        if not 0 <= self.first_offset <= self.last_offset <= _INT64_MAX:
            raise InvalidArgumentError(
                f"entry offsets [{self.first_offset}, {self.last_offset}] are not 0 <= first <= last",
                offset=self.first_offset,
            )
        for name, ts in (("first", self.first_timestamp), ("last", self.last_timestamp)):
            if not _INT64_MIN <= ts <= _INT64_MAX:
                raise InvalidArgumentError(f"{name} timestamp {ts} does not fit int64")
        if not 0 < self.data_length <= INT32_MAX:
            raise InvalidArgumentError(f"data length {self.data_length} is not in [1, 2^31-1]")
        if len(str(self.rdi).encode()) > _MAX_RDI_BYTES:
            raise InvalidArgumentError(f"remote data identifier is longer than {_MAX_RDI_BYTES} bytes")

    @property
    def stored_size(self) -> int:
        """Bytes of the entry in the remote object: ``storedLength`` (magic 1), else ``dataLength``."""
        return self.stored_length if self.magic == STORED_ENTRY_MAGIC else self.data_length

    @property
    def transformed(self) -> bool:
        return self.magic == STORED_ENTRY_MAGIC

    @property
    def byte_range(self) -> tuple[int, int]:
        """Half-open ``[start, end)`` of the entry's (stored) bytes in the remote object."""
        return self.rdi.position, self.rdi.position + self.stored_size

    @property
    def encoded_size(self) -> int:
        header = STORED_ENTRY_HEADER_SIZE if self.transformed else ENTRY_HEADER_SIZE
        return header + len(str(self.rdi).encode())

    def encode(self) -> bytes:
        rdi = str(self.rdi).encode()
        fields = (
            self.first_offset,
            self.last_offset,
            self.first_timestamp,
            self.last_timestamp,
            self.data_length,
        )
        if self.transformed:
            header = _HEADER_1.pack(
                self.magic,
                _LENGTH_BASE_1 + len(rdi),
                0,
                *fields,
                self.stored_length,
                self.transform,
                len(rdi),
            )
        else:
            header = _HEADER.pack(self.magic, _LENGTH_BASE + len(rdi), 0, *fields, len(rdi))
        body = bytearray(header)
        body += rdi
        struct.pack_into(">I", body, 4, zlib.crc32(memoryview(body)[_CRC_START:]))
        return bytes(body)


@dataclass(frozen=True, slots=True)
class DecodedEntry:
    """An entry as read from a ``.remotelogindex``: its byte ``position`` in the file, ``size`` in bytes."""

    position: int
    entry: RemoteLogIndexEntry
    crc: int
    size: int

    @property
    def end_position(self) -> int:
        return self.position + self.size


_MAGICS = (REMOTE_LOG_INDEX_MAGIC, STORED_ENTRY_MAGIC)


def _frame_error(view: memoryview, position: int) -> FormatError:
    """Why the entry at ``position`` is not framed right (magic, length field, bytes present): the
    error :func:`decode_entry` raises, worded here so its hot path stays one test."""
    available = len(view) - position
    if available < _PREFIX.size:
        return CorruptRemoteIndexError(
            f"truncated entry: {available} bytes left, an entry header needs {ENTRY_HEADER_SIZE}",
            position=position,
        )
    magic, length = _PREFIX.unpack_from(view, position)
    if magic not in _MAGICS:
        return UnsupportedMagicError(f"unsupported .remotelogindex entry magic {magic}", position=position)
    base = _LENGTH_BASE if magic == REMOTE_LOG_INDEX_MAGIC else _LENGTH_BASE_1
    if length < base:
        return CorruptRemoteIndexError(
            f"bad entry length {length}: at least {base} expected", position=position
        )
    return CorruptRemoteIndexError(
        f"truncated entry: length says {_PREFIX.size + length} bytes, only {available} left",
        position=position,
    )


def decode_entry(buf: Buffer, position: int) -> DecodedEntry:
    """Decode and verify the entry starting at ``position``.

    Raises :class:`UnsupportedMagicError` (naming the magic) or :class:`CorruptRemoteIndexError`
    (truncated entry, bad length, bad CRC, bad RDI or field values), with ``position`` set.
    """
    view = memoryview(buf)
    available = len(view) - position
    if available < _PREFIX.size:
        raise _frame_error(view, position)
    magic, length = _PREFIX.unpack_from(view, position)
    base = _LENGTH_BASE if magic == REMOTE_LOG_INDEX_MAGIC else _LENGTH_BASE_1
    size = _PREFIX.size + length
    if magic not in _MAGICS or length < base or available < size:
        raise _frame_error(view, position)  # off the hot path: the checks, one by one, worded
    stored_length = transform = 0
    if magic == REMOTE_LOG_INDEX_MAGIC:
        (_, _, crc, first_offset, last_offset, first_ts, last_ts, data_length, rdi_length) = (
            _HEADER.unpack_from(view, position)
        )
    else:
        (
            _,
            _,
            crc,
            first_offset,
            last_offset,
            first_ts,
            last_ts,
            data_length,
            stored_length,
            transform,
            rdi_length,
        ) = _HEADER_1.unpack_from(view, position)
    if rdi_length != length - base:
        raise CorruptRemoteIndexError(
            f"bad entry length {length}: rdiLength {rdi_length} needs {base + rdi_length}",
            position=position,
        )
    actual = zlib.crc32(view[position + _CRC_START : position + size])
    if actual != crc:
        raise CorruptRemoteIndexError(
            f"bad entry CRC: stored 0x{crc:08x}, computed 0x{actual:08x}",
            position=position,
            offset=first_offset,
        )
    try:
        rdi_bytes = bytes(view[position + base + _PREFIX.size : position + size])
        rdi = RemoteDataIdentifier.parse(rdi_bytes.decode())
        entry = RemoteLogIndexEntry(
            first_offset, last_offset, first_ts, last_ts, data_length, rdi, magic, transform, stored_length
        )
    except (UnicodeDecodeError, InvalidArgumentError) as exc:
        reason = exc.reason if isinstance(exc, InvalidArgumentError) else f"RDI is not UTF-8: {exc}"
        raise CorruptRemoteIndexError(
            f"invalid entry: {reason}", position=position, offset=first_offset
        ) from exc
    return DecodedEntry(position, entry, crc, size)


def _check_order(previous: DecodedEntry | None, current: DecodedEntry) -> None:
    # Entries of one set come from consecutive segments: offsets must increase, else the offset
    # index derived from them would be invalid.
    if previous is not None and current.entry.first_offset <= previous.entry.last_offset:
        raise CorruptRemoteIndexError(
            f"entry first offset {current.entry.first_offset} is not after the previous entry's last "
            f"offset {previous.entry.last_offset}",
            position=current.position,
            offset=current.entry.first_offset,
        )


def iter_entries(buf: Buffer, start: int = 0) -> Iterator[DecodedEntry]:
    """Every entry from ``start`` to the end of ``buf``, CRC-verified.

    Strict: the first bad or truncated entry raises (with its byte ``position``), as do entries
    whose offsets do not increase.
    """
    position, previous, end = start, None, len(memoryview(buf))
    while position < end:
        decoded = decode_entry(buf, position)
        _check_order(previous, decoded)
        yield decoded
        previous, position = decoded, decoded.end_position


@dataclass(frozen=True, slots=True)
class RemoteIndexScan:
    """The valid prefix of a ``.remotelogindex``: entries, their end ``valid_length`` and the tail's error."""

    entries: list[DecodedEntry]
    valid_length: int
    error: FormatError | None


def scan_entries(buf: Buffer) -> RemoteIndexScan:
    """Read entries until the end or the first bad one; never raises for a torn or corrupt tail.

    ``valid_length`` is the length to truncate the file to (end of the last good entry); ``error``
    says what was wrong at ``valid_length`` (None when the whole buffer is valid).
    """
    entries: list[DecodedEntry] = []
    valid_length = 0
    try:
        for decoded in iter_entries(buf):
            entries.append(decoded)
            valid_length = decoded.end_position
    except FormatError as exc:
        return RemoteIndexScan(entries, valid_length, exc)
    return RemoteIndexScan(entries, valid_length, None)


class BatchLike(Protocol):
    """What :func:`build_entries` reads of a batch (attributes of ``rlm.formats.records.RecordBatch``)."""

    @property
    def position(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def base_offset(self) -> int: ...
    @property
    def last_offset(self) -> int: ...
    @property
    def base_timestamp(self) -> int: ...
    @property
    def max_timestamp(self) -> int: ...
    @property
    def magic(self) -> int: ...


def build_entries(
    batches: Iterable[BatchLike],
    *,
    object_url: str,
    index_entry_bytes: int,
    segment_start_position: int = 0,
) -> list[RemoteLogIndexEntry]:
    """Pack one segment's batches into ``.remotelogindex`` entries (docs/formats.md §5.1).

    Consecutive batches are packed while the entry covers at most ``index_entry_bytes``; a batch
    larger than that forms an entry alone; batches are never split. The caller passes one segment's
    batches, so an entry never spans two segments. ``segment_start_position`` is the batches'
    position that maps to byte 0 of the object at ``object_url`` (the rdi position is relative to it).
    Batches must be contiguous and offsets increasing, else :class:`InvalidArgumentError`.
    """
    if not 0 < index_entry_bytes <= INT32_MAX:
        raise InvalidArgumentError(f"index_entry_bytes {index_entry_bytes} is not in [1, 2^31-1]")
    start = segment_start_position
    entries: list[RemoteLogIndexEntry] = []
    group: list[BatchLike] = []
    previous: BatchLike | None = None
    for batch in batches:
        _check_follows(previous, batch, start)
        if group and batch.position + batch.size - group[0].position > index_entry_bytes:
            entries.append(_entry_of(group, object_url, start))
            group = []
        group.append(batch)
        previous = batch
    if group:
        entries.append(_entry_of(group, object_url, start))
    return entries


def _entry_of(group: Sequence[BatchLike], object_url: str, start: int) -> RemoteLogIndexEntry:
    """The entry covering ``group`` (consecutive batches); ``start``: the segment position that is
    byte 0 of the object."""
    first, last = group[0], group[-1]
    return RemoteLogIndexEntry(
        first_offset=first.base_offset,
        last_offset=last.last_offset,
        # docs/formats.md §5.1: -1 for magic 0/1 even when a v1 message has a timestamp.
        first_timestamp=first.base_timestamp if first.magic >= 2 else -1,
        last_timestamp=max(b.max_timestamp for b in group),
        data_length=last.position + last.size - first.position,
        rdi=RemoteDataIdentifier(object_url, first.position - start),
    )


def _check_follows(previous: BatchLike | None, batch: BatchLike, start: int) -> None:
    """``batch`` must start where ``previous`` ends, with a higher offset (the first one: at or
    after ``start``); else :class:`InvalidArgumentError`."""
    if previous is None:
        if batch.position < start:
            raise InvalidArgumentError(
                f"batch at {batch.position} is before segment_start_position {start}",
                position=batch.position,
            )
        return
    if batch.position != previous.position + previous.size:
        raise InvalidArgumentError(
            f"batch at {batch.position} does not follow the batch ending at "
            f"{previous.position + previous.size}",
            position=batch.position,
            offset=batch.base_offset,
        )
    if batch.base_offset <= previous.last_offset:
        raise InvalidArgumentError(
            f"batch base offset {batch.base_offset} is not after the previous last offset "
            f"{previous.last_offset}",
            position=batch.position,
            offset=batch.base_offset,
        )
