"""Kafka's producer-state snapshot (``<offset>.snapshot``): which producers a partition knew at an
offset and the transaction each had open there (docs/formats.md §4.5, docs/transactions.md).

Pure: the parser takes a buffer; the caller opened the file or object and names it on error
(:meth:`~rlm.errors.RlmError.in_file`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c as _crc32c

from rlm.errors import CorruptSnapshotError
from rlm.formats.indexes.offset_index import Buffer

__all__ = [
    "PRODUCER_SNAPSHOT_VERSION",
    "ProducerSnapshot",
    "ProducerSnapshotEntry",
    "parse_producer_snapshot",
]

PRODUCER_SNAPSHOT_VERSION = 1
_HEADER = struct.Struct(">hIi")  # version, crc, entry count
_ENTRY = struct.Struct(">qhiqiqiq")
_CRC_FROM = 6  # the CRC covers everything after the version and the CRC field itself
assert _HEADER.size == 10 and _ENTRY.size == 46


@dataclass(frozen=True, slots=True)
class ProducerSnapshotEntry:
    """One producer's state in a snapshot; offsets are absolute, ``-1`` = none.

    ``current_txn_first_offset`` is the first offset of the producer's transaction still open at
    the snapshot's offset (-1: none open); ``last_offset`` is the last offset of its last data
    batch (-1 when its only entry is a marker); ``timestamp`` is in milliseconds since the epoch.
    """

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_offset: int
    offset_delta: int
    timestamp: int
    coordinator_epoch: int
    current_txn_first_offset: int


@dataclass(frozen=True, slots=True)
class ProducerSnapshot:
    """A parsed ``.snapshot``, as Kafka's ``ProducerStateManager`` writes it at a segment roll
    (the file's name is the offset it describes: the state after every batch below it).

    Binary layout (big-endian, no padding, nothing after the last entry)::

        off size field
          0   2  version int16 = 1
          2   4  crc uint32            CRC-32C (Castagnoli) of bytes [6, end)
          6   4  count int32           number of entries (>= 0)
         10  46  entry, ``count`` times, back to back; inside an entry:
                   off size field
                     0   8  producerId int64
                     8   2  producerEpoch int16
                    10   4  lastSequence int32
                    14   8  lastOffset int64             -1: no data batch
                    22   4  offsetDelta int32
                    26   8  timestamp int64              ms since the epoch
                    34   4  coordinatorEpoch int32
                    38   8  currentTxnFirstOffset int64  -1: no open transaction
    """

    entries: tuple[ProducerSnapshotEntry, ...]

    def open_transactions(self) -> dict[int, int]:
        """Producer id → first offset of its transaction open at the snapshot's offset."""
        return {
            e.producer_id: e.current_txn_first_offset for e in self.entries if e.current_txn_first_offset >= 0
        }


def parse_producer_snapshot(buf: Buffer) -> ProducerSnapshot:
    """Parse a whole snapshot; :class:`CorruptSnapshotError` (with the byte position and field)
    for a short file, an unknown version, a CRC mismatch, a bad count or trailing bytes."""
    data = memoryview(buf)
    if len(data) < _HEADER.size:
        raise CorruptSnapshotError(
            f"header: {len(data)} bytes, a snapshot has at least {_HEADER.size}", position=0
        )
    version, crc, count = _HEADER.unpack_from(data, 0)
    if version != PRODUCER_SNAPSHOT_VERSION:
        raise CorruptSnapshotError(
            f"version {version}: only {PRODUCER_SNAPSHOT_VERSION} is known", position=0
        )
    computed = _crc32c.crc32c(data[_CRC_FROM:])
    if computed != crc:
        raise CorruptSnapshotError(f"crc: stored {crc:#010x}, computed {computed:#010x}", position=2)
    if count < 0:
        raise CorruptSnapshotError(f"count {count}: must not be negative", position=6)
    expected = _HEADER.size + count * _ENTRY.size
    if len(data) != expected:
        raise CorruptSnapshotError(
            f"count {count} needs {expected} bytes, the snapshot has {len(data)}", position=6
        )
    entries = tuple(
        ProducerSnapshotEntry(*_ENTRY.unpack_from(data, _HEADER.size + n * _ENTRY.size)) for n in range(count)
    )
    return ProducerSnapshot(entries)
