"""KRaft metadata records: the values of the records in ``__cluster_metadata`` (pure decoding).

Each record value of the metadata log (and of its ``.checkpoint`` snapshots) is Kafka's
``ApiMessageAndVersion`` frame (docs/topic-policy.md, "The KRaft metadata log")::

    frameVersion uvarint (= 1)   apiKey uvarint (record type)   version uvarint   body

The body follows the record type's JSON schema (Kafka ``metadata/.../common/metadata/*.json``).
Every record type rlm decodes is *flexible* in all its versions: strings and arrays are
"compact" (length + 1 as an unsigned varint, 0 = null), and the body ends with a tagged-field
section (``count uvarint``, then ``tag uvarint, size uvarint, bytes`` per field). Unsigned varints
here are plain LEB128, not the zig-zag varints of record framing (:mod:`rlm.formats.varint`).

Decoded types: TopicRecord (2), PartitionRecord (3), ConfigRecord (4), PartitionChangeRecord (5),
RemoveTopicRecord (9), FeatureLevelRecord (12), Begin/End/AbortTransactionRecord (23/24/25).
Every other type is returned as :class:`UnknownMetadataRecord` (its body is not parsed), so a log
written by a newer Kafka with new record types still reads. A *known* type with a newer version
than rlm knows is decoded with the newest layout rlm knows: Kafka only appends fields, and the
fields read here precede anything appended. Topic ids are rendered as Kafka prints them
(``Uuid.toString``: URL-safe base64 of the 16 bytes, no padding), the form ``partition.metadata``
holds. Errors: :class:`~rlm.errors.CorruptMetadataRecordError` with the record's offset.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeAlias

from rlm.errors import CorruptMetadataRecordError, CorruptRecordError
from rlm.formats.varint import decode_uvarint

__all__ = [
    "ABORT_TRANSACTION",
    "BEGIN_TRANSACTION",
    "CONFIG",
    "END_TRANSACTION",
    "FEATURE_LEVEL",
    "PARTITION",
    "PARTITION_CHANGE",
    "REMOVE_TOPIC",
    "RESOURCE_BROKER",
    "RESOURCE_TOPIC",
    "TOPIC",
    "AbortTransactionRecord",
    "BeginTransactionRecord",
    "ConfigRecord",
    "EndTransactionRecord",
    "FeatureLevelRecord",
    "MetadataRecord",
    "PartitionChangeRecord",
    "PartitionRecord",
    "RemoveTopicRecord",
    "TopicRecord",
    "UnknownMetadataRecord",
    "decode_metadata_record",
    "uuid_from_bytes",
    "uuid_to_bytes",
]

# Record types (the ``apiKey`` of each schema).
TOPIC: Final = 2
PARTITION: Final = 3
CONFIG: Final = 4
PARTITION_CHANGE: Final = 5
REMOVE_TOPIC: Final = 9
FEATURE_LEVEL: Final = 12
BEGIN_TRANSACTION: Final = 23
END_TRANSACTION: Final = 24
ABORT_TRANSACTION: Final = 25

# ConfigRecord.ResourceType (Kafka ``ConfigResource.Type``): 2 TOPIC, 4 BROKER.
RESOURCE_TOPIC: Final = 2
RESOURCE_BROKER: Final = 4

#: ``frameVersion`` of ``ApiMessageAndVersion`` values (Kafka's AbstractApiMessageSerde).
FRAME_VERSION: Final = 1

#: PartitionChangeRecord.Leader when the leader did not change.
LEADER_UNCHANGED: Final = -2

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_UUID_BYTES: Final = 16
_MAX_UVARINT_BYTES: Final = 5


def uuid_from_bytes(raw: bytes) -> str:
    """Kafka's ``Uuid.toString``: URL-safe base64 without padding (22 characters for 16 bytes)."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def uuid_to_bytes(text: str) -> bytes:
    """Inverse of :func:`uuid_from_bytes`; ``ValueError`` unless ``text`` encodes 16 bytes."""
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if len(raw) != _UUID_BYTES:
        raise ValueError(f"topic id {text!r} is not 16 bytes of URL-safe base64")
    return raw


@dataclass(frozen=True, slots=True)
class TopicRecord:
    name: str
    topic_id: str


@dataclass(frozen=True, slots=True)
class PartitionRecord:
    """A partition's full state; ``leader`` -1 = none; ``replicas`` in preferred order."""

    topic_id: str
    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int


