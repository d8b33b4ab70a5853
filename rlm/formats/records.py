"""Kafka record batches (magic 2) and legacy message sets (magic 0/1): decode, verify, encode.

Layout (FORMATS.md §2, all integers big-endian). Every log entry starts with
``offset int64 @0, size int32 @8`` (size = bytes after these 12) and carries its magic at @16.

Magic 2 record batch, 61-byte header::

    0  baseOffset int64        27 baseTimestamp int64
    8  batchLength int32       35 maxTimestamp int64
    12 partitionLeaderEpoch    43 producerId int64
    16 magic int8 = 2          51 producerEpoch int16
    17 crc uint32 (CRC-32C     53 baseSequence int32
       over [21, end))         57 recordsCount int32
    21 attributes int16        61 records (compressed as one block when codec != none)
    23 lastOffsetDelta int32

    attributes: bits 0-2 codec (compression.Compression), bit 3 timestamp type (1 = LogAppendTime),
    bit 4 transactional, bit 5 control, bit 6 delete horizon (baseTimestamp is the horizon).

Record inside a v2 batch (varint = zig-zag, see :mod:`rlm.formats.varint`)::

    length varint (bytes after this field)   keyLength varint (-1 = null), key
    attributes int8 (unused, 0)              valueLength varint (-1 = null), value
    timestampDelta varlong                   headerCount varint
    offsetDelta varint                       headers: {keyLength varint, utf-8 key,
                                                       valueLength varint (-1 = null), value}

    offset = baseOffset + offsetDelta; timestamp = baseTimestamp + timestampDelta for CreateTime,
    maxTimestamp for every record with LogAppendTime.

Magic 0/1 message: ``offset int64, size int32, crc uint32 (CRC-32 over [16, end)), magic int8,
attributes int8, [timestamp int64, v1], keyLen int32 + key, valueLen int32 + value``.
Attributes: bits 0-2 codec, bit 3 timestamp type (v1). A compressed *wrapper* message has a null
key and a value holding a compressed message set of inner messages; the wrapper's offset is the
**last** inner offset. v0 inner offsets are absolute; v1 inner offsets are relative (0..n-1) and
Kafka resolves them as ``wrapperOffset - lastInnerRelativeOffset + innerRelativeOffset``.

Control batches (attribute bit 5) hold control records whose key is
``version int16, type int16`` (0 ABORT, 1 COMMIT, 2 LeaderChange, 3 SnapshotHeader,
4 SnapshotFooter, 5 KRaftVersion, 6 KRaftVoters) — see :func:`parse_control_record`.

Iteration (:func:`iter_batches`) reads headers only: a v2 batch's records are not decoded until
:func:`decode_records` is called, so a whole segment can be scanned (and CRC-checked) at close to
the speed the bytes can be read. Everything here is pure: buffers in (``bytes``, ``bytearray``,
``memoryview``, ``mmap``), values out; no file or network I/O. Errors carry the absolute byte
position in the buffer and the Kafka offset; callers add the file with ``err.in_file(path)``.
"""

from __future__ import annotations

import enum
import mmap
import operator
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any, Final, NoReturn, TypeAlias

import crc32c as _crc32c

from rlm.errors import CompressionError, CorruptRecordError, InvalidArgumentError, UnsupportedMagicError
from rlm.formats.compression import Compression, compress, decompress
from rlm.formats.varint import decode_varint, decode_varlong, encode_varint, encode_varlong

__all__ = [
    "LOG_OVERHEAD",
    "MIN_ENTRY_SIZE",
    "V2_HEADER_SIZE",
    "Buffer",
    "ControlRecord",
    "ControlRecordType",
    "Header",
    "Record",
    "RecordBatch",
    "RecordSpec",
    "TimestampType",
    "build_batch",
    "decode_records",
    "encode_control_key",
    "encode_end_txn_marker",
    "iter_batches",
    "parse_control_record",
    "valid_bytes",
]

#: Anything exposing the buffer protocol with byte items that ``struct.unpack_from`` accepts.
Buffer: TypeAlias = bytes | bytearray | memoryview | mmap.mmap

