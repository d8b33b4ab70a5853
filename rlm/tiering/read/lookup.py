"""Lookups and fetches across tiers (docs/formats.md §8), over the visible offsets only: ``[log start,
high watermark)`` (docs/visibility.md).

* **offset t** — ``local_log_start ≤ t < log_end`` → the local segment (``.index`` floor → scan);
  else ``remote_log_start ≤ t ≤ highest_tiered`` → the remote index set (``.remoteoffsetindex``
  floor → the entry → ONE ranged read of that entry's bytes); else not found, with the valid
  ranges. Offsets in compaction gaps resolve to the next existing offset, as Kafka does.
* **timestamp ts ≥ 0** — Kafka ListOffsets: the first visible offset whose timestamp ≥ ts, remote
  tier first (``.remotetimeindex`` → entry → one ranged read), then the local segments. −1 latest
  (the HW), −2 earliest (log start), −3 max timestamp, −4 earliest local, −5 latest tiered.
* **fetch** — from the batch holding the offset, whole batches below the HW while they fit in
  ``max_bytes``, at least one; at the HW none. Remote fetches read whole index entries along the
  store's chain, without a second CRC walk unless asked, and read ahead for sequential readers
  (rlm/tiering/read/readahead.py, docs/read-path.md).

Readers never write: they use the local remote-index files as they are and the persisted progress;
while those files hold less than the progress says was tiered, the store's sets answer instead
(rlm/tiering/read/served_sets.py, docs/read-path.md "When the local remote index is missing").
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Hashable, Sequence

from rlm.cluster.log_starts import LogStartQuery
from rlm.errors import InvalidArgumentError, OffsetInGapError, OffsetOutOfRangeError
from rlm.formats.indexes.remote_index import DecodedEntry
from rlm.formats.records import RecordBatch
from rlm.logdir.discovery import PartitionDir, SegmentFiles, list_segments
from rlm.logdir.index_sets import SetView
from rlm.nowait import may_wait
from rlm.tiering.local import Progress, gap_at
from rlm.tiering.read.answers import FetchResult, LocalLocation, Located, LookupResult, Tier
from rlm.tiering.read.cache import RangeBytes
from rlm.tiering.read.lookup_local import local_fetch, local_offset, local_timestamp
from rlm.tiering.read.lookup_remote import remote_offset, remote_timestamp
from rlm.tiering.read.max_timestamp import local_max_timestamp
from rlm.tiering.read.partition_txns import PartitionTxns
from rlm.tiering.read.readahead import ReaderResources
from rlm.tiering.read.remote_fetch import EntrySource, FetchBytes, remote_fetch
from rlm.tiering.read.remote_sets import remote_max_timestamp
from rlm.tiering.read.served_sets import Claim, claim_of
from rlm.tiering.read.txn_sources import reader_sources
from rlm.tiering.read.visibility import (
    EARLIEST_LOCAL,
    LATEST,
    LATEST_TIERED,
    MAX_TIMESTAMP,
    SPECIAL_TIMESTAMPS,
    PartitionOffsets,
    Visibility,
    invisible_reason,
    partition_offsets,
)

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------


class PartitionReader:
    """Answers lookups and fetches for one partition from both tiers (read-only).

    ``remote_first``: offsets that were tiered are answered from the remote tier even while a local
    copy exists — set for compacted topics, whose local copy may have been rewritten by the cleaner
    after tiering (docs/topic-policy.md), so every tiered offset gets one consistent answer.
    """

    remote_first = False

    def __init__(
        self,
        part: PartitionDir,
        resources: ReaderResources,
        progress: Progress,
        log_starts: LogStartQuery | None = None,
    ) -> None:
        """``log_starts``: where to ask the broker's live log start (docs/visibility.md "Before the
        checkpoint reaches disk"); None = the log dir's files alone."""
        self.part = part
        self.res = resources
        self.progress = progress
        self._views: tuple[Claim | None, list[SetView]] | None = None
        self.log_starts = log_starts
        self._asked: tuple[int | None] | None = None  # the broker's answer, asked once per reader
        self._names: list[str] | None = None  # the directory as last listed: segments and sets alike

    # -- what is where ------------------------------------------------------------------------

    def _sets(self) -> list[SetView]:
        """The remote tier's sets for what the progress claims is tiered: the local ones, or the
        store's while those fall short (rlm/tiering/read/served_sets.py). One list while the claim
        holds, so a fetch and its read_committed sources see the same sets."""
        claim = claim_of(self.progress)
        if self._views is None or self._views[0] != claim:
            local = self.res.sets.sets(self.part.path, self._names)
            self._views = (claim, self.res.store_sets.served(self.part, self.progress, local))
        return self._views[1]

    def offsets(
        self, segments: Sequence[SegmentFiles] | None = None, *, at: int | None = None
    ) -> PartitionOffsets:
        """Where each tier starts and ends now (docs/visibility.md). With ``log_starts``, the
        broker's live log start is asked too — unless ``at``, the offset a read would serve, is
        neither visible by the files nor held by the local log past their visible end
        (:meth:`PartitionOffsets.asks_broker`: a consumer waiting at the log's end costs no request)."""
        checkpoints = self.res.checkpoints.get(self.part.log_dir)
        told = self.res.broker_hw
        hw = told(self.part.topic, self.part.partition) if told is not None else None
        ranges = partition_offsets(
            self.part, self.progress, segments, checkpoints, self.res.eligibility, broker_hw=hw
        )
        if self.log_starts is None or (at is not None and not ranges.asks_broker(at)):
            return ranges
        if self._asked is None:
            self._asked = (self.log_starts.log_start(self.part.topic, self.part.partition),)
        (start,) = self._asked
        if start is None or ranges.log_start_offset is None or start <= ranges.log_start_offset:
            return ranges
        # Listed again, after the answer: the broker raises its log start before it renames the
        # segments its retention deletes, so an older listing could make that look like DeleteRecords.
        return partition_offsets(
            self.part, self.progress, list_segments(self.part), checkpoints, self.res.eligibility, start, hw
        )

    def visibility(
        self, segments: Sequence[SegmentFiles] | None = None, *, at: int | None = None
    ) -> Visibility:
        """What a consumer may see now (:class:`~rlm.tiering.read.visibility.Visibility`): the
        offsets (:meth:`offsets`, ``at`` as there) and, when asked, the transactions of the
        same listing."""
        if segments is None:
            self._names, segments = self.res.listings.get(self.part.path)
        return Visibility(self.offsets(segments, at=at), segments, functools.partial(self._txns, segments))

    def _txns(self, segments: Sequence[SegmentFiles], offsets: PartitionOffsets) -> PartitionTxns:
        """The transaction knowledge of what this reader serves, up to the visible end."""
        res = self.res
        end = offsets.visible_end_offset if offsets.visible_end_offset is not None else 0
        sources = reader_sources(
            str(self.part.path),
            self._sets(),
            segments,
            end,
            offsets.local_log_start_offset,
            res.backend,
            res.protection,
        )
        return PartitionTxns(sources, res.backend, res.protection, log_start=offsets.log_start_offset)

    def _not_found(self, ranges: PartitionOffsets, reason: str) -> LookupResult:
        return LookupResult(self.part.topic, self.part.partition, False, ranges, reason=reason)

    # -- offset -------------------------------------------------------------------------------

    def lookup_offset(
        self,
        offset: int,
        *,
        tier: Tier | None = None,
        source: EntrySource | None = None,
        timestamp: bool = True,
    ) -> LookupResult:
        """The first visible record with offset ≥ ``offset``; ``tier`` forces one tier.

        Only offsets in ``[log start, visible end)`` are answered (docs/visibility.md).
        ``source``: where remote entry bytes come from (a fetch passes its own, docs/read-path.md).
        ``timestamp=False`` (a fetch): the record's timestamp may be left None, so that a batch
        whose offsets have no gaps is not decoded just to name its first offset.
        """
        if offset < 0:
            raise InvalidArgumentError(f"offset {offset} is negative", field="offset")
        vis = self.visibility(at=offset)
        return self._lookup(vis, vis.segments, offset, tier, source, timestamp)

    def _lookup(
        self,
        vis: Visibility,
        segments: Sequence[SegmentFiles],
        offset: int,
        tier: Tier | None = None,
        source: EntrySource | None = None,
        timestamp: bool = True,
    ) -> LookupResult:
        """:meth:`lookup_offset` at the moment of ``vis`` (``segments``: its listing)."""
        ranges = vis.offsets
        if not ranges.visible(offset):
            return self._not_found(ranges, invisible_reason(offset, ranges))
        gap = gap_at(self.progress.gaps, offset)
        if gap is not None:  # never "the next offset after it": the loss is named (docs/visibility.md)
            return LookupResult(
                self.part.topic, self.part.partition, False, ranges, reason=gap.describe(), gap=gap
            )
        in_local, in_remote = _tiers_holding(offset, ranges)
        remote_first = self.remote_first and in_remote and tier is None
        found: LookupResult | None = None
        if in_local and tier != "remote" and not remote_first:
            found = self._local_offset(segments, offset, ranges, timestamp)
        if found is None and in_remote and tier != "local":
            found = self._remote_offset(offset, ranges, source or EntrySource(self.res), timestamp)
        if found is None and remote_first and in_local:  # the remote tier could not answer
            found = self._local_offset(segments, offset, ranges, timestamp)
        if found is None:
            return self._not_found(ranges, f"offset {offset} is out of range")
        return self._visible_only(found, f"no record below the high watermark at or after {offset}")

    def _visible_only(self, found: LookupResult, reason: str) -> LookupResult:
        """``found`` unless its record is at or above the visible end (then not found)."""
        if found.found and found.offset is not None and not found.ranges.visible(found.offset):
            return self._not_found(found.ranges, reason)
        return found

    def _offset_only(self, ranges: PartitionOffsets, offset: int, tier: Tier | None) -> LookupResult:
        """A ListOffsets answer naming an offset without a record (timestamp -1), as Kafka's
        latest / earliest answers on an empty visible range."""
        return LookupResult(self.part.topic, self.part.partition, True, ranges, tier, offset, -1)

    def _found(self, ranges: PartitionOffsets, hit: Located) -> LookupResult:
        return LookupResult(
            self.part.topic,
            self.part.partition,
            True,
            ranges,
            hit.tier,
            hit.offset,
            hit.timestamp,
            hit.batch,
            hit.location,
        )

    def _local_offset(
        self, segments: Sequence[SegmentFiles], offset: int, ranges: PartitionOffsets, timestamp: bool = True
    ) -> LookupResult | None:
        may_wait("a segment's records on disk")  # its index and batches, then a fetch's bytes
        hit = local_offset(segments, offset, timestamp)
        return None if hit is None else self._found(ranges, hit)

    def _entry_batches(self, entry: DecodedEntry) -> tuple[RangeBytes, list[RecordBatch]]:
        """One entry's bytes and CRC-checked batches, for timestamp lookups (cached)."""
        return EntrySource(self.res).batches(entry)

    def _remote_offset(
        self, offset: int, ranges: PartitionOffsets, source: EntrySource, timestamp: bool = True
    ) -> LookupResult | None:
        source.views = source.views or self._sets()
        start = ranges.remote_log_start_offset or 0
        hit = remote_offset(source.views, offset, start, source, timestamp)
        return None if hit is None else self._found(ranges, hit)

    # -- timestamp ----------------------------------------------------------------------------

    def lookup_timestamp(self, timestamp: int, *, seen: Visibility | None = None) -> LookupResult:
        """Kafka ListOffsets semantics, incl. the special values −1…−5, over visible records only
        (docs/visibility.md): −1 is the visible end (the high watermark), −2 the log start.
        ``seen``: the moment the caller already asked about (its listing is reused)."""
        if timestamp < LATEST_TIERED:
            raise InvalidArgumentError(
                f"timestamp {timestamp} is invalid: use ms since the epoch or "
                "-1 latest, -2 earliest, -3 max, -4 earliest local, -5 latest tiered",
                field="timestamp",
            )
        vis = seen or self.visibility()
        segments, ranges, end = vis.segments, vis.offsets, vis.offsets.visible_end_offset
        if timestamp in SPECIAL_TIMESTAMPS and timestamp != MAX_TIMESTAMP:
            return self._special(timestamp, vis)
        if timestamp == MAX_TIMESTAMP:
            max_ts = self._max_timestamp(segments, ranges)
            if max_ts is None:
                return self._not_found(ranges, "the partition has no visible records")
            timestamp = max_ts
        found = self._remote_timestamp(timestamp, ranges) or self._local_timestamp(
            segments, timestamp, ranges
        )
        if found is None or end is None:
            return self._not_found(ranges, f"no record has a timestamp >= {timestamp}")
        return self._visible_only(
            found, f"no record below the high watermark {end} has a timestamp >= {timestamp}"
        )

    def _special(self, timestamp: int, vis: Visibility) -> LookupResult:
        """−1, −2, −4, −5: the authority's offset (docs/visibility.md "ListOffsets specs"), with
        the record there when there is one."""
        ranges = vis.offsets
        if vis.empty:
            return self._not_found(ranges, "the partition is empty in both tiers")
        offset = vis.special_offset(timestamp)
        if timestamp == LATEST:
            return self._offset_only(ranges, offset, "local")
        if offset < 0:
            return self._not_found(ranges, "nothing visible is tiered")
        tier: Tier | None = (
            "local" if timestamp == EARLIEST_LOCAL else "remote" if timestamp == LATEST_TIERED else None
        )
        return self._or_offset(self._lookup(vis, vis.segments, offset, tier), ranges, offset, tier)

    def _or_offset(
        self, found: LookupResult, ranges: PartitionOffsets, offset: int, tier: Tier | None
    ) -> LookupResult:
        return found if found.found else self._offset_only(ranges, offset, tier)

    def _remote_timestamp(self, ts: int, ranges: PartitionOffsets) -> LookupResult | None:
        if ranges.remote_log_start_offset is None:
            return None
        hit = remote_timestamp(self._sets(), ts, ranges.remote_log_start_offset, self._entry_batches)
        return None if hit is None else self._found(ranges, hit)

    def _local_timestamp(
        self, segments: Sequence[SegmentFiles], ts: int, ranges: PartitionOffsets
    ) -> LookupResult | None:
        hit = local_timestamp(segments, ts, ranges.local_log_start_offset)
        return None if hit is None else self._found(ranges, hit)

    def _max_timestamp(self, segments: Sequence[SegmentFiles], ranges: PartitionOffsets) -> int | None:
        """The max record timestamp among the visible offsets ``[log start, visible end)``."""
        start, end = ranges.log_start_offset, ranges.visible_end_offset
        if start is None or end is None or start >= end:
            return None
        found = [
            remote_max_timestamp(self._sets(), ranges.remote_log_start_offset, end, self._entry_batches)
            if ranges.remote_log_start_offset is not None
            else None
        ]
        if ranges.local_log_start_offset is not None:
            found.append(local_max_timestamp(segments, ranges.local_log_start_offset, end))
        return max((ts for ts in found if ts is not None), default=None)

    # -- fetch --------------------------------------------------------------------------------

    def fetch(
        self, offset: int, max_bytes: int, *, verify: bool = False, reader_key: Hashable | None = None
    ) -> FetchResult:
        """Whole batches from the one holding ``offset`` while they fit ``max_bytes`` (≥ 1 batch),
        each with its last offset below the visible end (docs/visibility.md).

        ``offset`` = the visible end (or a visible offset with no whole visible batch at or after
        it) → no batches; below the log start or above the visible end →
        :class:`OffsetOutOfRangeError`; inside a recorded gap → :class:`OffsetInGapError`.
        ``verify``: CRC-check remote batches again (they were
        checked before upload; local ones always are). ``reader_key``: who reads (opaque; e.g. a
        client's connection): its sequential fetches are read ahead (docs/read-path.md).
        """
        if max_bytes <= 0:
            raise InvalidArgumentError(f"max_bytes {max_bytes} must be positive", field="max_bytes")
        rid = None if reader_key is None else (reader_key, self.part.topic, self.part.partition)
        source = EntrySource(self.res, rid, verify=verify)
        source.begin(offset)
        if offset < 0:
            raise InvalidArgumentError(f"offset {offset} is negative", field="offset")
        vis = self.visibility(at=offset)
        found = self._lookup(vis, vis.segments, offset, source=source, timestamp=False)
        ranges, end = vis.offsets, vis.offsets.visible_end_offset
        _refuse_gap(found, offset)
        if not found.found or found.batch is None:
            held = ranges.visible(offset) and any(_tiers_holding(offset, ranges))
            if end is not None and (offset == end or held):
                return self._empty(offset, vis)
            raise OffsetOutOfRangeError(f"offset {offset} is out of range: {ranges.to_json()}", offset=offset)
        assert end is not None
        if found.tier == "local":
            assert isinstance(found.location, LocalLocation)
            data: FetchBytes
            data, batches = local_fetch(found.location.file, found.batch.position, end, max_bytes)
            at: int | None = offset
        else:
            data, batches = remote_fetch(
                source.views or self._sets(), source, found.batch.base_offset, max_bytes, end
            )
            at = found.offset
        if not batches:
            return self._empty(offset if found.tier == "local" else found.batch.base_offset, vis)
        start = ranges.log_start_offset
        assert found.tier is not None
        return FetchResult(
            self.part.topic, self.part.partition, found.tier, data, batches, end, at, start, visibility=vis
        )

    def _empty(self, offset: int, vis: Visibility) -> FetchResult:
        ranges = vis.offsets
        local = ranges.local_log_start_offset
        tier: Tier = "remote" if local is None or offset < local else "local"
        end, start = ranges.visible_end_offset, ranges.log_start_offset
        return FetchResult(
            self.part.topic, self.part.partition, tier, b"", [], end, offset, start, visibility=vis
        )


def _refuse_gap(found: LookupResult, offset: int) -> None:
    """A fetch inside a recorded gap: :class:`OffsetInGapError` naming it (docs/visibility.md, "Gaps")."""
    if found.gap is not None:
        raise OffsetInGapError(
            f"offset {offset}: {found.gap.describe()}",
            offset=offset,
            first_offset=found.gap.first_offset,
            last_offset=found.gap.last_offset,
        )


def _tiers_holding(offset: int, ranges: PartitionOffsets) -> tuple[bool, bool]:
    """Whether the local and the remote tier hold ``offset`` (neither: a gap, out of range)."""
    local = (
        ranges.local_log_start_offset is not None
        and ranges.log_end_offset is not None
        and ranges.local_log_start_offset <= offset < ranges.log_end_offset
    )
    remote = (
        ranges.remote_log_start_offset is not None
        and ranges.remote_log_start_offset <= offset <= ranges.highest_tiered_offset
    )
    return local, remote


__all__ = [
    "PartitionOffsets",
    "PartitionReader",
    "ReaderResources",
    "partition_offsets",
]
