"""One partition's Fetch and ListOffsets answers, as Kafka's broker computes them, from rlm's
tiered readers (docs/kafka-listener.md). Blocking (files, the store): the server runs these in
its thread pool, never on the event loop.

Visibility is rlm's (docs/visibility.md): nothing at or above the high watermark, nothing below the
log start. read_committed follows Kafka's wire protocol, not rlm's HTTP filter: the record batches go
out byte for byte up to the last stable offset, *with* the aborted transactions of the range, and
the client drops aborted records and control batches itself (docs/transactions.md).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from rlm.cluster.log_starts import LogStartQuery
from rlm.errors import OffsetOutOfRangeError, RlmError
from rlm.kafka.epochs import UNDEFINED, end_offset_for, fence
from rlm.kafka.protocol import Codes, kafka_code
from rlm.tiering.read import (
    EARLIEST_LOCAL,
    LATEST_TIERED,
    MAX_TIMESTAMP,
    Isolation,
    PartitionReader,
    TieredReaders,
    Visibility,
    batches_below,
)

__all__ = [
    "EpochEnd",
    "FetchedPartition",
    "ListedOffset",
    "epoch_end_offset",
    "error_code",
    "fetch_partition",
    "list_offset",
    "offsets_only",
    "partition_marks",
    "reader_for",
    "served",
]

#: The ListOffsets version that introduced each special timestamp (KIP-734, KIP-1005).
_MIN_VERSION = {MAX_TIMESTAMP: 7, EARLIEST_LOCAL: 8, LATEST_TIERED: 9}


@dataclass(frozen=True, slots=True)
class FetchedPartition:
    """One partition of a Fetch response. Offsets are -1 when unknown (Kafka's default);
    ``aborted`` is None for read_uncommitted (Kafka sends null), a list for read_committed."""

    error: int
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: bytes | memoryview = b""  # a zero-copy view of the read when remote, sent as it is
    aborted: list[tuple[int, int]] | None = None  # (producer id, first offset)


@dataclass(frozen=True, slots=True)
class ListedOffset:
    """One partition of a ListOffsets response: -1 offset and timestamp = no such record."""

    error: int
    timestamp: int = -1
    offset: int = -1
    leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class EpochEnd:
    """One partition of an OffsetForLeaderEpoch response: -1, -1 = nothing known of the epoch."""

    error: int
    leader_epoch: int = -1
    end_offset: int = -1


def error_code(err: Exception) -> int:
    """The Kafka error code of an rlm error: its class's ``kafka_error`` (rlm/errors.py, the one
    table of how errors surface), never its message; UNKNOWN_SERVER_ERROR for anything else."""
    if not isinstance(err, RlmError):
        return Codes.UNKNOWN_SERVER_ERROR
    return kafka_code(err.kafka_error)


def served(readers: TieredReaders, topic: str) -> bool:
    """Whether the listener shows ``topic``: the readers' one rule (no KRaft log, no internal
    topics unless allowed; docs/visibility.md, "Internal topics")."""
    return readers.serves(topic)


def reader_for(
    readers: TieredReaders, topic: str, partition: int, query: LogStartQuery | None = None
) -> PartitionReader:
    """The partition's reader; a topic not served is unknown here (:class:`PartitionNotFoundError`).
    ``query``: the request's question to the broker about log starts (docs/visibility.md)."""
    return readers.reader(topic, partition, query)


def _or(value: int | None, default: int = -1) -> int:
    return default if value is None else value


def offsets_only(
    readers: TieredReaders,
    topic: str,
    partition: int,
    query: LogStartQuery | None = None,
    current_epoch: int = -1,
) -> FetchedPartition:
    """An answer with no records: the partition's offsets only (the response is already full),
    the last stable offset too, as :func:`fetch_partition` gives it."""
    try:
        reader = reader_for(readers, topic, partition, query)
        fenced = _fenced(readers, reader, current_epoch)
        if fenced:
            return FetchedPartition(fenced)
        vis = reader.visibility()
    except RlmError as err:
        return FetchedPartition(error_code(err))
    hw = _or(vis.offsets.visible_end_offset, 0)
    return FetchedPartition(Codes.NONE, hw, _told_lso(vis, hw), _or(vis.offsets.log_start_offset))