#: ``offset int64 + size int32`` in front of every entry.
LOG_OVERHEAD: Final = 12
#: Bytes needed to see an entry's offset, size and magic (magic is at @16 in every version).
_HEADER_UP_TO_MAGIC: Final = 17
#: Smallest legal ``size`` field: a v0 message with null key and value (Kafka's RECORD_OVERHEAD_V0).
MIN_ENTRY_SIZE: Final = 14
V2_HEADER_SIZE: Final = 61
_V1_MIN_SIZE: Final = 22  # crc 4 + magic 1 + attributes 1 + timestamp 8 + keyLen 4 + valueLen 4
_CRC_START_V2: Final = 21  # CRC-32C covers attributes..end
_CRC_START_LEGACY: Final = 16  # CRC-32 covers magic..end
#: Smallest v2 record: length, attributes, timestampDelta, offsetDelta, keyLength, valueLength and
#: headerCount, one byte each.
_MIN_RECORD_SIZE: Final = 7

# Precompiled: the scan loop calls these once per batch.
_OFFSET_SIZE = struct.Struct(">qi")
_V2_HEADER = struct.Struct(">qiibIhiqqqhii")
_LEGACY_HEADER = struct.Struct(">qiIbb")  # offset, size, crc, magic, attributes
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_I16X2 = struct.Struct(">hh")
_END_TXN_MARKER = struct.Struct(">hi")
assert _V2_HEADER.size == V2_HEADER_SIZE

_ATTR_CODEC_MASK: Final = 0x07
_ATTR_TIMESTAMP_TYPE: Final = 0x08
_ATTR_TRANSACTIONAL: Final = 0x10
_ATTR_CONTROL: Final = 0x20
_ATTR_DELETE_HORIZON: Final = 0x40

_crc32c_fn = _crc32c.crc32c


class TimestampType(enum.IntEnum):
    """Kafka's ``TimestampType``; v2 and v1 store it in attribute bit 3, v0 has none."""

    NO_TIMESTAMP = -1
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1

    @property
    def label(self) -> str:
        """Kafka's name: ``CreateTime``, ``LogAppendTime`` or ``NoTimestampType``."""
        return _TS_LABELS[self]


_TS_LABELS: Final = {
    TimestampType.NO_TIMESTAMP: "NoTimestampType",
    TimestampType.CREATE_TIME: "CreateTime",
    TimestampType.LOG_APPEND_TIME: "LogAppendTime",
}
# Index by attribute bits so the scan loop does no enum construction.
_TS_BY_BIT: Final = (TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME)
_CODECS: Final[tuple[Compression | None, ...]] = (*Compression, None, None, None)


@dataclass(frozen=True, slots=True)
class Header:
    """A record header (v2 only). Keys are UTF-8 text and never null; values may be null."""

    key: str
    value: bytes | None


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded record: absolute ``offset``, ``timestamp`` in ms (-1 when the format has none)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


@dataclass(frozen=True, slots=True)
class RecordSpec:
    """A record to build, without an offset: :func:`build_batch` places it right after the previous one."""

    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """Header facts of one v2 batch, or of one top-level v0/v1 message (a wrapper or a plain one).

    ``position`` is the absolute byte position of the entry in the buffer it was read from and
    ``size`` its total length including the 12-byte offset+size prefix, so the entry occupies
    ``[position, end_position)``. ``base_offset``/``last_offset`` are inclusive; for a v0/v1
    compressed wrapper they are its first and last inner offsets (absolute). After compaction
    ``base_offset`` need not be a record offset and ``record_count`` may be 0 (header-only batch).

    v0/v1: ``base_timestamp``/``max_timestamp`` are -1 for v0 and the message (wrapper) timestamp
    for v1; producer fields, ``partition_leader_epoch`` are -1; ``crc`` is CRC-32 (IEEE), for v2
    it is CRC-32C. ``attributes`` is the raw attribute field (int16 for v2, int8 for v0/v1).
    """

    position: int
    size: int
    base_offset: int
    last_offset: int
    magic: int
    crc: int
    crc_valid: bool
    compression: Compression
    timestamp_type: TimestampType
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    partition_leader_epoch: int
    is_transactional: bool
    is_control: bool
    record_count: int
    attributes: int

    @property
    def next_offset(self) -> int:
        """``last_offset + 1``: the offset the next batch in the log would start at (at least)."""
        return self.last_offset + 1

    def moved(self, delta: int) -> RecordBatch:
        """The same batch at ``position + delta`` (a fetch answer's positions; ~10x cheaper than
        ``dataclasses.replace``, which a catch-up calls per batch)."""
        return RecordBatch(self.position + delta, *_BATCH_REST(self))

    @property
    def end_position(self) -> int:
        """``position + size`` (exclusive): where the next entry starts."""
        return self.position + self.size

    @property
    def has_delete_horizon(self) -> bool:
        """v2 attribute bit 6 (KIP-534): ``base_timestamp`` holds the tombstone delete horizon."""
        return self.magic >= 2 and bool(self.attributes & _ATTR_DELETE_HORIZON)


