"""Encode KRaft metadata records and write metadata logs and snapshots (tests, demos).

The inverse of :mod:`rlm.formats.metadata`, written from Kafka's record schemas (the frame, compact
strings/arrays and tagged fields described there), so tests can build metadata logs with config
changes, deletions and re-created topics over time. Logs are written with
:class:`rlm.logdir.writer.LogWriter`, snapshots as Kafka lays them out: a SnapshotHeader control
batch, data batches, a SnapshotFooter control batch, offsets from 0.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

from rlm.formats import metadata as md
from rlm.formats.records import ControlRecordType, RecordSpec, build_batch, encode_control_key
from rlm.formats.varint import encode_uvarint
from rlm.logdir.kraft import METADATA_LOG_DIR
from rlm.logdir.writer import LogWriter

__all__ = [
    "MetadataLogBuilder",
    "encode_metadata_record",
    "metadata_writer",
    "new_topic_id",
    "snapshot_name",
    "topic_records",
    "write_records",
    "write_snapshot",
]


def _string(value: str | None) -> bytes:
    if value is None:
        return b"\x00"
    raw = value.encode("utf-8")
    return encode_uvarint(len(raw) + 1) + raw


def _int32s(values: Sequence[int] | None) -> bytes:
    if values is None:
        return b"\x00"
    return encode_uvarint(len(values) + 1) + struct.pack(f">{len(values)}i", *values)


def _tagged(fields: dict[int, bytes]) -> bytes:
    out = bytearray(encode_uvarint(len(fields)))
    for tag in sorted(fields):
        out += encode_uvarint(tag) + encode_uvarint(len(fields[tag])) + fields[tag]
    return bytes(out)


def _body(record: md.MetadataRecord) -> tuple[int, int, bytes]:
    """(record type, version, body) of one record."""
    if isinstance(record, md.TopicRecord):
        return md.TOPIC, 0, _string(record.name) + md.uuid_to_bytes(record.topic_id) + _tagged({})
    if isinstance(record, md.PartitionRecord):
        body = (
            struct.pack(">i", record.partition)
            + md.uuid_to_bytes(record.topic_id)
            + _int32s(record.replicas)
            + _int32s(record.isr)
            + _int32s(())
            + _int32s(())
            + struct.pack(">iii", record.leader, record.leader_epoch, record.partition_epoch)
            + encode_uvarint(len(record.replicas) + 1)
            + bytes(16) * len(record.replicas)
        )  # Directories
        return md.PARTITION, 1, body + _tagged({0: b"\x00"})  # LeaderRecoveryState 0
    if isinstance(record, md.PartitionChangeRecord):
        tags: dict[int, bytes] = {}
        if record.isr is not None:
            tags[0] = _int32s(record.isr)
        if record.leader != md.LEADER_UNCHANGED:
            tags[1] = struct.pack(">i", record.leader)
        if record.replicas is not None:
            tags[2] = _int32s(record.replicas)
        head = struct.pack(">i", record.partition) + md.uuid_to_bytes(record.topic_id)
        return md.PARTITION_CHANGE, 0, head + _tagged(tags)
    if isinstance(record, md.RemoveTopicRecord):
        return md.REMOVE_TOPIC, 0, md.uuid_to_bytes(record.topic_id) + _tagged({})
    if isinstance(record, md.ConfigRecord):
        body = (
            struct.pack(">b", record.resource_type)
            + _string(record.resource_name)
            + _string(record.name)
            + _string(record.value)
        )
        return md.CONFIG, 0, body + _tagged({})
    if isinstance(record, md.FeatureLevelRecord):
        return md.FEATURE_LEVEL, 0, _string(record.name) + struct.pack(">h", record.level) + _tagged({})
    if isinstance(record, md.BeginTransactionRecord):
        return md.BEGIN_TRANSACTION, 0, _tagged({} if record.name is None else {0: _string(record.name)})
    if isinstance(record, md.EndTransactionRecord):
        return md.END_TRANSACTION, 0, _tagged({})
    if isinstance(record, md.AbortTransactionRecord):
        return md.ABORT_TRANSACTION, 0, _tagged({} if record.reason is None else {0: _string(record.reason)})
    # An unknown type: NoOpRecord-like, an empty flexible body.
    return record.api_key, record.version, _tagged({})


def encode_metadata_record(record: md.MetadataRecord) -> bytes:
    """The record value: frame version 1, record type, version, body."""
    api_key, version, body = _body(record)
    return encode_uvarint(md.FRAME_VERSION) + encode_uvarint(api_key) + encode_uvarint(version) + body


def _specs(records: Iterable[md.MetadataRecord], timestamp: int) -> list[RecordSpec]:
    return [RecordSpec(timestamp, None, encode_metadata_record(r)) for r in records]


def write_records(
    writer: LogWriter, batches: Iterable[Sequence[md.MetadataRecord]], *, timestamp: int = 1_700_000_000_000
) -> None:
    """Append each sequence of records as one batch of the metadata log, then flush."""
    for batch in batches:
        writer.append(_specs(batch, timestamp))
    writer.flush()


def metadata_writer(log_dir: Path, **kwargs: object) -> LogWriter:
    """A :class:`LogWriter` for ``<log_dir>/__cluster_metadata-0``."""
    topic, _, partition = METADATA_LOG_DIR.rpartition("-")
    return LogWriter(log_dir, topic, int(partition), **kwargs)  # type: ignore[arg-type]


def snapshot_name(end_offset: int, epoch: int) -> str:
    return f"{end_offset:020d}-{epoch:010d}.checkpoint"


def _control(kind: ControlRecordType, base_offset: int, timestamp: int) -> bytes:
    # Control record values start with their own int16 version; rlm skips them, Kafka's body
    # (SnapshotHeader: LastContainedLogTimestamp; SnapshotFooter: empty) is written for fidelity.
    body = struct.pack(">h", 0)
    if kind is ControlRecordType.SNAPSHOT_HEADER:
        body += struct.pack(">hq", 0, timestamp) + b"\x00"
    else:
        body += struct.pack(">h", 0) + b"\x00"
    rec = RecordSpec(timestamp, encode_control_key(kind), body)
    return build_batch([rec], base_offset=base_offset, is_control=True)


def write_snapshot(
    directory: Path,
    end_offset: int,
    epoch: int,
    records: Sequence[md.MetadataRecord],
    *,
    footer: bool = True,
    timestamp: int = 1_700_000_000_000,
) -> Path:
    """Write ``<end_offset>-<epoch>.checkpoint`` holding ``records`` (the whole image)."""
    data = _control(ControlRecordType.SNAPSHOT_HEADER, 0, timestamp)
    if records:
        data += build_batch(_specs(records, timestamp), base_offset=1)
    if footer:
        data += _control(ControlRecordType.SNAPSHOT_FOOTER, 1 + len(records), timestamp)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / snapshot_name(end_offset, epoch)
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(data)
    tmp.rename(path)
    return path


def new_topic_id() -> str:
    """A random topic id in Kafka's text form."""
    return md.uuid_from_bytes(uuid.uuid4().bytes)