def _told_lso(vis: Visibility, hw: int) -> int:
    """The last stable offset a read_uncommitted answer reports: the client uses it only for its
    lag, so when it cannot be known now (its transactions' first records are in a store that
    fails) the answer says -1 (Kafka's "unknown") instead of failing a read that does not need it."""
    if vis.offsets.visible_end_offset is None:
        return hw
    try:
        return vis.end("read_committed")
    except RlmError:
        return -1


def partition_marks(
    readers: TieredReaders, topic: str, partition: int, at: int, query: LogStartQuery | None = None
) -> tuple[int, int]:
    """``(log start, visible end)`` of the partition now, without reading records (a waiting
    Fetch's re-check; ``at``: its fetch offset, so the broker is asked about a log start only when
    a read there would be, ``query``: the read's, whose answers stand for its re-checks), with the
    defaults a Fetch answer gives them (:func:`fetch_partition`).
    ``(-2, -2)`` when the partition cannot be read: it differs from every answer's, so the wait
    re-reads and answers the error."""
    try:
        ranges = reader_for(readers, topic, partition, query).offsets(at=at)
    except RlmError:
        return -2, -2
    return _or(ranges.log_start_offset), _or(ranges.visible_end_offset, 0)  # as a Fetch answers them


def fetch_partition(
    readers: TieredReaders,
    topic: str,
    partition: int,
    offset: int,
    max_bytes: int,
    committed: bool,
    reader_key: Hashable,
    query: LogStartQuery | None = None,
    current_epoch: int = -1,
) -> FetchedPartition:
    """Whole batches from the one holding ``offset`` while they fit ``max_bytes`` (at least one,
    as Kafka answers a first partition with data; the caller enforces the response's budget),
    below the high watermark — below the last stable offset under read_committed. The last stable
    offset is answered under both isolation levels, as Kafka's broker does (a read_uncommitted
    consumer reports its lag to it too). ``current_epoch``: the request's ``current_leader_epoch``
    (-1: not checked)."""
    try:
        reader = reader_for(readers, topic, partition, query)
        fenced = _fenced(readers, reader, current_epoch)
        if fenced:
            return FetchedPartition(fenced)
        fetched = reader.fetch(offset, max(1, max_bytes), reader_key=reader_key)
    except OffsetOutOfRangeError:
        return _out_of_range()
    except RlmError as err:
        return FetchedPartition(error_code(err))
    hw = _or(fetched.high_watermark, 0)
    start = _or(fetched.log_start_offset)
    vis = fetched.seen  # the moment the fetch saw: its LSO and aborted transactions
    if not committed:
        return FetchedPartition(Codes.NONE, hw, _told_lso(vis, hw), start, fetched.data)
    try:
        lso = vis.end("read_committed") if fetched.high_watermark is not None else hw
        kept = list(batches_below(iter(fetched.batches), lso))
        if not kept:
            return FetchedPartition(Codes.NONE, hw, lso, start, b"", [])
        found = vis.aborted(kept[0].base_offset, kept[-1].last_offset + 1)
    except RlmError as err:
        return FetchedPartition(error_code(err))
    data = fetched.data[: kept[-1].end_position]  # a prefix: the batches are contiguous
    aborted = [(a.producer_id, a.first_offset) for a in found.entries]
    return FetchedPartition(Codes.NONE, hw, lso, start, data, aborted)


def _out_of_range() -> FetchedPartition:
    """Kafka's answer to a fetch offset outside the log: OFFSET_OUT_OF_RANGE with every offset
    unknown (-1), as a broker's read error carries none; clients reset with ListOffsets."""
    return FetchedPartition(Codes.OFFSET_OUT_OF_RANGE)