#: every field of a RecordBatch but ``position``, in order (for :meth:`RecordBatch.moved`)
_BATCH_REST = operator.attrgetter(*[f.name for f in fields(RecordBatch)][1:])


def _fast_constructor(cls: type[RecordBatch]) -> Callable[..., RecordBatch]:
    """A positional constructor that fills the slots directly.

    A frozen dataclass ``__init__`` routes every field through ``object.__setattr__`` by name,
    which costs ~1.5 µs for 19 fields and was a third of the per-batch cost of the scan loop.
    Calling each slot descriptor's ``__set__`` (bound once, here) builds the identical instance in
    about half the time. Only the scan loop uses it; equality/hash/repr are the dataclass's own.
    """
    names = [f.name for f in fields(cls)]
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    body = [f"def make({', '.join(names)}):", "    o = _new(_cls)"]
    for name in names:
        namespace[f"_set_{name}"] = getattr(cls, name).__set__
        body.append(f"    _set_{name}(o, {name})")
    body.append("    return o")
    exec("\n".join(body), namespace)
    make: Callable[..., RecordBatch] = namespace["make"]
    return make


_make_batch = _fast_constructor(RecordBatch)


class ControlRecordType(enum.IntEnum):
    """Known control record types (key bytes 2-3); unknown types are kept as plain ints."""

    ABORT = 0
    COMMIT = 1
    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    KRAFT_VERSION = 5
    KRAFT_VOTERS = 6


@dataclass(frozen=True, slots=True)
class ControlRecord:
    """The key of a control record: ``version int16, type int16`` (Kafka ``ControlRecordType``)."""

    version: int
    type: int

    @property
    def type_name(self) -> str:
        """``COMMIT``, ``LEADER_CHANGE``, ... or ``UNKNOWN(<n>)``."""
        try:
            return ControlRecordType(self.type).name
        except ValueError:
            return f"UNKNOWN({self.type})"


# --------------------------------------------------------------------------------------------
# Scanning
# --------------------------------------------------------------------------------------------


def _raise_small(size: int, pos: int, offset: int) -> NoReturn:
    if size < MIN_ENTRY_SIZE:
        raise CorruptRecordError(
            f"entry size {size} is smaller than the minimum {MIN_ENTRY_SIZE}", position=pos, offset=offset
        )
    raise CorruptRecordError(
        f"record batch size {size} is smaller than the v2 header ({V2_HEADER_SIZE - LOG_OVERHEAD})",
        position=pos,
        offset=offset,
    )


