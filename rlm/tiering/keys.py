"""The remote key layout — the one place that says where rlm puts things in the store.

Keys are relative to the backend's root (its bucket/prefix/directory). Offsets are 20-digit
zero-padded so lexical key order is offset order (FORMATS §6)::

    <topic>-<partition>/manifests/<base>.json                   commit point, one per segment
    <topic>-<partition>/data/<base>-<attempt>/segment.log       the segment's bytes
    <topic>-<partition>/data/<base>-<attempt>/segment.index     Kafka's offset index (if present)
    <topic>-<partition>/data/<base>-<attempt>/segment.timeindex
    <topic>-<partition>/data/<base>-<attempt>/leader-epoch-checkpoint
    <topic>-<partition>/data/<base>-<attempt>/producer.snapshot
    <topic>-<partition>/data/<base>-<attempt>/segment.remotelogindex   the segment's own entries

Data keys are unique per copy *attempt*, so a retry never overwrites bytes a reader trusts; only
a manifest makes an attempt visible. An attempt id starts with its creation time (ms, hex) so GC
can judge its age without trusting store timestamps.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

MANIFESTS = "manifests"
DATA = "data"

#: File names inside an attempt directory, by the role of the file.
LOG = "segment.log"
OFFSET_INDEX = "segment.index"
TIME_INDEX = "segment.timeindex"
LEADER_EPOCHS = "leader-epoch-checkpoint"
PRODUCER_SNAPSHOT = "producer.snapshot"
REMOTE_LOG_INDEX = "segment.remotelogindex"


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


def partition_prefix(topic: str, partition: int) -> str:
    return f"{topic}-{partition}/"


def manifests_prefix(topic: str, partition: int) -> str:
    return f"{topic}-{partition}/{MANIFESTS}/"


def manifest_key(topic: str, partition: int, base_offset: int) -> str:
    return f"{topic}-{partition}/{MANIFESTS}/{base_offset:020d}.json"


def data_prefix(topic: str, partition: int) -> str:
    return f"{topic}-{partition}/{DATA}/"


def attempt_prefix(topic: str, partition: int, base_offset: int, attempt_id: str) -> str:
    return f"{topic}-{partition}/{DATA}/{base_offset:020d}-{attempt_id}/"


def data_key(topic: str, partition: int, base_offset: int, attempt_id: str, name: str) -> str:
    return attempt_prefix(topic, partition, base_offset, attempt_id) + name


@dataclass(frozen=True, slots=True)
class AttemptRef:
    """Which segment attempt a data key belongs to."""

    base_offset: int
    attempt_id: str

    @property
    def dir_name(self) -> str:
        return f"{self.base_offset:020d}-{self.attempt_id}"


def parse_data_key(topic: str, partition: int, key: str) -> AttemptRef | None:
    """The attempt a key under :func:`data_prefix` belongs to, or None for a foreign key."""
    prefix = data_prefix(topic, partition)
    if not key.startswith(prefix):
        return None
    dir_name = key[len(prefix):].split("/", 1)[0]
    base, sep, attempt = dir_name.partition("-")
    if not sep or len(base) != 20 or not base.isdigit() or not attempt:
        return None
    return AttemptRef(int(base), attempt)


def parse_manifest_key(topic: str, partition: int, key: str) -> int | None:
    """The base offset named by a manifest key, or None for a foreign key."""
    prefix = manifests_prefix(topic, partition)
    name = key[len(prefix):] if key.startswith(prefix) else ""
    stem, dot, ext = name.partition(".")
    if ext != "json" or not dot or len(stem) != 20 or not stem.isdigit():
        return None
    return int(stem)
