"""Kafka's transaction index (``.txnindex``): the aborted transactions whose ABORT marker is in a
segment (docs/transactions.md).

Pure: the parser takes a buffer, the encoder returns bytes; nobody here opens a file.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from rlm.errors import CorruptIndexError
from rlm.formats.indexes.offset_index import Buffer

__all__ = [
    "ABORTED_TXN_SIZE",
    "ABORTED_TXN_VERSION",
    "AbortedTxn",
    "collect_aborted",
    "encode_txn_index",
    "parse_txn_index",
]

ABORTED_TXN_VERSION = 0
ABORTED_TXN_SIZE = 34
_ENTRY = struct.Struct(">hqqqq")
assert _ENTRY.size == ABORTED_TXN_SIZE


@dataclass(frozen=True, slots=True, order=True)
class AbortedTxn:
    """One aborted transaction of one producer, as Kafka's ``AbortedTxn`` writes it.

    Binary layout (big-endian, entries back to back, no header, no trailer, no padding)::

        off size field
          0   2  version int16 = 0
          2   8  producerId int64
         10   8  firstOffset int64       first offset of the transaction's data in the partition
         18   8  lastOffset int64        offset of its ABORT control record (in this segment)
         26   8  lastStableOffset int64  the partition's LSO once the marker was written

    Offsets are inclusive and absolute. An entry lives in the index of the segment that holds the
    ABORT marker, so ``firstOffset`` may lie in an earlier segment. Entries are appended in marker
    order: ``lastOffset`` strictly increases through a file.
    """

    first_offset: int
    last_offset: int
    producer_id: int
    last_stable_offset: int

    def encode(self) -> bytes:
        """The 34 bytes of this entry (version 0)."""
        return _ENTRY.pack(
            ABORTED_TXN_VERSION,
            self.producer_id,
            self.first_offset,
            self.last_offset,
            self.last_stable_offset,
        )

    def to_json(self) -> dict[str, int]:
        """Kafka's fetch-response field names (``AbortedTransaction``) plus the marker offset."""
        return {
            "producer_id": self.producer_id,
            "first_offset": self.first_offset,
            "last_offset": self.last_offset,
        }


def parse_txn_index(buf: Buffer, base_offset: int | None = None) -> list[AbortedTxn]:
    """Every entry of a ``.txnindex`` image, in file order.

    Raises :class:`CorruptIndexError` (with the byte position) when the length is not a multiple
    of 34 bytes (a torn entry), an entry's version is not 0, ``firstOffset > lastOffset``, markers
    do not increase, or — given the segment's ``base_offset`` — a marker lies below it (Kafka's
    ``TransactionIndex.sanityCheck``).
    """
    view = memoryview(buf)
    if len(view) % ABORTED_TXN_SIZE:
        raise CorruptIndexError(
            f"transaction index is {len(view)} bytes, not a multiple of {ABORTED_TXN_SIZE} "
            "(a torn last entry)",
            position=len(view) - len(view) % ABORTED_TXN_SIZE,
        )
    out: list[AbortedTxn] = []
    previous = -1
    for pos in range(0, len(view), ABORTED_TXN_SIZE):
        version, pid, first, last, lso = _ENTRY.unpack_from(view, pos)
        if version != ABORTED_TXN_VERSION:
            raise CorruptIndexError(f"aborted transaction entry version {version} is not 0", position=pos)
        if not 0 <= first <= last:
            raise CorruptIndexError(
                f"aborted transaction of producer {pid}: firstOffset {first} is not "
                f"in [0, lastOffset {last}]",
                position=pos,
                offset=last,
            )
        if last <= previous:
            raise CorruptIndexError(
                f"aborted transaction markers do not increase: {last} after {previous}",
                position=pos,
                offset=last,
            )
        if base_offset is not None and last < base_offset:
            raise CorruptIndexError(
                f"ABORT marker offset {last} is below the segment's base offset {base_offset}",
                position=pos,
                offset=last,
            )
        previous = last
        out.append(AbortedTxn(first, last, pid, lso))
    return out


def encode_txn_index(entries: Iterable[AbortedTxn]) -> bytes:
    """A ``.txnindex`` image of ``entries`` (in the given order)."""
    return b"".join(e.encode() for e in entries)


def collect_aborted(
    entries: Iterable[AbortedTxn], fetch_offset: int, upper_bound: int
) -> tuple[list[AbortedTxn], bool]:
    """Kafka's ``TransactionIndex.collectAbortedTxns`` over one segment's entries: those that
    overlap ``[fetch_offset, upper_bound)`` (``lastOffset >= fetch_offset`` and
    ``firstOffset < upper_bound``), and whether the search is *complete* — an entry whose
    ``lastStableOffset >= upper_bound`` proves every transaction that began below the bound had
    ended by then, so later segments cannot add any."""
    found: list[AbortedTxn] = []
    for e in entries:
        if e.last_offset >= fetch_offset and e.first_offset < upper_bound:
            found.append(e)
        if e.last_stable_offset >= upper_bound:
            return found, True
    return found, False