def iter_batches(
    buf: Buffer, start: int = 0, *, verify_crc: bool = True, end: int | None = None,
    skip_crc: bool = False,
) -> Iterator[RecordBatch]:
    """Yield the entries of ``buf`` from byte ``start`` up to ``end`` (exclusive; default ``len(buf)``).

    Stops cleanly at a torn tail: fewer than 17 bytes left, or an entry whose declared size runs
    past ``end``. Raises :class:`CorruptRecordError` for ``size < 14`` (or below the v1/v2 header
    size), and for a CRC mismatch when ``verify_crc`` (else the batch is yielded with
    ``crc_valid=False``); :class:`UnsupportedMagicError` for a magic other than 0, 1, 2;
    :class:`CompressionError` for an unknown codec id. Records of v2 batches are not decoded; a
    v0/v1 compressed wrapper is decompressed to learn its first offset and record count.

    ``skip_crc``: v2 batch CRCs are not computed at all and ``crc_valid`` is True — only for bytes
    whose CRCs were already verified (remote ranges were verified when uploaded; docs/read-path.md).

    No buffer export outlives a single step, so an ``mmap`` may be closed as soon as iteration
    stops (even if the generator is left suspended).
    """
    limit = len(buf) if end is None else min(end, len(buf))
    pos = start
    unpack_prefix = _OFFSET_SIZE.unpack_from
    unpack_v2 = _V2_HEADER.unpack_from
    crc32c = _crc32c_fn
    codecs = _CODECS
    ts_types = _TS_BY_BIT
    make = _make_batch
    while limit - pos >= _HEADER_UP_TO_MAGIC:
        if limit - pos >= V2_HEADER_SIZE and buf[pos + 16] == 2:
            # Hot path: one unpack reads the prefix and the whole v2 header.
            (
                base_offset,
                size,
                ple,
                _,
                crc,
                attrs,
                last_delta,
                base_ts,
                max_ts,
                pid,
                epoch,
                base_seq,
                count,
            ) = unpack_v2(buf, pos)
            total = size + LOG_OVERHEAD
            if total < V2_HEADER_SIZE:
                _raise_small(size, pos, base_offset)
            if pos + total > limit:
                return  # torn tail: the last append did not complete
            # memoryview slice: CRC over the mapped bytes without copying; dropped right away.
            crc_ok = skip_crc or crc == crc32c(memoryview(buf)[pos + _CRC_START_V2 : pos + total])
            if not crc_ok and verify_crc:
                raise CorruptRecordError(
                    f"record batch CRC-32C mismatch: stored {crc:#010x}, computed "
                    f"{crc32c(memoryview(buf)[pos + _CRC_START_V2 : pos + total]):#010x}",
                    position=pos,
                    offset=base_offset,
                )
            codec = codecs[attrs & _ATTR_CODEC_MASK]
            if codec is None:
                raise CompressionError(
                    f"unknown compression codec id {attrs & _ATTR_CODEC_MASK}",
                    position=pos,
                    offset=base_offset,
                )
            yield make(
                pos,
                total,
                base_offset,
                base_offset + last_delta,
                2,
                crc,
                crc_ok,
                codec,
                ts_types[(attrs & _ATTR_TIMESTAMP_TYPE) >> 3],
                base_ts,
                max_ts,
                pid,
                epoch,
                base_seq,
                ple,
                bool(attrs & _ATTR_TRANSACTIONAL),
                bool(attrs & _ATTR_CONTROL),
                count,
                attrs,
            )
            pos += total
            continue
        # Legacy messages, unknown magics and entries shorter than a v2 header.
        base_offset, size = unpack_prefix(buf, pos)
        if size < MIN_ENTRY_SIZE:
            _raise_small(size, pos, base_offset)
        total = size + LOG_OVERHEAD
        if pos + total > limit:
            return  # torn tail
        magic = buf[pos + 16]
        if magic == 2:  # fewer than 61 bytes left and the entry fits in them: too small for v2
            _raise_small(size, pos, base_offset)
        elif magic == 0 or magic == 1:
            yield _legacy_batch(buf, pos, total, verify_crc)
        else:
            raise UnsupportedMagicError(
                f"unsupported record batch magic {magic} (known: 0, 1, 2)", position=pos, offset=base_offset
            )
        pos += total


def valid_bytes(buf: Buffer, start: int = 0, *, end: int | None = None) -> int:
    """End position of the last complete entry at or after ``start`` (``start`` if there is none).

    A torn tail is excluded; corruption before it raises like :func:`iter_batches` (with CRC
    verification) rather than being silently cut off.
    """
    last = start
    for batch in iter_batches(buf, start, verify_crc=True, end=end):
        last = batch.position + batch.size
    return last


# --------------------------------------------------------------------------------------------
# Legacy (magic 0/1)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _LegacyMessage:
    offset: int
    crc: int
    crc_valid: bool
    magic: int
    attributes: int
    timestamp: int
    key: bytes | None
    value: bytes | None


