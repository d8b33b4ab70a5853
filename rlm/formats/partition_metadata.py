"""Kafka's ``partition.metadata`` file: the topic id of a partition directory (KIP-516).

Every broker since 2.8 writes it into each partition directory it creates::

    version: 0
    topic_id: <22-character base64url topic UUID, no padding>

(lines end with ``\\n``; brokers write no newline after the last line). A topic deleted and
created again under the same name gets a new id: the id, not the name, tells two incarnations of
a partition apart — see docs/topic-identity.md.

Parsing follows Kafka's ``PartitionMetadataReadBuffer``: line 1 ``version: <int>`` with version 0,
line 2 ``topic_id: <uuid>``; the zero UUID is refused (Kafka reserves it for "no id"). rlm is
stricter in two harmless ways: the field names must be ``version`` / ``topic_id``, and the id must
be in its canonical 22-character form (one id has exactly one spelling, so it can be part of a
remote key). Anything else raises :class:`PartitionMetadataError` naming the field and the byte
position of its line. Pure: bytes in, a dataclass out; never another exception.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass

from rlm.errors import PartitionMetadataError

__all__ = [
    "PARTITION_METADATA_VERSION",
    "PartitionMetadata",
    "format_partition_metadata",
    "parse_partition_metadata",
    "validate_topic_id",
]

PARTITION_METADATA_VERSION = 0
#: A partition.metadata file is two short lines; anything longer is not one (bounds the parse).
MAX_FILE_BYTES = 4096

_TOPIC_ID_RE = re.compile(r"[A-Za-z0-9_-]{22}")
_LINE_RE = re.compile(r"([a-z_]+):\s+(\S+)\s*")
_ZERO_UUID = bytes(16)


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    """``topic_id`` is the canonical 22-character base64url form of the topic's 16-byte UUID."""

    version: int
    topic_id: str


def validate_topic_id(text: str) -> str:
    """Return ``text`` if it is a canonical, non-zero base64url topic id, else raise
    :class:`PartitionMetadataError` (22 characters of ``[A-Za-z0-9_-]`` decoding to 16 bytes)."""
    if not _TOPIC_ID_RE.fullmatch(text):
        raise PartitionMetadataError(f"topic id {text[:40]!r} is not 22 base64url characters")
    raw = base64.urlsafe_b64decode(text + "==")
    if base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=") != text:
        raise PartitionMetadataError(f"topic id {text!r} is not in canonical base64url form")
    if raw == _ZERO_UUID:
        raise PartitionMetadataError("topic id is the zero UUID, which Kafka reserves for 'no id'")
    return text


def _field(lines: list[tuple[int, str]], index: int, name: str) -> tuple[int, str]:
    """(byte position of the line, the value) of line ``index``, which must be ``<name>: <value>``."""
    if index >= len(lines):
        raise PartitionMetadataError(f"field {name!r}: missing (the file has {len(lines)} lines)")
    position, line = lines[index]
    match = _LINE_RE.fullmatch(line)
    if match is None or match.group(1) != name:
        raise PartitionMetadataError(
            f"field {name!r}: expected '{name}: <value>', found {line[:60]!r}", position=position
        )
    return position, match.group(2)


def parse_partition_metadata(data: bytes) -> PartitionMetadata:
    """Parse a ``partition.metadata`` file's bytes (see the module doc)."""
    if len(data) > MAX_FILE_BYTES:
        raise PartitionMetadataError(
            f"{len(data)} bytes is too long for a partition.metadata file (at most {MAX_FILE_BYTES})"
        )
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError as err:
        raise PartitionMetadataError("not ASCII text", position=err.start) from None
    lines: list[tuple[int, str]] = []
    position = 0
    for line in text.split("\n"):
        if line.strip():
            lines.append((position, line))
        position += len(line) + 1
    at, version_text = _field(lines, 0, "version")
    if not version_text.isdigit() or len(version_text) > 9:
        raise PartitionMetadataError(
            f"field 'version': {version_text[:20]!r} is not a version number", position=at
        )
    version = int(version_text)
    if version != PARTITION_METADATA_VERSION:
        raise PartitionMetadataError(
            f"field 'version': {version} is not supported (this rlm reads {PARTITION_METADATA_VERSION})",
            position=at,
        )
    at, topic_id = _field(lines, 1, "topic_id")
    try:
        validate_topic_id(topic_id)
    except PartitionMetadataError as err:
        raise PartitionMetadataError(f"field 'topic_id': {err.reason}", position=at) from None
    return PartitionMetadata(version, topic_id)


def format_partition_metadata(topic_id: str) -> bytes:
    """The bytes a broker writes for ``topic_id`` (validated), without a trailing newline."""
    validate_topic_id(topic_id)
    return f"version: {PARTITION_METADATA_VERSION}\ntopic_id: {topic_id}".encode("ascii")
