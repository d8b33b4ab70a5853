"""Where a lookup found its record (:class:`Located`), as the local and the remote tier report it
to :class:`rlm.tiering.lookup.PartitionReader`, and the header-only shortcut both use
(:func:`first_offset_at_least`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from rlm.formats.records import RecordBatch

Tier = Literal["local", "remote"]


@dataclass(frozen=True, slots=True)
class Located:
    """The first record at or after what was asked, in one tier: its offset, its timestamp (ms;
    None when a fetch did not need it, see :func:`first_offset_at_least`), the batch holding it,
    and where that batch is — ``{"file", "position"}`` (byte position in the ``.log``) locally,
    ``{"rdi", "data_length"}`` (the index entry's object and byte length) remotely."""

    tier: Tier
    offset: int
    timestamp: int | None
    batch: RecordBatch
    location: dict[str, Any]


def first_offset_at_least(batch: RecordBatch, offset: int) -> int | None:
    """The first record offset ≥ ``offset`` in ``batch`` (its last offset is ≥ ``offset``) when
    the header alone tells it: a v2 batch whose records have no offset gaps (record count =
    offset span: never compacted inside) holds every offset from its base to its last. Else None:
    the records must be decoded (compacted, empty or v0/v1 batches)."""
    dense = batch.magic >= 2 and batch.record_count == batch.last_offset - batch.base_offset + 1
    return max(offset, batch.base_offset) if dense else None


__all__ = ["Located", "Tier", "first_offset_at_least"]