def _parse_legacy(buf: Buffer, pos: int, total: int, *, verify_crc: bool, where: int) -> _LegacyMessage:
    """Parse the v0/v1 message occupying ``buf[pos:pos+total]``; ``where`` is the position to report."""
    offset, size, crc, magic, attrs = _LEGACY_HEADER.unpack_from(buf, pos)
    if magic == 1 and size < _V1_MIN_SIZE:
        raise CorruptRecordError(
            f"v1 message size {size} is smaller than the minimum {_V1_MIN_SIZE}",
            position=where,
            offset=offset,
        )
    end = pos + total
    computed = zlib.crc32(memoryview(buf)[pos + _CRC_START_LEGACY : end])
    crc_ok = computed == crc
    if not crc_ok and verify_crc:
        raise CorruptRecordError(
            f"message CRC-32 mismatch: stored {crc:#010x}, computed {computed:#010x}",
            position=where,
            offset=offset,
        )
    p = pos + 18
    timestamp = -1
    if magic == 1:
        (timestamp,) = _I64.unpack_from(buf, p)
        p += 8
    fields: list[bytes | None] = []
    for name in ("key", "value"):
        if p + 4 > end:
            raise CorruptRecordError(
                f"message {name} length runs past the entry", position=where, offset=offset
            )
        (length,) = _I32.unpack_from(buf, p)
        p += 4
        if length < 0:
            fields.append(None)
            continue
        if p + length > end:
            raise CorruptRecordError(
                f"message {name} of {length} bytes runs past the entry", position=where, offset=offset
            )
        fields.append(bytes(buf[p : p + length]))
        p += length
    if p != end:
        raise CorruptRecordError(
            f"message has {end - p} bytes after its value (size field {size})", position=where, offset=offset
        )
    return _LegacyMessage(offset, crc, crc_ok, magic, attrs, timestamp, fields[0], fields[1])


def _legacy_inner(wrapper: _LegacyMessage, where: int) -> list[_LegacyMessage]:
    """Decompress a wrapper's value and parse its inner messages (offsets still as stored)."""
    codec = Compression.from_id(wrapper.attributes & _ATTR_CODEC_MASK)
    if wrapper.value is None:
        raise CorruptRecordError(
            "compressed wrapper message has a null value", position=where, offset=wrapper.offset
        )
    try:
        # Kafka before KIP-57 wrote LZ4 frames with a wrong header checksum; as Kafka does, the
        # checksum is ignored for magic 0 only (magic 1 producers already wrote correct frames).
        data = decompress(codec, wrapper.value, legacy_lz4=wrapper.magic == 0)
    except CompressionError as exc:
        raise CompressionError(exc.reason, position=where, offset=wrapper.offset) from exc
    inner: list[_LegacyMessage] = []
    p = 0
    n = len(data)
    while p < n:
        if n - p < _HEADER_UP_TO_MAGIC:
            raise CorruptRecordError(
                f"compressed message set ends with {n - p} stray bytes", position=where, offset=wrapper.offset
            )
        _, size = _OFFSET_SIZE.unpack_from(data, p)
        if size < MIN_ENTRY_SIZE or p + size + LOG_OVERHEAD > n:
            raise CorruptRecordError(
                f"inner message at byte {p} of the decompressed set has bad size {size}",
                position=where,
                offset=wrapper.offset,
            )
        msg = _parse_legacy(data, p, size + LOG_OVERHEAD, verify_crc=True, where=where)
        if msg.magic != wrapper.magic:
            raise CorruptRecordError(
                f"inner message magic {msg.magic} does not match wrapper magic {wrapper.magic}",
                position=where,
                offset=wrapper.offset,
            )
        if msg.attributes & _ATTR_CODEC_MASK:
            raise CorruptRecordError(
                "compressed message nested in a compressed wrapper", position=where, offset=msg.offset
            )
        inner.append(msg)
        p += size + LOG_OVERHEAD
    if not inner:
        raise CorruptRecordError(
            "compressed wrapper holds no messages", position=where, offset=wrapper.offset
        )
    return inner


def _inner_offset_shift(wrapper: _LegacyMessage, inner: list[_LegacyMessage]) -> int:
    # v1 inner offsets are relative: the wrapper carries the absolute offset of the last one.
    return wrapper.offset - inner[-1].offset if wrapper.magic >= 1 else 0


