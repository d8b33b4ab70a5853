"""A per-partition write-ahead journal of copy and delete attempts (JSON Lines, fsynced).

Events: ``COPY_STARTED`` / ``COPY_FINISHED`` / ``COPY_ABORTED`` and ``DELETE_STARTED`` /
``DELETE_FINISHED``, each with the segment base offset and the attempt id; ``LOG_START_STARTED`` /
``LOG_START_FINISHED`` around raising the store's log start (``rlm delete-records``: ``base`` is the
new log start, ``attempt`` ``"log-start"``). A started attempt with
no matching end is *open*: after a crash, recovery resolves it (resume, or discard its objects).
Every append is fsynced before the step it announces begins. A torn last line (crash mid-write)
is ignored: the step it announced never started; so is any line that is not a complete event
(bad UTF-8 or JSON, a wrong type; see statefiles). The journal is compacted (rewritten atomically
with only open attempts) when it grows past :data:`COMPACT_BYTES`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast, get_args

from rlm.fsutil import atomic_write, fsync_dir
from rlm.tiering.local.statefiles import int_field, loads_or_none

__all__ = ["COMPACT_BYTES", "MAX_OPEN", "TAIL_BYTES", "EventType", "Journal", "JournalEvent"]

EventType = Literal[
    "COPY_STARTED",
    "COPY_FINISHED",
    "COPY_ABORTED",
    "DELETE_STARTED",
    "DELETE_FINISHED",
    "LOG_START_STARTED",
    "LOG_START_FINISHED",
]
_TYPES = frozenset(get_args(EventType))
_ENDS = {
    "COPY_STARTED": ("COPY_FINISHED", "COPY_ABORTED"),
    "DELETE_STARTED": ("DELETE_FINISHED",),
    "LOG_START_STARTED": ("LOG_START_FINISHED",),
}
_START_OF = {end: start for start, ends in _ENDS.items() for end in ends}
COMPACT_BYTES = 1 << 20
#: Attempts of one partition open at once at most: a pipelined copy's two (docs/architecture.md §3).
MAX_OPEN = 2
#: The tail :meth:`Journal.quiescent` reads (several events; one is ~100 bytes).
TAIL_BYTES = 4096


@dataclass(frozen=True, slots=True)
class JournalEvent:
    type: EventType
    base_offset: int
    attempt_id: str
    at_ms: int


def _event(doc: Any) -> JournalEvent | None:
    """The event a parsed journal line holds, or None when it is not a complete one."""
    if not isinstance(doc, dict):
        return None
    type_, attempt = doc.get("type"), doc.get("attempt")
    base, at = int_field(doc, "base"), int_field(doc, "at")
    if not isinstance(type_, str) or type_ not in _TYPES or not isinstance(attempt, str):
        return None
    if base is None or at is None:
        return None
    return JournalEvent(cast(EventType, type_), base, attempt, at)


class Journal:
    """The journal file of one partition; not thread-safe (one writer per partition: a pass's
    own thread, also for the pipelined copy whose upload runs on another)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def events(self) -> list[JournalEvent]:
        try:
            lines = self.path.read_bytes().splitlines()
        except FileNotFoundError:
            return []
        events = []
        for line in lines:
            event = _event(loads_or_none(line))
            if event is not None:  # else a torn line: its step never began
                events.append(event)
        return events

    def open_attempts(self) -> list[JournalEvent]:
        """Started events without an end, oldest first."""
        open_: dict[tuple[str, int, str], JournalEvent] = {}
        for ev in self.events():
            if ev.type in _ENDS:
                open_[(ev.type, ev.base_offset, ev.attempt_id)] = ev
            else:
                for start, ends in _ENDS.items():
                    if ev.type in ends:
                        open_.pop((start, ev.base_offset, ev.attempt_id), None)
        return list(open_.values())

    def quiescent(self) -> bool:
        """True when no attempt is open, from the journal's tail. At most :data:`MAX_OPEN`
        attempts of a partition are open at once, and an open one is always among the last
        :data:`MAX_OPEN` started: a pass starts a copy only when every attempt but the one
        started last has ended (a pipelined copy uploads the next segment while the one before
        it commits, docs/architecture.md §3), and recovery ends every open one before a pass
        starts again. Reads the last :data:`TAIL_BYTES` (the whole journal only when the last
        :data:`MAX_OPEN` starts are not all there), so a restart's cost does not grow with the
        journal."""
        try:
            with self.path.open("rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                fh.seek(max(0, size - TAIL_BYTES))
                tail = fh.read()
        except FileNotFoundError:
            return True
        lines = tail.splitlines()
        if size > TAIL_BYTES:
            lines = lines[1:]  # the first line may be cut
        ended: set[tuple[str, int, str]] = set()
        starts = 0
        for line in reversed(lines):
            event = _event(loads_or_none(line))
            if event is None:
                continue
            if event.type not in _ENDS:
                ended.add((_START_OF[event.type], event.base_offset, event.attempt_id))
                continue
            if (event.type, event.base_offset, event.attempt_id) not in ended:
                return False
            starts += 1
            if starts == MAX_OPEN:
                return True
        return size <= TAIL_BYTES or not self.open_attempts()

    def append(self, type_: EventType, base_offset: int, attempt_id: str) -> None:
        line = (
            json.dumps(
                {"type": type_, "base": base_offset, "attempt": attempt_id, "at": int(time.time() * 1000)}
            )
            + "\n"
        )
        created = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            fsync_dir(self.path.parent)
        if self.path.stat().st_size > COMPACT_BYTES:
            self.compact()

    def compact(self) -> None:
        """Rewrite the journal keeping only open attempts (atomic: temp file + rename)."""
        keep = self.open_attempts()
        text = "".join(
            json.dumps({"type": e.type, "base": e.base_offset, "attempt": e.attempt_id, "at": e.at_ms}) + "\n"
            for e in keep
        )
        atomic_write(self.path, text.encode("utf-8"))
