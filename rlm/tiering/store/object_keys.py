"""The remote key layout — the one place that says where rlm puts things in the store.

Keys are relative to the backend's root (its bucket/prefix/directory). Offsets are 20-digit
zero-padded so lexical key order is offset order (docs/formats.md §6.1). All keys of one *incarnation* of a
partition live under one root (docs/topic-identity.md)::

    <topic>-<partition>/                 name-only root: partitions without a topic id (brokers
                                         before 2.8), and an incarnation that adopted it
    <topic>-<partition>=<topic id>/      the root of the incarnation with that topic id

``=`` cannot occur in a topic name (Kafka allows ``[a-zA-Z0-9._-]``) nor in a topic id (22
base64url characters), so a root parses unambiguously (:func:`parse_root`): the text before the
first ``/`` is split at its ``=``, the name part at its last ``-``. Two incarnations never share a
root, and the name-only root ``t-0/`` is no prefix of ``t-0=<id>/``. Under a root::

    manifests/<base>.json                   commit point, one per segment
    data/<base>-<attempt>/segment.log       the segment's bytes
    data/<base>-<attempt>/segment.index     Kafka's offset index (if present)
    data/<base>-<attempt>/segment.timeindex
    data/<base>-<attempt>/leader-epoch-checkpoint
    data/<base>-<attempt>/producer.snapshot
    data/<base>-<attempt>/segment.remotelogindex   the segment's own entries
    data/<base>-<attempt>/segment.txnindex  aborted transactions (docs/transactions.md; if any)
    owner.json                              name-only root only: the topic id that adopted it
    retired.json                            the root's incarnation is gone (topic re-created)

Data keys are unique per copy *attempt*, so a retry never overwrites bytes a reader trusts; only
a manifest makes an attempt visible. An attempt id starts with its creation time (ms, hex) so GC
can judge its age without trusting store timestamps.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

__all__ = [
    "DATA",
    "IDLE_NOTE",
    "ID_SEPARATOR",
    "LEADER_EPOCHS",
    "LINEAGE_MARKER_PREFIX",
    "LOG",
    "LOG_START_MARKER_PREFIX",
    "MANIFESTS",
    "OFFSET_INDEX",
    "OWNER_MARKER",
    "PRODUCER_SNAPSHOT",
    "RETIRED_MARKER",
    "SEGMENT_ENTRIES",
    "TIME_INDEX",
    "TXN_INDEX",
    "AttemptRef",
    "Root",
    "attempt_created_ms",
    "attempt_prefix",
    "data_key",
    "data_prefix",
    "id_roots_prefix",
    "idle_note_key",
    "lineage_marker_key",
    "log_start_marker_key",
    "manifest_key",
    "manifests_prefix",
    "marker_key",
    "new_attempt_id",
    "parse_data_key",
    "parse_lineage_marker_key",
    "parse_log_start_marker_key",
    "parse_manifest_key",
    "parse_root",
    "partition_prefix",
    "root",
]

MANIFESTS = "manifests"
DATA = "data"
#: Separates the partition from the topic id in a root; illegal in topic names and topic ids.
ID_SEPARATOR = "="
#: Marker objects at a root (small JSON, written with create-only-if-absent).
OWNER_MARKER = "owner.json"
RETIRED_MARKER = "retired.json"

#: File names inside an attempt directory, by the role of the file.
LOG = "segment.log"
OFFSET_INDEX = "segment.index"
TIME_INDEX = "segment.timeindex"
LEADER_EPOCHS = "leader-epoch-checkpoint"
PRODUCER_SNAPSHOT = "producer.snapshot"
#: The segment's own ``.remotelogindex`` entries (not the ``.remotelogindex`` suffix of a local set,
#: ``naming.REMOTE_LOG_INDEX``).
SEGMENT_ENTRIES = "segment.remotelogindex"
#: Kafka's ``.txnindex`` of the segment (aborted transactions), when it lists any (docs/transactions.md).
TXN_INDEX = "segment.txnindex"


def new_attempt_id(now_ms: int | None = None) -> str:
    """``<creation ms, 11 hex digits>-<8 random hex>``: unique, sortable by creation time."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    return f"{ms:011x}-{secrets.token_hex(4)}"


def attempt_created_ms(attempt_id: str) -> int | None:
    """The creation time encoded in an attempt id, or None for a foreign name."""
    head = attempt_id.split("-", 1)[0]
    try:
        return int(head, 16)
    except ValueError:
        return None


def root(topic: str, partition: int, topic_id: str | None = None) -> str:
    """The root of one incarnation: ``<topic>-<partition>/`` (name-only) or ``…=<topic id>/``."""
    return f"{topic}-{partition}/" if topic_id is None else f"{topic}-{partition}{ID_SEPARATOR}{topic_id}/"


def partition_prefix(topic: str, partition: int, topic_id: str | None = None) -> str:
    return root(topic, partition, topic_id)


def id_roots_prefix(topic: str, partition: int) -> str:
    """What every id'd root of the partition starts with (and no other partition's keys)."""
    return f"{topic}-{partition}{ID_SEPARATOR}"


def manifests_prefix(topic: str, partition: int, topic_id: str | None = None) -> str:
    return f"{root(topic, partition, topic_id)}{MANIFESTS}/"


def manifest_key(topic: str, partition: int, base_offset: int, topic_id: str | None = None) -> str:
    return f"{manifests_prefix(topic, partition, topic_id)}{base_offset:020d}.json"