def _legacy_batch(buf: Buffer, pos: int, total: int, verify_crc: bool) -> RecordBatch:
    msg = _parse_legacy(buf, pos, total, verify_crc=verify_crc, where=pos)
    codec_id = msg.attributes & _ATTR_CODEC_MASK
    codec = _CODECS[codec_id]
    if codec is None:
        raise CompressionError(f"unknown compression codec id {codec_id}", position=pos, offset=msg.offset)
    if msg.magic == 0:
        ts_type = TimestampType.NO_TIMESTAMP
    else:
        ts_type = _TS_BY_BIT[(msg.attributes & _ATTR_TIMESTAMP_TYPE) >> 3]
    base_offset = msg.offset
    count = 1
    if codec is not Compression.NONE:
        inner = _legacy_inner(msg, pos)
        base_offset = inner[0].offset + _inner_offset_shift(msg, inner)
        count = len(inner)
    return RecordBatch(
        pos,
        total,
        base_offset,
        msg.offset,
        msg.magic,
        msg.crc,
        msg.crc_valid,
        codec,
        ts_type,
        msg.timestamp,
        msg.timestamp,
        -1,
        -1,
        -1,
        -1,
        False,
        False,
        count,
        msg.attributes,
    )


def _decode_legacy_records(buf: Buffer, batch: RecordBatch) -> list[Record]:
    msg = _parse_legacy(buf, batch.position, batch.size, verify_crc=False, where=batch.position)
    if batch.compression is Compression.NONE:
        return [Record(msg.offset, msg.timestamp, msg.key, msg.value)]
    inner = _legacy_inner(msg, batch.position)
    shift = _inner_offset_shift(msg, inner)
    log_append = batch.timestamp_type is TimestampType.LOG_APPEND_TIME
    return [
        Record(m.offset + shift, msg.timestamp if log_append else m.timestamp, m.key, m.value) for m in inner
    ]


# --------------------------------------------------------------------------------------------
# Records of a v2 batch
# --------------------------------------------------------------------------------------------


def decode_records(buf: Buffer, batch: RecordBatch) -> list[Record]:
    """Decode every record of ``batch`` (as yielded by :func:`iter_batches` over the same ``buf``).

    Decompresses as needed. v2 offsets are ``base_offset + offsetDelta`` (sparse after
    compaction); timestamps follow the batch's timestamp type (module docstring). Control batch
    records are returned like any other (see :func:`parse_control_record`). v0/v1: the message
    itself, or a wrapper's inner messages with absolute offsets. Framing errors →
    :class:`CorruptRecordError` (position of the record when uncompressed, else of the batch).
    """
    if batch.magic != 2:
        return _decode_legacy_records(buf, batch)
    body_start = batch.position + V2_HEADER_SIZE
    # A copy, never a view kept in a local: the frames of an error raised below would keep an
    # export of the caller's buffer alive, and closing an mmap then raises BufferError in place
    # of the real error (found by fuzzing `rlm dump`, docs/fuzzing.md).
    body = bytes(memoryview(buf)[body_start : batch.position + batch.size])
    if batch.compression is Compression.NONE:
        data = body
        report_base: int | None = body_start
    else:
        try:
            data = decompress(batch.compression, body)
        except CompressionError as exc:
            raise CompressionError(exc.reason, position=batch.position, offset=batch.base_offset) from exc
        report_base = None
    try:
        return _parse_v2_records(data, batch)
    except CorruptRecordError as exc:
        rel = exc.position if exc.position is not None else 0
        if report_base is not None:
            raise CorruptRecordError(exc.reason, position=report_base + rel, offset=exc.offset) from exc
        raise CorruptRecordError(
            f"{exc.reason} (at byte {rel} of the decompressed records)",
            position=batch.position,
            offset=exc.offset,
        ) from exc


