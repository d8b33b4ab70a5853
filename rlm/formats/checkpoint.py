"""Kafka's checkpoint text files (docs/formats.md §2.2, §2.3).

Offset checkpoints (``replication-offset-checkpoint``, ``recovery-point-offset-checkpoint``,
``log-start-offset-checkpoint``, ``cleaner-offset-checkpoint``)::

    0                      version (only 0 exists)
    N                      number of entries
    <topic> <partition> <offset>      N lines, fields separated by whitespace

``leader-epoch-checkpoint`` (one per partition directory): same framing, entry lines are
``<epoch> <startOffset>``. Lines end with ``\\n``. As Kafka's CheckpointFile reader: an empty file
holds no entries; an unknown version, a missing / wrong count, a malformed line or extra lines
are errors (:class:`CheckpointError`, reason naming the 1-based line, ``position`` = byte position
of that line). Pure: text in, dataclasses out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from rlm.errors import CheckpointError, InvalidArgumentError

__all__ = [
    "CHECKPOINT_VERSION",
    "EpochEntry",
    "LeaderEpochCheckpoint",
    "OffsetCheckpoint",
    "format_leader_epoch_checkpoint",
    "format_offset_checkpoint",
    "parse_leader_epoch_checkpoint",
    "parse_offset_checkpoint",
]

CHECKPOINT_VERSION = 0

_INT_RE = re.compile(r"-?[0-9]+")
_WHITESPACE = re.compile(r"\s+")
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class OffsetCheckpoint:
    """An offset checkpoint: ``entries[(topic, partition)] = offset``."""

    version: int
    entries: dict[tuple[str, int], int]


@dataclass(frozen=True, slots=True)
class EpochEntry:
    """A leader epoch and the first offset written in it."""

    epoch: int
    start_offset: int


@dataclass(frozen=True, slots=True)
class LeaderEpochCheckpoint:
    """A ``leader-epoch-checkpoint``: entries in file order (Kafka writes epochs ascending)."""

    version: int
    entries: list[EpochEntry]


def _line_starts(lines: list[str]) -> list[int]:
    starts, pos = [], 0
    for line in lines:
        starts.append(pos)
        pos += len(line.encode()) + 1
    return starts


def _parse_int(token: str, bounds: tuple[int, int]) -> int | None:
    # Strict decimal (Python's int() would also take "+1", "1_0" and non-ASCII digits). No int64
    # has more than 20 characters; longer tokens are refused before int(), which raises a
    # ValueError of its own past 4300 digits (and is quadratic below that).
    if len(token) > 20 or not _INT_RE.fullmatch(token):
        return None
    value = int(token)
    return value if bounds[0] <= value <= bounds[1] else None


def _parse(
    text: str | bytes, fields: int, make: Callable[[list[str]], T | None], what: str
) -> tuple[int, list[T]]:
    if isinstance(text, bytes):
        try:
            text = text.decode()
        except UnicodeDecodeError as exc:
            raise CheckpointError(f"{what} is not UTF-8: {exc.reason}", position=exc.start) from None
    if text == "":
        return CHECKPOINT_VERSION, []  # Kafka reads an empty file as no entries
    # Kafka's readLine: "\n", "\r\n" or "\r" end a line; the final terminator does not add a line.
    lines = text.splitlines()
    starts = _line_starts(lines)

    def fail(n: int, reason: str) -> CheckpointError:
        return CheckpointError(
            f"{what}: line {n + 1}: {reason}", position=starts[n] if n < len(starts) else None
        )

    version = _parse_int(lines[0].strip(), _INT32)
    if version is None:
        raise fail(0, f"version {lines[0]!r} is not an integer")
    if version != CHECKPOINT_VERSION:
        raise fail(0, f"unsupported checkpoint version {version} (expected {CHECKPOINT_VERSION})")
    if len(lines) < 2:
        raise CheckpointError(f"{what}: line 2: missing entry count", position=len(text.encode()))
    count = _parse_int(lines[1].strip(), _INT32)
    if count is None or count < 0:
        raise fail(1, f"entry count {lines[1]!r} is not a non-negative integer")
    body = lines[2:]
    if len(body) < count:
        raise CheckpointError(
            f"{what}: line {len(lines) + 1}: expected {count} entries but found only {len(body)}",
            position=len(text.encode()),
        )
    if len(body) > count:
        raise fail(2 + count, f"expected {count} entries but found more")
    entries: list[T] = []
    for n, line in enumerate(body, start=2):
        tokens = _WHITESPACE.split(line)
        entry = make(tokens) if len(tokens) == fields else None
        if entry is None:
            raise fail(n, f"malformed entry {line!r}")
        entries.append(entry)
    return version, entries


def _offset_entry(tokens: list[str]) -> tuple[tuple[str, int], int] | None:
    partition, offset = _parse_int(tokens[1], _INT32), _parse_int(tokens[2], _INT64)
    if not tokens[0] or partition is None or offset is None:
        return None
    return (tokens[0], partition), offset


def _epoch_entry(tokens: list[str]) -> EpochEntry | None:
    epoch, offset = _parse_int(tokens[0], _INT32), _parse_int(tokens[1], _INT64)
    if epoch is None or offset is None:
        return None
    return EpochEntry(epoch, offset)


def parse_offset_checkpoint(text: str | bytes) -> OffsetCheckpoint:
    """Parse an offset checkpoint; a (topic, partition) listed twice keeps its last offset, as Kafka."""
    version, pairs = _parse(text, 3, _offset_entry, "offset checkpoint")
    return OffsetCheckpoint(version, dict(pairs))


def parse_leader_epoch_checkpoint(text: str | bytes) -> LeaderEpochCheckpoint:
    """Parse a ``leader-epoch-checkpoint``."""
    version, entries = _parse(text, 2, _epoch_entry, "leader epoch checkpoint")
    return LeaderEpochCheckpoint(version, entries)


def _format(lines: list[str]) -> str:
    return "".join(f"{line}\n" for line in [str(CHECKPOINT_VERSION), str(len(lines)), *lines])


def format_offset_checkpoint(entries: Mapping[tuple[str, int], int]) -> str:
    """Kafka's text for an offset checkpoint, entries in mapping order. Topics must be non-empty and
    free of whitespace (:class:`InvalidArgumentError`)."""
    lines = []
    for (topic, partition), offset in entries.items():
        if not topic or _WHITESPACE.search(topic):
            raise InvalidArgumentError(f"topic {topic!r} cannot be written to a checkpoint")
        lines.append(f"{topic} {partition} {offset}")
    return _format(lines)


def format_leader_epoch_checkpoint(entries: Iterable[EpochEntry]) -> str:
    """Kafka's text for a ``leader-epoch-checkpoint``, entries in the given order."""
    return _format([f"{e.epoch} {e.start_offset}" for e in entries])
