"""File and directory names of a Kafka log directory (docs/formats.md §2.1, §5).

A segment file is ``<base offset, decimal, zero-padded to 20 digits><suffix>``; a partition
directory is ``<topic>-<partition>`` where the topic itself may contain ``-``, so the partition
number is the text after the **last** ``-``. Pure string functions, no file system access.
"""

from __future__ import annotations

import re

from rlm.errors import InvalidArgumentError, LogDirError

__all__ = [
    "CLEANED",
    "DELETED",
    "INDEX",
    "INTERNAL_TOPICS",
    "LOG",
    "REMOTE_LOG_INDEX",
    "REMOTE_OFFSET_INDEX",
    "REMOTE_TIME_INDEX",
    "SNAPSHOT",
    "SWAP",
    "TIME_INDEX",
    "TRANSIENT_SUFFIXES",
    "TXN_INDEX",
    "is_internal_topic",
    "is_served_topic",
    "is_transient",
    "parse_base_offset",
    "parse_partition_dir",
    "segment_file_name",
    "validate_topic",
]

LOG = ".log"
INDEX = ".index"
TIME_INDEX = ".timeindex"
TXN_INDEX = ".txnindex"
SNAPSHOT = ".snapshot"
REMOTE_LOG_INDEX = ".remotelogindex"
REMOTE_OFFSET_INDEX = ".remoteoffsetindex"
REMOTE_TIME_INDEX = ".remotetimeindex"

# Suffixes the log store appends while it deletes, compacts or swaps a file: such a file may
# vanish at any moment and is never the authoritative copy, so rlm never copies it.
DELETED = ".deleted"
CLEANED = ".cleaned"
SWAP = ".swap"
TRANSIENT_SUFFIXES: tuple[str, ...] = (DELETED, CLEANED, SWAP)

_OFFSET_DIGITS = 20
_INT64_MAX = 2**63 - 1
_MAX_TOPIC_LENGTH = 249
_TOPIC_RE = re.compile(r"[a-zA-Z0-9._-]+")
_DIGITS_RE = re.compile(r"[0-9]+")


def segment_file_name(base_offset: int, suffix: str) -> str:
    """``segment_file_name(81908, ".log") == "00000000000000081908.log"``.

    ``base_offset`` must be in [0, 2**63 - 1]; else :class:`InvalidArgumentError`.
    """
    if not 0 <= base_offset <= _INT64_MAX:
        raise InvalidArgumentError(f"base offset {base_offset} is outside [0, 2^63-1]")
    return f"{base_offset:0{_OFFSET_DIGITS}d}{suffix}"


def parse_base_offset(name: str) -> int:
    """The base offset encoded in a segment / index file name: the decimal text before the first ``.``.

    Raises :class:`LogDirError` when that text is not a non-negative int64 (e.g. KRaft snapshot
    names ``<offset>-<epoch>.checkpoint`` are not segment files).
    """
    head = name.split(".", 1)[0]
    if not _DIGITS_RE.fullmatch(head) or int(head) > _INT64_MAX:
        raise LogDirError(f"file name {name!r} does not start with a decimal base offset")
    return int(head)


def validate_topic(topic: str) -> str:
    """Return ``topic`` if it is a legal Kafka topic name, else raise :class:`LogDirError`.

    Kafka's rules: 1..249 characters from ``[a-zA-Z0-9._-]``, and not ``.`` or ``..``.
    """
    if not topic or len(topic) > _MAX_TOPIC_LENGTH:
        raise LogDirError(f"topic name {topic!r} must have 1..{_MAX_TOPIC_LENGTH} characters")
    if topic in (".", ".."):
        raise LogDirError(f"topic name {topic!r} is not allowed")
    if not _TOPIC_RE.fullmatch(topic):
        raise LogDirError(f"topic name {topic!r} has characters outside [a-zA-Z0-9._-]")
    return topic


def parse_partition_dir(name: str) -> tuple[str, int]:
    """``"oms_order_created-1" -> ("oms_order_created", 1)``; the partition follows the last ``-``.

    Raises :class:`LogDirError` for a missing / non-decimal partition or an illegal topic name,
    which is also how Kafka's ``-delete`` / ``-future`` / ``-stray`` directories are rejected.
    """
    topic, sep, partition = name.rpartition("-")
    if not sep or not _DIGITS_RE.fullmatch(partition) or int(partition) > 2**31 - 1:
        raise LogDirError(f"directory name {name!r} is not <topic>-<partition>")
    return validate_topic(topic), int(partition)


#: Kafka's internal logs. The broker never tiers them (they are compacted state, or the KRaft quorum's
#: own log, not a topic), so neither does rlm. ``__remote_log_metadata`` is the topic-based remote
#: log metadata manager's own topic. rlm/tiering/expire/policy.py decides (docs/topic-policy.md).
INTERNAL_TOPICS = frozenset(
    {
        "__consumer_offsets",
        "__transaction_state",
        "__share_group_state",
        "__remote_log_metadata",
        "__cluster_metadata",
    }
)


def is_internal_topic(topic: str) -> bool:
    """True for Kafka's internal logs (:data:`INTERNAL_TOPICS`), which are never tiered."""
    return topic in INTERNAL_TOPICS


#: The KRaft quorum's own log: in a log dir, but no topic (its records hold SCRAM salts and keys).
METADATA_TOPIC = "__cluster_metadata"


def is_served_topic(topic: str, *, internal: bool = False) -> bool:
    """Whether any surface serves ``topic`` to clients — its records, offsets, lookups or listing
    (HTTP API, Kafka listener, CLI reads, exports): never the KRaft metadata log; Kafka's other
    internal logs only when ``internal`` (``[server] serve_internal_topics``). The one rule
    (docs/visibility.md, "Internal topics"); what rlm *tiers* is the topic policy's (docs/topic-policy.md)."""
    if topic == METADATA_TOPIC:
        return False
    return internal or topic not in INTERNAL_TOPICS


def is_transient(name: str) -> bool:
    """True for names the store is deleting, cleaning or swapping (``.deleted``/``.cleaned``/``.swap``)."""
    return name.endswith(TRANSIENT_SUFFIXES)