def _parse_v2_records(data: bytes, batch: RecordBatch) -> list[Record]:
    """Parse ``batch.record_count`` records from ``data``; error positions are relative to ``data``."""
    count = batch.record_count
    base_offset = batch.base_offset
    if count < 0:
        raise CorruptRecordError(f"negative record count {count}", position=0, offset=base_offset)
    if count > len(data) // _MIN_RECORD_SIZE:
        # Checked against the bytes present before any work: the header's count is not trusted.
        raise CorruptRecordError(
            f"record count {count} cannot fit in {len(data)} bytes of records "
            f"(a record takes at least {_MIN_RECORD_SIZE})",
            position=0,
            offset=base_offset,
        )
    log_append = batch.timestamp_type is TimestampType.LOG_APPEND_TIME
    base_ts = batch.base_timestamp
    max_ts = batch.max_timestamp
    n = len(data)
    p = 0
    out: list[Record] = []
    for _ in range(count):
        rec_start = p
        length, p = decode_varint(data, p)
        rec_end = p + length
        if length < 0 or rec_end > n:
            raise CorruptRecordError(
                f"record length {length} runs past the batch ({n - p} bytes left)",
                position=rec_start,
                offset=base_offset,
            )
        p += 1  # record attributes: unused by Kafka
        ts_delta, p = decode_varlong(data, p)
        off_delta, p = decode_varint(data, p)
        offset = base_offset + off_delta
        key_len, p = decode_varint(data, p)
        key = None
        if key_len >= 0:
            key = data[p : p + key_len]
            p += key_len
        value_len, p = decode_varint(data, p)
        value = None
        if value_len >= 0:
            value = data[p : p + value_len]
            p += value_len
        header_count, p = decode_varint(data, p)
        if header_count < 0:
            raise CorruptRecordError(
                f"negative header count {header_count}", position=rec_start, offset=offset
            )
        headers: list[Header] = []
        for _ in range(header_count):
            hk_len, p = decode_varint(data, p)
            if hk_len < 0:
                raise CorruptRecordError(
                    f"negative header key length {hk_len}", position=rec_start, offset=offset
                )
            try:
                hkey = data[p : p + hk_len].decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CorruptRecordError(
                    f"header key is not UTF-8: {exc}", position=rec_start, offset=offset
                ) from None
            p += hk_len
            hv_len, p = decode_varint(data, p)
            hval = None
            if hv_len >= 0:
                hval = data[p : p + hv_len]
                p += hv_len
            headers.append(Header(hkey, hval))
        if p != rec_end:
            # Also catches key/value/header lengths running past the record: slices never raise.
            raise CorruptRecordError(
                f"record fields take {p - rec_start} bytes but its length prefix says {rec_end - rec_start}",
                position=rec_start,
                offset=offset,
            )
        out.append(Record(offset, max_ts if log_append else base_ts + ts_delta, key, value, tuple(headers)))
    if p != n:
        raise CorruptRecordError(
            f"{n - p} bytes remain after the declared {count} records", position=p, offset=base_offset
        )
    return out


# --------------------------------------------------------------------------------------------
# Control records
# --------------------------------------------------------------------------------------------


def parse_control_record(record: Record) -> ControlRecord:
    """Read the ``version int16, type int16`` key of a control record (Kafka ``ControlRecordType``).

    A null key, one shorter than 4 bytes or a negative version → :class:`CorruptRecordError`.
    Unknown types are returned as is (Kafka treats them as UNKNOWN, not as corruption).
    """
    key = record.key
    if key is None or len(key) < 4:
        raise CorruptRecordError(
            f"control record key must be at least 4 bytes, got {None if key is None else len(key)}",
            offset=record.offset,
        )
    version, ctype = _I16X2.unpack_from(key, 0)
    if version < 0:
        raise CorruptRecordError(f"negative control record version {version}", offset=record.offset)
    return ControlRecord(version, ctype)


def encode_control_key(control_type: int, version: int = 0) -> bytes:
    """The 4-byte key of a control record (``version int16, type int16``)."""
    return _I16X2.pack(version, control_type)


def encode_end_txn_marker(coordinator_epoch: int, version: int = 0) -> bytes:
    """Value of a COMMIT/ABORT control record: ``version int16, coordinatorEpoch int32``."""
    return _END_TXN_MARKER.pack(version, coordinator_epoch)


# --------------------------------------------------------------------------------------------
# Building v2 batches
# --------------------------------------------------------------------------------------------


def _encode_record(out: bytearray, offset_delta: int, ts_delta: int, rec: Record | RecordSpec) -> None:
    body = bytearray(b"\x00")  # attributes
    body += encode_varlong(ts_delta)
    body += encode_varint(offset_delta)
    for field in (rec.key, rec.value):
        if field is None:
            body += encode_varint(-1)
        else:
            body += encode_varint(len(field))
            body += field
    body += encode_varint(len(rec.headers))
    for h in rec.headers:
        hk = h.key.encode("utf-8")
        body += encode_varint(len(hk))
        body += hk
        if h.value is None:
            body += encode_varint(-1)
        else:
            body += encode_varint(len(h.value))
            body += h.value
    out += encode_varint(len(body))
    out += body


