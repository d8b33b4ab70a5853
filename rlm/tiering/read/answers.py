"""What the tiers and the reader answer: where a lookup found its record (:class:`Located`, with a
typed :class:`LocalLocation` or :class:`RemoteLocation`), as the local and the remote tier report
it, and the header-only shortcut both use (:func:`first_offset_at_least`); what a
:class:`~rlm.tiering.read.lookup.PartitionReader` answers: :class:`LookupResult` (where an offset or
timestamp lies, docs/formats.md §8) and :class:`FetchResult` (Kafka's on-disk batch bytes of a
fetch, with the visibility it applied, docs/visibility.md)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rlm.formats.records import Record, RecordBatch, decode_records
from rlm.tiering.local import Gap
from rlm.tiering.read.remote_fetch import FetchBytes
from rlm.tiering.read.visibility import PartitionOffsets, Visibility

__all__ = [
    "FetchResult",
    "LocalLocation",
    "Located",
    "Location",
    "LookupResult",
    "RemoteLocation",
    "Tier",
    "first_offset_at_least",
]

Tier = Literal["local", "remote"]


@dataclass(frozen=True, slots=True)
class LocalLocation:
    """A batch in the local tier: the segment's ``.log`` and the batch's byte position in it. A
    local fetch reads from here (typed: never read back out of the JSON answer)."""

    file: Path
    position: int

    def to_json(self) -> dict[str, Any]:
        """``{"file", "position"}``: the ``location`` of ``rlm lookup`` / the HTTP lookups."""
        return {"file": str(self.file), "position": self.position}


@dataclass(frozen=True, slots=True)
class RemoteLocation:
    """A batch in the remote tier: the remote data identifier of its index entry
    (``<object url>#<byte position>``, docs/formats.md §5) and the entry's data length in bytes."""

    rdi: str
    data_length: int

    def to_json(self) -> dict[str, Any]:
        """``{"rdi", "data_length"}``: the ``location`` of ``rlm lookup`` / the HTTP lookups."""
        return {"rdi": self.rdi, "data_length": self.data_length}


Location = LocalLocation | RemoteLocation


@dataclass(frozen=True, slots=True)
class Located:
    """The first record at or after what was asked, in one tier: its offset, its timestamp (ms;
    None when a fetch did not need it, see :func:`first_offset_at_least`), the batch holding it,
    and where that batch is (:class:`LocalLocation` / :class:`RemoteLocation`)."""

    tier: Tier
    offset: int
    timestamp: int | None
    batch: RecordBatch
    location: Location


def first_offset_at_least(batch: RecordBatch, offset: int) -> int | None:
    """The first record offset ≥ ``offset`` in ``batch`` (its last offset is ≥ ``offset``) when
    the header alone tells it: a v2 batch whose records have no offset gaps (record count =
    offset span: never compacted inside) holds every offset from its base to its last. Else None:
    the records must be decoded (compacted, empty or v0/v1 batches)."""
    dense = batch.magic >= 2 and batch.record_count == batch.last_offset - batch.base_offset + 1
    return max(offset, batch.base_offset) if dense else None


@dataclass(frozen=True, slots=True)
class LookupResult:
    """One answer; :meth:`to_json` is the ``rlm lookup`` / HTTP contract (docs/cli.md, docs/http-api.md)."""

    topic: str
    partition: int
    found: bool
    ranges: PartitionOffsets
    tier: Tier | None = None
    offset: int | None = None
    timestamp: int | None = None
    batch: RecordBatch | None = None
    location: Location | None = None
    reason: str | None = None
    gap: Gap | None = None  # not found: the recorded gap holding the offset (docs/visibility.md)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"topic": self.topic, "partition": self.partition, "found": self.found}
        if not self.found:
            doc["reason"] = self.reason
            doc["valid_ranges"] = self.ranges.to_json()
            if self.gap is not None:
                doc["gap"] = self.gap.to_json()
            return doc
        doc.update(
            {
                "tier": self.tier,
                "offset": self.offset,
                "timestamp": self.timestamp,
                "batch": (
                    None
                    if self.batch is None
                    else {"base_offset": self.batch.base_offset, "last_offset": self.batch.last_offset}
                ),
                "location": None if self.location is None else self.location.to_json(),
            }
        )
        return doc


@dataclass(frozen=True, slots=True)
class FetchResult:
    """Raw record batches (Kafka's on-disk bytes) starting at the batch holding the offset."""

    topic: str
    partition: int
    tier: Tier
    data: FetchBytes  # remote: a zero-copy memoryview when the answer lies in one index entry
    batches: list[RecordBatch]
    high_watermark: int | None  # the visible end applied (docs/visibility.md)
    requested_offset: int | None = None
    log_start_offset: int | None = None  # decoded views drop the boundary batch's records below it
    # read_committed (rlm.tiering.read.isolation, docs/transactions.md): the LSO applied, the aborted
    # transactions of the range, where to resume (after skipped batches too), segments scanned.
    isolation: str = "read_uncommitted"
    last_stable_offset: int | None = None
    aborted_transactions: tuple[Any, ...] = ()
    resume_offset: int | None = None
    txn_scanned: tuple[str, ...] = ()
    #: What the fetch saw (its visible end came from it): a read_committed answer asks it for the
    #: last stable offset and the aborted transactions of the same moment.
    visibility: Visibility | None = field(default=None, compare=False, repr=False)

    @property
    def seen(self) -> Visibility:
        """:attr:`visibility`: every :meth:`PartitionReader.fetch` answer carries it (a result built
        by hand, as a bench does, has none and must not be asked)."""
        assert self.visibility is not None, "a reader's fetch carries what it saw"
        return self.visibility

    @property
    def next_offset(self) -> int | None:
        """Where the next fetch starts: after the last batch; the requested offset when empty."""
        if self.resume_offset is not None:
            return self.resume_offset
        return self.batches[-1].last_offset + 1 if self.batches else self.requested_offset

    def records(self, batch: RecordBatch, *, from_requested: bool = False) -> Iterator[Record]:
        """The decoded records of one fetched batch a reader may see: never below the log start
        (a raw fetch returns the boundary batch whole, as Kafka does; docs/visibility.md), and with
        ``from_requested`` none below the requested offset either."""
        floor = self.log_start_offset or 0
        if from_requested and self.requested_offset is not None:
            floor = max(floor, self.requested_offset)
        return (r for r in decode_records(self.data, batch) if r.offset >= floor)
