"""Write Kafka-identical partitions: segments, indexes and checkpoints (for tests, demos, benchmarks).

The byte layout and the decisions (when to roll, when to add index entries, what the last time-index
entry is) follow Kafka's ``LogSegment`` / ``UnifiedLog`` so that files written here are
indistinguishable from a broker's closed segments:

* **Roll** (``LogSegment.shouldRoll``) before an append when the segment is non-empty and the batch
  would not fit (``size > segment_bytes - batch_size``), or it is older than ``segment_ms`` (age =
  the incoming batch's max timestamp minus the first batch's max timestamp, or ``clock()`` minus
  the segment's creation time when the first batch had no timestamp), or an index is full, or the
  batch's last offset would not fit an int32 relative offset. The new segment's base offset is
  max(first offset of the batch, log end offset).
* **Index entries** (``LogSegment.append``): *before* counting the current append, if more than
  ``index_interval_bytes`` were appended since the last entry, add ``.index`` (last offset of this
  append, position where it starts) and ``.timeindex`` (max timestamp so far, the last offset of the
  first batch that reached it) — the latter only when the timestamp strictly grows.
* **On roll and close** (``onBecomeInactiveSegment`` / ``close``) one final time-index entry
  (max timestamp so far) is added if it grows, so a closed segment's last time-index entry is its
  max timestamp. Index files are always exactly their entries (Kafka's trimmed size, no zero tail).
* **Checkpoints** in the log dir (``replication-offset-checkpoint``, ``recovery-point-offset-checkpoint``,
  ``log-start-offset-checkpoint``) are read-merged-written atomically (temp file + rename, like Kafka)
  so several writers can share one log dir sequentially; ``leader-epoch-checkpoint`` per partition.

Each append is one batch (what a producer request carries for one partition); ``append_raw`` of a
buffer holding several batches appends them one by one. Not thread-safe; no ``.snapshot`` /
``.txnindex`` files are produced.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from rlm.errors import InvalidArgumentError, LogDirError, RlmError
from rlm.formats import naming
from rlm.formats.checkpoint import (
    EpochEntry,
    format_leader_epoch_checkpoint,
    format_offset_checkpoint,
    parse_offset_checkpoint,
)
from rlm.formats.compression import Compression
from rlm.formats.indexes.segment_index import SegmentIndexer
from rlm.formats.indexes.time_index import TimeIndexBuilder
from rlm.formats.partition_metadata import format_partition_metadata
from rlm.formats.records import Record, RecordBatch, RecordSpec, TimestampType, build_batch, iter_batches
from rlm.logdir.discovery import (
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    PARTITION_METADATA,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
)

__all__ = ["AppendInfo", "Clock", "LogWriter", "system_clock"]

#: Milliseconds since the epoch; injectable so tests can roll by time deterministically.
Clock = Callable[[], int]

_INT32_MAX = 2**31 - 1
_BASE_OFFSET = struct.Struct(">q")
_PLE_AT = 12  # partitionLeaderEpoch int32 @12 of a v2 batch; not covered by the CRC


def system_clock() -> int:
    """Wall-clock milliseconds (Kafka's ``Time.SYSTEM.milliseconds()``)."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """Where one appended batch landed: segment base offset, byte ``position`` in its ``.log``, ``size``
    in bytes, offsets ``[base_offset, last_offset]`` and the batch ``max_timestamp``."""

    segment_base_offset: int
    position: int
    size: int
    base_offset: int
    last_offset: int
    max_timestamp: int


class _Segment:
    """The active segment: open files plus the in-memory state Kafka's LogSegment keeps."""

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        created_ms: int,
        *,
        index_interval_bytes: int,
        max_index_bytes: int,
    ) -> None:
        self.base_offset = base_offset
        self.created_ms = created_ms
        self.log_path = directory / naming.segment_file_name(base_offset, naming.LOG)
        self.index_path = directory / naming.segment_file_name(base_offset, naming.INDEX)
        self.time_index_path = directory / naming.segment_file_name(base_offset, naming.TIME_INDEX)
        # "xb": a segment file that already exists means two writers or a stale dir: refuse.
        self.log: BinaryIO = open(self.log_path, "xb")  # noqa: SIM115 - lives as long as the segment
        self.index: BinaryIO = open(self.index_path, "xb")  # noqa: SIM115
        self.time_index: BinaryIO = open(self.time_index_path, "xb")  # noqa: SIM115
        # The indexer carries Kafka's index rules and full checks (shared with the rebuild of a
        # broken index); its bytes go straight to disk, so the files are always exactly their entries.
        self.indexer = SegmentIndexer(base_offset, index_interval_bytes, max_index_bytes=max_index_bytes)
        self.offsets = self.indexer.offsets
        self.times = self.indexer.times
        self.size = 0
        self.rolling_based_timestamp: int | None = None

    def can_hold_offset(self, offset: int) -> bool:
        return 0 <= offset - self.base_offset <= _INT32_MAX

    def indexes_full(self) -> bool:
        return self.offsets.is_full() or self.times.is_full()

    def time_waited_for_roll(self, now_ms: int, batch_max_timestamp: int) -> int:
        # Kafka measures age by record time when the first batch had one, else by wall clock.
        if self.rolling_based_timestamp is not None and self.rolling_based_timestamp >= 0:
            return batch_max_timestamp - self.rolling_based_timestamp
        return now_ms - self.created_ms

    def append(self, data: bytes, batch: RecordBatch) -> int:
        """Append one batch; returns the position it starts at. Mirrors ``LogSegment.append``."""
        position = self.size
        if position == 0:
            self.rolling_based_timestamp = batch.max_timestamp
        self.log.write(data)
        self.size += len(data)
        offset_entry, time_entry = self.indexer.on_append(
            position, len(data), batch.last_offset, batch.max_timestamp
        )
        self.index.write(offset_entry)
        self.time_index.write(time_entry)
        return position

    def become_inactive(self) -> None:
        """Kafka's ``onBecomeInactiveSegment`` / ``close``: final time entry, then flush and close."""
        self.time_index.write(self.indexer.on_inactive())
        for handle in (self.log, self.index, self.time_index):
            handle.flush()
            handle.close()