def build_batch(
    records: Sequence[RecordSpec | Record],
    *,
    base_offset: int,
    compression: Compression = Compression.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    log_append_time: int | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = -1,
    is_transactional: bool = False,
    is_control: bool = False,
    last_offset: int | None = None,
    max_timestamp: int | None = None,
    snappy_xerial: bool = True,
) -> bytes:
    """Encode a complete v2 batch exactly as Kafka lays it out (header, CRC-32C, records).

    Offsets: a :class:`Record` keeps its offset (``offsetDelta = offset - base_offset``; gaps are
    allowed, as compaction leaves them, but offsets must strictly increase and be ≥
    ``base_offset``); a :class:`RecordSpec` takes the offset after the previous record's (the first
    one ``base_offset``). ``lastOffsetDelta`` is the last record's delta, or ``last_offset -
    base_offset`` when given (a compacted batch keeps its original last offset; an empty batch
    needs it to cover offsets). ``baseTimestamp`` is the first record's timestamp and
    ``maxTimestamp`` the largest, or ``log_append_time`` for LogAppendTime (required then), or
    ``max_timestamp`` when given; an empty batch uses ``max_timestamp`` (default -1) for both, like
    Kafka's empty-header writer. snappy is xerial-framed by default because Java producers write it
    that way (``snappy_xerial=False`` gives librdkafka's raw block). The payload is compressed even
    when that does not make it smaller (a broker never re-decides the codec).
    """
    if timestamp_type is TimestampType.NO_TIMESTAMP:
        raise InvalidArgumentError("v2 batches always carry a timestamp type (CreateTime or LogAppendTime)")
    if timestamp_type is TimestampType.LOG_APPEND_TIME and log_append_time is None:
        raise InvalidArgumentError("LogAppendTime batches need log_append_time")
    deltas: list[int] = []
    prev = -1
    for rec in records:
        delta = rec.offset - base_offset if isinstance(rec, Record) else prev + 1
        if delta <= prev:
            raise InvalidArgumentError(
                f"record offsets must strictly increase from base_offset {base_offset}: "
                f"delta {delta} after {prev}"
            )
        deltas.append(delta)
        prev = delta
    last_delta = deltas[-1] if deltas else 0
    if last_offset is not None:
        if last_offset - base_offset < last_delta:
            raise InvalidArgumentError(f"last_offset {last_offset} is before the last record")
        last_delta = last_offset - base_offset
    if records:
        base_ts = records[0].timestamp
        max_ts = max(r.timestamp for r in records)
    else:
        base_ts = max_ts = -1 if max_timestamp is None else max_timestamp
    if max_timestamp is not None:
        max_ts = max_timestamp
    if timestamp_type is TimestampType.LOG_APPEND_TIME:
        assert log_append_time is not None
        max_ts = log_append_time

    body = bytearray()
    for delta, rec in zip(deltas, records, strict=True):
        _encode_record(body, delta, rec.timestamp - base_ts, rec)
    payload = compress(compression, body, xerial=snappy_xerial) if compression else bytes(body)

    attrs = int(compression)
    if timestamp_type is TimestampType.LOG_APPEND_TIME:
        attrs |= _ATTR_TIMESTAMP_TYPE
    if is_transactional:
        attrs |= _ATTR_TRANSACTIONAL
    if is_control:
        attrs |= _ATTR_CONTROL
    total = V2_HEADER_SIZE + len(payload)
    out = bytearray(total)
    _V2_HEADER.pack_into(
        out,
        0,
        base_offset,
        total - LOG_OVERHEAD,
        partition_leader_epoch,
        2,
        0,  # CRC placeholder: it covers attributes..end, so it is computed last
        attrs,
        last_delta,
        base_ts,
        max_ts,
        producer_id,
        producer_epoch,
        base_sequence,
        len(records),
    )
    out[V2_HEADER_SIZE:] = payload
    struct.pack_into(">I", out, 17, _crc32c_fn(memoryview(out)[_CRC_START_V2:]))
    return bytes(out)