#: Lineage markers live beside the manifests (one listing finds both): ``lineage-<epoch:010d>.json``.
LINEAGE_MARKER_PREFIX = "lineage-"


def lineage_marker_key(topic: str, partition: int, epoch: int, topic_id: str | None = None) -> str:
    return f"{manifests_prefix(topic, partition, topic_id)}{LINEAGE_MARKER_PREFIX}{epoch:010d}.json"


def parse_lineage_marker_key(topic: str, partition: int, key: str, topic_id: str | None = None) -> int | None:
    """The leader epoch named by a lineage marker key, or None for any other key."""
    return _numbered_marker(manifests_prefix(topic, partition, topic_id) + LINEAGE_MARKER_PREFIX, 10, key)


def _numbered_marker(prefix: str, digits: int, key: str) -> int | None:
    """The number in ``<prefix><number: exactly digits digits>.json``, or None for any other key."""
    name = key[len(prefix) :] if key.startswith(prefix) else ""
    stem, dot, ext = name.partition(".")
    if ext != "json" or not dot or len(stem) != digits or not stem.isdigit():
        return None
    return int(stem)


#: The leader's idle note (docs/cluster.md "Idle partitions") lives beside the manifests too, so a
#: follower's one listing finds it: ``manifests/idle-note.json``, overwritten in place.
IDLE_NOTE = "idle-note.json"


def idle_note_key(topic: str, partition: int, topic_id: str | None = None) -> str:
    return f"{manifests_prefix(topic, partition, topic_id)}{IDLE_NOTE}"


#: Log start markers (rlm's DeleteRecords, docs/formats.md §6.8) live beside the manifests too:
#: ``log-start-<offset:020d>.json``; the highest offset named is the partition's log start.
LOG_START_MARKER_PREFIX = "log-start-"


def log_start_marker_key(topic: str, partition: int, offset: int, topic_id: str | None = None) -> str:
    return f"{manifests_prefix(topic, partition, topic_id)}{LOG_START_MARKER_PREFIX}{offset:020d}.json"


def parse_log_start_marker_key(
    topic: str, partition: int, key: str, topic_id: str | None = None
) -> int | None:
    """The log start offset named by a log start marker key, or None for any other key."""
    return _numbered_marker(manifests_prefix(topic, partition, topic_id) + LOG_START_MARKER_PREFIX, 20, key)


def data_prefix(topic: str, partition: int, topic_id: str | None = None) -> str:
    return f"{root(topic, partition, topic_id)}{DATA}/"


def attempt_prefix(
    topic: str, partition: int, base_offset: int, attempt_id: str, topic_id: str | None = None
) -> str:
    return f"{data_prefix(topic, partition, topic_id)}{base_offset:020d}-{attempt_id}/"


def data_key(
    topic: str, partition: int, base_offset: int, attempt_id: str, name: str, topic_id: str | None = None
) -> str:
    return attempt_prefix(topic, partition, base_offset, attempt_id, topic_id) + name


def marker_key(topic: str, partition: int, name: str, topic_id: str | None = None) -> str:
    """``<root>/<name>`` for :data:`OWNER_MARKER` / :data:`RETIRED_MARKER`."""
    return root(topic, partition, topic_id) + name


@dataclass(frozen=True, slots=True)
class Root:
    """A parsed root: which partition and which incarnation (``topic_id`` None = name-only)."""

    topic: str
    partition: int
    topic_id: str | None

    @property
    def prefix(self) -> str:
        return root(self.topic, self.partition, self.topic_id)


def parse_root(key: str) -> Root | None:
    """The root a key lies under, or None when its first component is not one (see module doc)."""
    head, slash, _ = key.partition("/")
    if not slash:
        return None
    name, sep, topic_id = head.partition(ID_SEPARATOR)
    topic, dash, number = name.rpartition("-")
    if not dash or not topic or not number.isascii() or not number.isdigit() or len(number) > 10:
        return None
    if sep and (
        len(topic_id) != 22 or not topic_id.isascii() or not all(c.isalnum() or c in "_-" for c in topic_id)
    ):
        return None
    return Root(topic, int(number), topic_id if sep else None)


@dataclass(frozen=True, slots=True)
class AttemptRef:
    """Which segment attempt a data key belongs to."""

    base_offset: int
    attempt_id: str

    @property
    def dir_name(self) -> str:
        return f"{self.base_offset:020d}-{self.attempt_id}"


def parse_data_key(topic: str, partition: int, key: str, topic_id: str | None = None) -> AttemptRef | None:
    """The attempt a key under :func:`data_prefix` belongs to, or None for a foreign key."""
    prefix = data_prefix(topic, partition, topic_id)
    if not key.startswith(prefix):
        return None
    dir_name = key[len(prefix) :].split("/", 1)[0]
    base, sep, attempt = dir_name.partition("-")
    if not sep or len(base) != 20 or not base.isdigit() or not attempt:
        return None
    return AttemptRef(int(base), attempt)


def parse_manifest_key(topic: str, partition: int, key: str, topic_id: str | None = None) -> int | None:
    """The base offset named by a manifest key, or None for a foreign key."""
    prefix = manifests_prefix(topic, partition, topic_id)
    name = key[len(prefix) :] if key.startswith(prefix) else ""
    stem, dot, ext = name.partition(".")
    if ext != "json" or not dot or len(stem) != 20 or not stem.isdigit():
        return None
    return int(stem)
