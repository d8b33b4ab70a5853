"""Where a lookup found its record (:class:`Located`, with a typed :class:`LocalLocation` or
:class:`RemoteLocation`), as the local and the remote tier report it to
:class:`rlm.tiering.read.lookup.PartitionReader`, and the header-only shortcut both use
(:func:`first_offset_at_least`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rlm.formats.records import RecordBatch

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


__all__ = ["LocalLocation", "Located", "Location", "RemoteLocation", "Tier", "first_offset_at_least"]