@dataclass(frozen=True, slots=True)
class PartitionChangeRecord:
    """A delta: ``leader`` -2 = unchanged (:data:`LEADER_UNCHANGED`), -1 = none; ``None`` lists are
    unchanged. Kafka bumps the leader epoch exactly when the leader changes."""

    topic_id: str
    partition: int
    leader: int = LEADER_UNCHANGED
    isr: tuple[int, ...] | None = None
    replicas: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class RemoveTopicRecord:
    topic_id: str


@dataclass(frozen=True, slots=True)
class ConfigRecord:
    """One config key of one resource; ``value`` ``None`` deletes the key (back to the default).
    ``resource_name`` is the topic name, or a broker id (``""`` = the cluster-wide default)."""

    resource_type: int
    resource_name: str
    name: str
    value: str | None


@dataclass(frozen=True, slots=True)
class FeatureLevelRecord:
    name: str
    level: int


@dataclass(frozen=True, slots=True)
class BeginTransactionRecord:
    """Records up to the matching End are applied atomically; an Abort discards them (KIP-868)."""

    name: str | None = None


@dataclass(frozen=True, slots=True)
class EndTransactionRecord:
    pass


@dataclass(frozen=True, slots=True)
class AbortTransactionRecord:
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class UnknownMetadataRecord:
    """A record type rlm does not interpret (brokers, ACLs, quotas, producer ids, ...)."""

    api_key: int
    version: int


MetadataRecord: TypeAlias = (
    TopicRecord
    | PartitionRecord
    | PartitionChangeRecord
    | RemoveTopicRecord
    | ConfigRecord
    | FeatureLevelRecord
    | BeginTransactionRecord
    | EndTransactionRecord
    | AbortTransactionRecord
    | UnknownMetadataRecord
)


class _Reader:
    """Cursor over one record value; every read checks bounds and names the byte position."""

    __slots__ = ("buf", "offset", "pos")

    def __init__(self, buf: bytes, offset: int | None) -> None:
        self.buf = buf
        self.pos = 0
        self.offset = offset

    def fail(self, what: str) -> CorruptMetadataRecordError:
        return CorruptMetadataRecordError(
            f"metadata record: {what} at value byte {self.pos}", offset=self.offset
        )

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise self.fail(f"{what} needs {n} bytes, {len(self.buf) - self.pos} left")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def uvarint(self, what: str) -> int:
        try:
            value, self.pos = decode_uvarint(
                self.buf, self.pos, _MAX_UVARINT_BYTES, f"unsigned varint for {what}"
            )
        except CorruptRecordError as err:
            raise self.fail(err.reason) from None
        return value

    def int8(self, what: str) -> int:
        return int(_I8.unpack(self.take(1, what))[0])

    def int16(self, what: str) -> int:
        return int(_I16.unpack(self.take(2, what))[0])

    def int32(self, what: str) -> int:
        return int(_I32.unpack(self.take(4, what))[0])

    def uuid(self, what: str) -> str:
        return uuid_from_bytes(self.take(_UUID_BYTES, what))

    def string(self, what: str) -> str | None:
        """A compact (nullable) string: length + 1, 0 = null, UTF-8."""
        n = self.uvarint(what) - 1
        if n < 0:
            return None
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None

    def required_string(self, what: str) -> str:
        value = self.string(what)
        if value is None:
            raise self.fail(f"{what} is null")
        return value

    def int32_array(self, what: str) -> tuple[int, ...] | None:
        """A compact (nullable) array of int32."""
        n = self.uvarint(what) - 1
        if n < 0:
            return None
        raw = self.take(4 * n, what)
        return struct.unpack(f">{n}i", raw)

    def skip_uuid_array(self, what: str) -> None:
        n = self.uvarint(what) - 1
        if n > 0:
            self.take(_UUID_BYTES * n, what)

    def tagged(self) -> dict[int, bytes]:
        """The tagged-field section: ``{tag: raw bytes}`` (unknown tags are kept, never an error)."""
        out: dict[int, bytes] = {}
        for _ in range(self.uvarint("tagged field count")):
            tag = self.uvarint("tag")
            out[tag] = self.take(self.uvarint(f"size of tagged field {tag}"), f"tagged field {tag}")
        return out


def _tag_reader(fields: dict[int, bytes], tag: int, parent: _Reader) -> _Reader | None:
    raw = fields.get(tag)
    return None if raw is None else _Reader(raw, parent.offset)


def _topic(r: _Reader, version: int) -> TopicRecord:
    name = r.required_string("TopicRecord.Name")
    return TopicRecord(name, r.uuid("TopicRecord.TopicId"))


