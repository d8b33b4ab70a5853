"""The per-segment manifest: written last, with "create only if absent" — the commit point.

A segment exists for readers iff its manifest exists. The manifest names the attempt whose data
objects are authoritative and carries what lookups, retention and verification need without
touching the data: offsets, timestamps, sizes, checksums, leader epochs. JSON, UTF-8, one object;
unknown fields are preserved on read (forward compatibility), an unknown ``format_version`` is an
error rather than a guess.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from rlm.errors import FormatError

FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class StoredObject:
    """One uploaded object of an attempt: its key, size in bytes and CRC-32C of its bytes."""

    key: str
    size: int
    crc32c: int


@dataclass(frozen=True, slots=True)
class SegmentManifest:
    """What one copied segment is (offsets inclusive; timestamps in ms since the epoch).

    ``size_bytes`` is the segment's valid bytes (the uploaded ``.log``); ``first_timestamp`` is the
    first batch's base timestamp (-1 for magic 0/1), ``max_timestamp`` the largest batch max
    timestamp; ``leader_epochs`` are the ``(epoch, start_offset)`` entries of the partition's
    leader-epoch cache that apply to the segment's offsets.
    """

    topic: str
    partition: int
    base_offset: int
    last_offset: int
    first_timestamp: int
    max_timestamp: int
    size_bytes: int
    record_batches: int
    index_entries: int
    attempt_id: str
    created_ms: int
    objects: dict[str, StoredObject]
    leader_epochs: tuple[tuple[int, int], ...] = ()
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def log(self) -> StoredObject:
        return self.objects["log"]

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    def same_segment_as(self, other: SegmentManifest) -> bool:
        """True when both describe the same bytes (a retry/adoption check, attempt ignored)."""
        return (
            (self.topic, self.partition, self.base_offset, self.last_offset, self.size_bytes)
            == (other.topic, other.partition, other.base_offset, other.last_offset, other.size_bytes)
            and self.log.crc32c == other.log.crc32c
        )

    def to_json(self) -> bytes:
        doc = asdict(self)
        doc.pop("extra")
        doc["leader_epochs"] = [list(e) for e in self.leader_epochs]
        doc.update(self.extra)
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes, *, key: str = "<manifest>") -> SegmentManifest:
        try:
            doc = json.loads(data)
            version = doc.get("format_version")
            if version != FORMAT_VERSION:
                raise FormatError(f"{key}: manifest format_version {version!r} is not supported "
                                  f"(this rlm reads {FORMAT_VERSION})")
            known = {f for f in cls.__dataclass_fields__ if f != "extra"}
            values = {k: doc[k] for k in known if k in doc}
            values["objects"] = {name: StoredObject(**o) for name, o in doc["objects"].items()}
            values["leader_epochs"] = tuple((int(e), int(o)) for e, o in doc.get("leader_epochs", []))
            extra = {k: v for k, v in doc.items() if k not in known}
            return cls(**values, extra=extra)
        except FormatError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise FormatError(f"{key}: malformed manifest: {err}") from err
