"""A leader's idle note: the store's word that a partition's leader has nothing more to tier
(pure; docs/cluster.md "Idle partitions", docs/formats.md §6.9).

In cluster mode a follower learns the leader's commits only from the store. A leader whose
partition stayed idle for a whole pass interval writes ``manifests/idle-note.json``: its leader
epoch and node id, the highest offset the store's chain served when it wrote the note, and the
high watermark and log start offset of its own replica then. Anything the leader commits later
needs its log to move past that high watermark or log start (new records rolled, a DeleteRecords),
or the clock to reach a retention deadline. A follower's replica sees the same moves, so a
follower whose listing shows the note of the current leader epoch, a chain that ends where the
note says, and a high watermark and log start no further than the note's, idles too: it asks the
store nothing until its own replica, the leader or the policy changes, or retention or the
hourly re-listing is due.

The note is advisory: a follower trusts nothing it serves to it (the chain comes from the
manifests alone). A wrong or forged note can only keep a follower from listing until the next of
those events, and at most :data:`rlm.tiering.roles.RESYNC_MS`.

Layout, UTF-8 JSON object, at most :data:`~rlm.tiering.store.manifest.MAX_MANIFEST_BYTES` bytes::

    {"epoch": 7, "node_id": 2, "highest_offset": 5072, "high_watermark": 5110,
     "log_start_offset": 0, "written_ms": 1763900000000}

``epoch``: the leader epoch (KRaft) or null (a source without epochs); ``node_id``: the leader;
``highest_offset``: the chain's highest offset, -1 when it serves nothing; ``high_watermark`` and
``log_start_offset``: offsets of the leader's replica (the log dir's checkpoints); ``written_ms``:
ms since the Unix epoch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rlm.errors import FormatError

__all__ = ["IdleNote"]

_INTS = ("highest_offset", "high_watermark", "log_start_offset", "written_ms")


@dataclass(frozen=True, slots=True)
class IdleNote:
    """One partition's leader, idle (see the module docstring for the fields and units)."""

    epoch: int | None
    node_id: int
    highest_offset: int
    high_watermark: int
    log_start_offset: int
    written_ms: int

    def says_same(self, other: IdleNote | None) -> bool:
        """Whether ``other`` states the same (its time aside): no need to write this one."""
        return other is not None and _fields(self)[:-1] == _fields(other)[:-1]

    def covers(
        self, leader: int | None, epoch: int | None, highest: int, state: tuple[int | None, ...]
    ) -> bool:
        """Whether a follower of ``leader`` in ``epoch``, whose store chain ends at ``highest`` and
        whose replica's (high watermark, log start, …) are ``state``, has seen all the leader may
        commit before its replica moves: see the module docstring."""
        hw, log_start = state[0], state[1]
        return (
            leader == self.node_id
            and epoch == self.epoch
            and highest == self.highest_offset
            and hw is not None
            and hw <= self.high_watermark
            and (log_start or 0) <= self.log_start_offset
        )

    def to_json(self) -> bytes:
        doc = dict(zip(("epoch", "node_id", *_INTS), _fields(self), strict=True))
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, *, key: str) -> IdleNote:
        """Parse; FormatError names ``key`` and the field when it is malformed."""
        try:
            doc: Any = json.loads(data)
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
            values = {
                name: _int(doc, name, nullable=name == "epoch") for name in ("epoch", "node_id", *_INTS)
            }
            return cls(**values)
        except (ValueError, TypeError, RecursionError) as err:
            raise FormatError(f"{key}: malformed idle note: {err}") from None


def _fields(note: IdleNote) -> tuple[int | None, ...]:
    return (
        note.epoch,
        note.node_id,
        note.highest_offset,
        note.high_watermark,
        note.log_start_offset,
        note.written_ms,
    )


def _int(doc: dict[str, Any], name: str, *, nullable: bool) -> Any:
    value = doc.get(name)
    if value is None and nullable:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"field {name} = {value!r} must be an integer" + (" or null" if nullable else ""))
    return value