def _partition(r: _Reader, version: int) -> PartitionRecord:
    partition = r.int32("PartitionRecord.PartitionId")
    topic_id = r.uuid("PartitionRecord.TopicId")
    replicas = r.int32_array("PartitionRecord.Replicas") or ()
    isr = r.int32_array("PartitionRecord.Isr") or ()
    r.int32_array("PartitionRecord.RemovingReplicas")
    r.int32_array("PartitionRecord.AddingReplicas")
    leader = r.int32("PartitionRecord.Leader")
    leader_epoch = r.int32("PartitionRecord.LeaderEpoch")
    partition_epoch = r.int32("PartitionRecord.PartitionEpoch")
    if version >= 1:
        r.skip_uuid_array("PartitionRecord.Directories")
    return PartitionRecord(
        topic_id, partition, tuple(replicas), tuple(isr), leader, leader_epoch, partition_epoch
    )


def _partition_change(r: _Reader, version: int) -> PartitionChangeRecord:
    partition = r.int32("PartitionChangeRecord.PartitionId")
    topic_id = r.uuid("PartitionChangeRecord.TopicId")
    tags = r.tagged()
    isr_r, leader_r, replicas_r = (_tag_reader(tags, t, r) for t in (0, 1, 2))
    return PartitionChangeRecord(
        topic_id,
        partition,
        leader=leader_r.int32("PartitionChangeRecord.Leader") if leader_r else LEADER_UNCHANGED,
        isr=isr_r.int32_array("PartitionChangeRecord.Isr") if isr_r else None,
        replicas=replicas_r.int32_array("PartitionChangeRecord.Replicas") if replicas_r else None,
    )


def _remove_topic(r: _Reader, version: int) -> RemoveTopicRecord:
    return RemoveTopicRecord(r.uuid("RemoveTopicRecord.TopicId"))


def _config(r: _Reader, version: int) -> ConfigRecord:
    resource_type = r.int8("ConfigRecord.ResourceType")
    resource_name = r.required_string("ConfigRecord.ResourceName")
    name = r.required_string("ConfigRecord.Name")
    return ConfigRecord(resource_type, resource_name, name, r.string("ConfigRecord.Value"))


def _feature_level(r: _Reader, version: int) -> FeatureLevelRecord:
    name = r.required_string("FeatureLevelRecord.Name")
    return FeatureLevelRecord(name, r.int16("FeatureLevelRecord.FeatureLevel"))


def _tagged_string(r: _Reader, what: str) -> str | None:
    sub = _tag_reader(r.tagged(), 0, r)
    return sub.string(what) if sub else None


def _begin(r: _Reader, version: int) -> BeginTransactionRecord:
    return BeginTransactionRecord(_tagged_string(r, "BeginTransactionRecord.Name"))


def _end(r: _Reader, version: int) -> EndTransactionRecord:
    return EndTransactionRecord()


def _abort(r: _Reader, version: int) -> AbortTransactionRecord:
    return AbortTransactionRecord(_tagged_string(r, "AbortTransactionRecord.Reason"))


#: type → (newest version rlm knows, decoder, whether the decoder reads the tagged section itself).
_DECODERS: dict[int, tuple[int, Callable[[_Reader, int], MetadataRecord], bool]] = {
    TOPIC: (0, _topic, False),
    PARTITION: (2, _partition, False),
    CONFIG: (0, _config, False),
    PARTITION_CHANGE: (2, _partition_change, True),
    REMOVE_TOPIC: (0, _remove_topic, False),
    FEATURE_LEVEL: (0, _feature_level, False),
    BEGIN_TRANSACTION: (0, _begin, True),
    END_TRANSACTION: (0, _end, False),
    ABORT_TRANSACTION: (0, _abort, True),
}


def decode_metadata_record(value: bytes | None, *, offset: int | None = None) -> MetadataRecord:
    """Decode one metadata record value (frame + body); ``offset`` only labels errors.

    A null or truncated value, an unknown frame version, bytes left over after a body of a known
    version, or a malformed field → :class:`CorruptMetadataRecordError`.
    """
    if value is None:
        raise CorruptMetadataRecordError("metadata record has a null value", offset=offset)
    r = _Reader(bytes(value), offset)
    frame = r.uvarint("frame version")
    if frame != FRAME_VERSION:
        raise r.fail(f"unknown frame version {frame} (known: {FRAME_VERSION})")
    api_key = r.uvarint("record type")
    version = r.uvarint("record version")
    entry = _DECODERS.get(api_key)
    if entry is None:
        return UnknownMetadataRecord(api_key, version)
    newest, decode, reads_tags = entry
    record = decode(r, min(version, newest))
    if version > newest:
        return record  # a newer layout appends fields after the ones read: ignore the rest
    if not reads_tags:
        r.tagged()
    if r.pos != len(r.buf):
        raise r.fail(f"{len(r.buf) - r.pos} bytes left after the record body")
    return record