def topic_records(name: str, topic_id: str, replicas: Sequence[Sequence[int]]) -> list[md.MetadataRecord]:
    """A TopicRecord and one PartitionRecord per entry of ``replicas`` (partition = index), each led
    by its first replica at leader epoch 0, every replica in sync — what CreateTopics writes."""
    out: list[md.MetadataRecord] = [md.TopicRecord(name, topic_id)]
    for partition, nodes in enumerate(replicas):
        out.append(md.PartitionRecord(topic_id, partition, tuple(nodes), tuple(nodes), nodes[0], 0, 0))
    return out


class MetadataLogBuilder:
    """Writes one KRaft metadata log, the same batches into every log dir given (each broker keeps
    its own replica of ``__cluster_metadata-0``), for tests that create topics and move leaders.

    Each call appends one batch and flushes, so a reader polling in between sees every step.
    """

    def __init__(self, log_dirs: Path | Sequence[Path], **writer_kwargs: object) -> None:
        dirs = [log_dirs] if isinstance(log_dirs, Path) else list(log_dirs)
        self.writers = [metadata_writer(d, **writer_kwargs) for d in dirs]
        self.topic_ids: dict[str, str] = {}

    def append(self, records: Sequence[md.MetadataRecord]) -> None:
        """One batch of ``records`` in every replica."""
        for writer in self.writers:
            write_records(writer, [records])

    def create_topic(
        self, name: str, replicas: Sequence[Sequence[int]], *, topic_id: str | None = None
    ) -> str:
        """Create ``name`` (see :func:`topic_records`); returns its topic id."""
        self.topic_ids[name] = topic_id or new_topic_id()
        self.append(topic_records(name, self.topic_ids[name], replicas))
        return self.topic_ids[name]

    def move_leader(
        self, topic: str, partition: int, leader: int, *, isr: Sequence[int] | None = None
    ) -> None:
        """A PartitionChangeRecord electing ``leader`` (-1: no leader); the epoch goes up by one."""
        self.append(
            [
                md.PartitionChangeRecord(
                    self.topic_ids[topic],
                    partition,
                    leader=leader,
                    isr=tuple(isr) if isr is not None else None,
                )
            ]
        )

    def delete_topic(self, topic: str) -> None:
        self.append([md.RemoveTopicRecord(self.topic_ids.pop(topic))])

    def close(self) -> None:
        for writer in self.writers:
            writer.close()

    def __enter__(self) -> MetadataLogBuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