def list_offset(
    readers: TieredReaders,
    topic: str,
    partition: int,
    timestamp: int,
    committed: bool,
    version: int,
    query: LogStartQuery | None = None,
    current_epoch: int = -1,
) -> ListedOffset:
    """Kafka's ListOffsets for one partition (docs/kafka-listener.md "ListOffsets"): -1 the high
    watermark (read_committed: the last stable offset), -2 the log start offset, -3 the first
    record with the largest timestamp, -4 the local log start offset (-2 and -4 whatever the
    isolation level), -5 the highest tiered offset, a timestamp ≥ 0 the first visible record at
    or after it (else offset -1)."""
    if timestamp in _MIN_VERSION and version < _MIN_VERSION[timestamp]:
        return ListedOffset(Codes.UNSUPPORTED_VERSION)
    if timestamp < LATEST_TIERED:
        return ListedOffset(Codes.INVALID_REQUEST)
    try:
        reader = reader_for(readers, topic, partition, query)
        fenced = _fenced(readers, reader, current_epoch)
        if fenced:
            return ListedOffset(fenced)
        vis = reader.visibility()
        isolation: Isolation = "read_committed" if committed else "read_uncommitted"
        if timestamp != MAX_TIMESTAMP and timestamp < 0:  # the authority's answer, as Kafka's
            return ListedOffset(Codes.NONE, -1, vis.special_offset(timestamp, isolation))
        end = vis.end(isolation)
        found = reader.lookup_timestamp(timestamp, seen=vis)
    except RlmError as err:
        return ListedOffset(error_code(err))
    if not found.found or found.offset is None or found.offset >= end:
        return ListedOffset(Codes.NONE)
    epoch = found.batch.partition_leader_epoch if found.batch is not None else -1
    return ListedOffset(Codes.NONE, _or(found.timestamp), found.offset, epoch)


def _fenced(readers: TieredReaders, reader: PartitionReader, current: int) -> int:
    """The error a request's ``current_leader_epoch`` earns for this partition (KIP-320;
    rlm/kafka/epochs.py ``fence``): NONE when it is -1 or the partition's current one."""
    return Codes.NONE if current < 0 else fence(current, readers.leader_epoch(reader.part))


def epoch_end_offset(
    readers: TieredReaders, topic: str, partition: int, current: int, requested: int
) -> EpochEnd:
    """Kafka's OffsetForLeaderEpoch for one partition (``LeaderEpochFileCache.endOffsetFor`` over
    rlm's lineage, docs/kafka-listener.md §5.4): the latest epoch ends at the visible end (the high
    watermark; a broker says its log end, which a consumer's position never passes either); an
    older one where the next begins. An epoch newer than rlm's latest is UNKNOWN_LEADER_EPOCH
    (retriable: rlm's checkpoint lags the broker's), never Kafka's UNDEFINED answer, on which a
    Java consumer would reset its position."""
    try:
        reader = reader_for(readers, topic, partition)
        vis = reader.visibility()
        lineage = readers.leader_epochs(reader.part, _or(vis.offsets.log_start_offset, 0))
    except RlmError as err:
        return EpochEnd(error_code(err))
    latest = lineage[-1].epoch if lineage else -1
    code = fence(current, latest)
    if code:
        return EpochEnd(code)
    if latest >= 0 and requested > latest:
        return EpochEnd(Codes.UNKNOWN_LEADER_EPOCH)
    visible_end = vis.end()
    epoch, end = end_offset_for(lineage, requested, visible_end)
    if (epoch, end) == UNDEFINED:
        return EpochEnd(Codes.NONE)
    # an epoch that ended where a newer one began past the high watermark: nothing there is
    # visible, so its end is told as the visible end (a consumer's position never passes it)
    return EpochEnd(Codes.NONE, epoch, min(end, visible_end))