class LogWriter:
    """Writes one partition ``<log_dir>/<topic>-<partition>`` the way a Kafka broker would.

    Parameters mirror Kafka's topic configs: ``segment_bytes`` (segment.bytes), ``segment_ms``
    (segment.ms), ``index_interval_bytes`` (index.interval.bytes), ``max_index_bytes``
    (segment.index.bytes). ``clock`` returns milliseconds (used for time-based rolls of segments
    without timestamps and for LogAppendTime). ``start_offset`` is the first segment's base offset.
    ``leader_epoch`` is stamped on appended batches (like a leader does) and recorded in the
    partition's ``leader-epoch-checkpoint``; change it with :attr:`leader_epoch`.

    The partition directory must not already contain segments (no resume/recovery).
    Use as a context manager or call :meth:`close`, which writes all checkpoints.
    """

    def __init__(
        self,
        log_dir: Path | str,
        topic: str,
        partition: int,
        *,
        segment_bytes: int = 1024 * 1024 * 1024,
        segment_ms: int = 7 * 24 * 3600 * 1000,
        index_interval_bytes: int = 4096,
        max_index_bytes: int = 10 * 1024 * 1024,
        clock: Clock = system_clock,
        start_offset: int = 0,
        leader_epoch: int = 0,
        topic_id: str | None = None,
    ) -> None:
        naming.validate_topic(topic)
        if partition < 0:
            raise InvalidArgumentError(f"partition must be >= 0, got {partition}")
        # Kafka's minimums: a segment must hold at least a batch header, an index at least one entry.
        if segment_bytes < 14 or segment_ms < 1 or index_interval_bytes < 0:
            raise InvalidArgumentError("segment_bytes >= 14, segment_ms >= 1, index_interval_bytes >= 0")
        if max_index_bytes < 2 * TimeIndexBuilder.ENTRY_SIZE:
            # Kafka's time index keeps one slot free for the roll entry, so it needs room for two.
            raise InvalidArgumentError(f"max_index_bytes must be >= {2 * TimeIndexBuilder.ENTRY_SIZE}")
        self.log_dir = Path(log_dir)
        self.topic = topic
        self.partition = partition
        self.path = self.log_dir / f"{topic}-{partition}"
        self.segment_bytes = segment_bytes
        self.segment_ms = segment_ms
        self.index_interval_bytes = index_interval_bytes
        self.max_index_bytes = max_index_bytes
        self.clock = clock
        self.leader_epoch = leader_epoch
        self._epochs: list[EpochEntry] = []
        self._high_watermark: int | None = None
        self._log_start_offset = start_offset
        self._recovery_point = start_offset
        self._closed = False
        self.path.mkdir(parents=True, exist_ok=True)
        if any(name.endswith(naming.LOG) for name in os.listdir(self.path)):
            raise LogDirError(
                "partition directory already has segments; LogWriter does not resume", file=self.path
            )
        if topic_id is not None:
            _atomic_write(self.path / PARTITION_METADATA, format_partition_metadata(topic_id).decode())
        self._segment_bases: list[int] = []
        self._log_end_offset = start_offset
        self._active = self._new_segment(start_offset)
        self._write_leader_epochs()

    # -- state ---------------------------------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        """The next offset to be assigned (one past the last appended offset)."""
        return self._log_end_offset

    @property
    def high_watermark(self) -> int:
        """The committed end written to ``replication-offset-checkpoint``; defaults to the log end."""
        return self._log_end_offset if self._high_watermark is None else self._high_watermark

    @high_watermark.setter
    def high_watermark(self, value: int | None) -> None:
        if value is not None and not self._log_start_offset <= value <= self._log_end_offset:
            raise InvalidArgumentError(
                f"high watermark {value} outside [log start {self._log_start_offset}, "
                f"log end {self._log_end_offset}]"
            )
        self._high_watermark = value

    @property
    def log_start_offset(self) -> int:
        """First readable offset; written to ``log-start-offset-checkpoint`` only when it is above the
        first segment's base (Kafka's rule)."""
        return self._log_start_offset

    @log_start_offset.setter
    def log_start_offset(self, value: int) -> None:
        if not self._log_start_offset <= value <= self.high_watermark:
            raise InvalidArgumentError(f"log start offset {value} must be in [{self._log_start_offset}, HW]")
        self._log_start_offset = value

    @property
    def recovery_point(self) -> int:
        """Offsets below it are flushed: the active segment's base while open, the log end after close."""
        return self._recovery_point

    @property
    def segment_base_offsets(self) -> list[int]:
        """Base offsets of all segments written so far; the last one is the active segment."""
        return list(self._segment_bases)

    @property
    def active_segment_size(self) -> int:
        """Bytes in the active segment's ``.log``."""
        return self._active.size

    # -- appends -------------------------------------------------------------------------------

    def append(
        self,
        records: Sequence[RecordSpec | Record],
        *,
        compression: Compression = Compression.NONE,
        timestamp_type: TimestampType = TimestampType.CREATE_TIME,
        producer_id: int = -1,
        producer_epoch: int = -1,
        base_sequence: int = -1,
        is_transactional: bool = False,
        is_control: bool = False,
    ) -> AppendInfo:
        """Append ``records`` as one v2 batch built by :func:`rlm.formats.records.build_batch`.

        ``RecordSpec`` records get consecutive offsets from :attr:`log_end_offset`; ``Record``
        offsets are kept (gaps allowed, each ≥ the log end offset). With LogAppendTime the batch
        timestamp is ``clock()``.
        """
        self._check_open()
        if not records:
            raise InvalidArgumentError("append needs at least one record")
        log_append_time = self.clock() if timestamp_type == TimestampType.LOG_APPEND_TIME else None
        data = build_batch(
            records,
            base_offset=self._log_end_offset,
            compression=compression,
            timestamp_type=timestamp_type,
            log_append_time=log_append_time,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            partition_leader_epoch=self.leader_epoch,
            is_transactional=is_transactional,
            is_control=is_control,
        )
        return self._append_batch(data)

    def append_raw(
        self, data: bytes | bytearray | memoryview, *, assign_offsets: bool = True
    ) -> list[AppendInfo]:
        """Append prebuilt batches (e.g. from kafka-python's builders), one append per batch.

        ``assign_offsets=True`` acts like a leader: each v2 batch's baseOffset is rewritten to the
        log end offset and its partitionLeaderEpoch to :attr:`leader_epoch` (neither is covered by
        the CRC). ``False`` acts like a follower: batches are written unchanged and must start at
        or after the log end offset. Legacy (magic 0/1) entries are always written unchanged.
        """
        self._check_open()
        buf = bytes(data)
        try:
            batches = list(iter_batches(buf))
        except RlmError as exc:
            raise InvalidArgumentError(f"append_raw: not a valid batch sequence: {exc}") from exc
        consumed = batches[-1].end_position if batches else 0
        if consumed != len(buf):
            raise InvalidArgumentError(
                f"append_raw: {len(buf) - consumed} trailing bytes after the last batch"
            )
        results: list[AppendInfo] = []
        for batch in batches:
            chunk = bytearray(buf[batch.position : batch.end_position])
            if assign_offsets and batch.magic >= 2:
                _BASE_OFFSET.pack_into(chunk, 0, self._log_end_offset)
                struct.pack_into(">i", chunk, _PLE_AT, self.leader_epoch)
            results.append(self._append_batch(bytes(chunk)))
        return results

    def _append_batch(self, data: bytes) -> AppendInfo:
        batch = next(iter_batches(data))
        if batch.base_offset < self._log_end_offset:
            raise InvalidArgumentError(
                f"batch base offset {batch.base_offset} is below the log end offset {self._log_end_offset}"
            )
        if self._should_roll(batch, len(data)):
            self._roll(batch.base_offset)
        if not self._active.can_hold_offset(batch.last_offset):
            raise InvalidArgumentError(
                f"offsets {batch.base_offset}-{batch.last_offset} do not fit one segment"
            )
        position = self._active.append(data, batch)
        self._log_end_offset = batch.last_offset + 1
        if batch.magic >= 2 and batch.partition_leader_epoch >= 0:
            self._maybe_assign_epoch(batch.partition_leader_epoch, batch.base_offset)
        return AppendInfo(
            segment_base_offset=self._active.base_offset,
            position=position,
            size=len(data),
            base_offset=batch.base_offset,
            last_offset=batch.last_offset,
            max_timestamp=batch.max_timestamp,
        )

    def _should_roll(self, batch: RecordBatch, size: int) -> bool:
        seg = self._active
        reached_roll_ms = seg.time_waited_for_roll(self.clock(), batch.max_timestamp) > self.segment_ms
        return (
            seg.size > self.segment_bytes - size
            or (seg.size > 0 and reached_roll_ms)
            or seg.indexes_full()
            or not seg.can_hold_offset(batch.last_offset)
        )

    # -- segments ------------------------------------------------------------------------------

    def _new_segment(self, base_offset: int) -> _Segment:
        segment = _Segment(
            self.path,
            base_offset,
            self.clock(),
            index_interval_bytes=self.index_interval_bytes,
            max_index_bytes=self.max_index_bytes,
        )
        self._segment_bases.append(base_offset)
        return segment

    def roll(self) -> int:
        """Close the active segment and start a new one at the log end offset; returns its base.

        Like Kafka, rolling an empty active segment whose base is the log end offset is a no-op.
        """
        self._check_open()
        return self._roll(self._log_end_offset)

    def _roll(self, next_base_offset: int) -> int:
        # Kafka's UnifiedLog.roll: base = max(first offset of the incoming batch, log end offset).
        base = max(next_base_offset, self._log_end_offset)
        if self._active.size == 0 and self._active.base_offset == base:
            return base
        if self._active.size == 0:
            # An empty segment is replaced, as Kafka does, instead of leaving an empty file behind.
            self._active.become_inactive()
            for path in (self._active.log_path, self._active.index_path, self._active.time_index_path):
                path.unlink()
            self._segment_bases.pop()
        else:
            self._active.become_inactive()
        self._active = self._new_segment(base)
        # Kafka flushes everything below the new segment right after a roll.
        self._recovery_point = base
        return base

    # -- checkpoints ---------------------------------------------------------------------------

    def _maybe_assign_epoch(self, epoch: int, start_offset: int) -> None:
        if not self._epochs or epoch > self._epochs[-1].epoch:
            self._epochs.append(EpochEntry(epoch=epoch, start_offset=start_offset))
            self._write_leader_epochs()

    def _write_leader_epochs(self) -> None:
        text = format_leader_epoch_checkpoint(self._epochs)
        _atomic_write(self.path / LEADER_EPOCH_CHECKPOINT, text)

    def write_checkpoints(self) -> None:
        """Merge this partition's HW, recovery point and log start offset into the log dir's files."""
        key = (self.topic, self.partition)
        _merge_checkpoint(self.log_dir / REPLICATION_OFFSET_CHECKPOINT, key, self.high_watermark)
        _merge_checkpoint(self.log_dir / RECOVERY_POINT_CHECKPOINT, key, self._recovery_point)
        first_base = self._segment_bases[0]
        lso = self._log_start_offset if self._log_start_offset > first_base else None
        _merge_checkpoint(self.log_dir / LOG_START_OFFSET_CHECKPOINT, key, lso)
        self._write_leader_epochs()

    def flush(self) -> None:
        """Push the active segment's appended bytes to the file (a reader of the live log sees them)."""
        self._check_open()
        for handle in (self._active.log, self._active.index, self._active.time_index):
            handle.flush()

    def close(self) -> None:
        """Close the active segment like a clean shutdown (final time-index entry) and write checkpoints."""
        if self._closed:
            return
        self._active.become_inactive()
        self._recovery_point = self._log_end_offset
        self._closed = True
        self.write_checkpoints()

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgumentError(f"LogWriter for {self.path} is closed")

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _atomic_write(path: Path, text: str) -> None:
    """Write via a temp file and rename, as Kafka does, so readers never see a half-written file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _merge_checkpoint(path: Path, key: tuple[str, int], value: int | None) -> None:
    """Set (or, for ``None``, remove) one partition's entry in a log-dir offset checkpoint."""
    entries: dict[tuple[str, int], int] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    if text.strip():
        try:
            entries = dict(parse_offset_checkpoint(text).entries)
        except RlmError as exc:
            raise exc.in_file(path) from exc
    if value is None:
        entries.pop(key, None)
    else:
        entries[key] = value
    _atomic_write(path, format_offset_checkpoint(entries))
