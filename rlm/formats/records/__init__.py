"""Kafka record batches (magic 2) and legacy message sets (magic 0/1): decode, verify, encode.

Layout (docs/formats.md §3, all integers big-endian). Every log entry starts with
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

from rlm.formats.records.decode import decode_records, parse_control_record
from rlm.formats.records.encode import build_batch, encode_control_key, encode_end_txn_marker
from rlm.formats.records.scan import iter_batches, valid_bytes
from rlm.formats.records.types import (
    LOG_OVERHEAD,
    MIN_ENTRY_SIZE,
    V2_HEADER_SIZE,
    Buffer,
    ControlRecord,
    ControlRecordType,
    Header,
    Record,
    RecordBatch,
    RecordSpec,
    TimestampType,
)

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
