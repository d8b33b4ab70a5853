"""KRaft metadata record decoding: real broker records (fixtures), hand-built bytes, round trips
through rlm.testing.kraft's encoder, and garbage."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from rlm.errors import CorruptMetadataRecordError
from rlm.formats import metadata as md
from rlm.formats.records import decode_records, iter_batches
from rlm.testing.kraft import encode_metadata_record

ARTHUR_LOG = "kafka-logs/ArthurArutunyan04__Backend_labs/__cluster_metadata-0/00000000000000000000.log"


def _records_at(path: Path) -> dict[int, md.MetadataRecord]:
    buf = path.read_bytes()
    out: dict[int, md.MetadataRecord] = {}
    for batch in iter_batches(buf):
        if not batch.is_control:
            for rec in decode_records(buf, batch):
                out[rec.offset] = md.decode_metadata_record(rec.value, offset=rec.offset)
    return out


def test_real_broker_records(fixtures_dir: Path) -> None:
    records = _records_at(fixtures_dir / ARTHUR_LOG)
    # The fixtures README: FeatureLevelRecords at offsets 2-4.
    assert [records[o] for o in (2, 3, 4)] == [
        md.FeatureLevelRecord("metadata.version", 25),
        md.FeatureLevelRecord("group.version", 1),
        md.FeatureLevelRecord("transaction.version", 2),
    ]
    created = md.TopicRecord("oms_order_created", "0CM0rYlfQiqSTCH-x54Zhw")
    assert records[162] == created
    assert records[164] == md.ConfigRecord(md.RESOURCE_TOPIC, "oms_order_created", "retention.ms", "86400000")
    partitions = [
        r for r in records.values() if isinstance(r, md.PartitionRecord) and r.topic_id == created.topic_id
    ]
    assert sorted(p.partition for p in partitions) == [0, 1, 2, 3, 4]
    assert all(p.replicas == (1,) and p.leader == 1 for p in partitions)
    kinds = {type(r) for r in records.values()}
    assert {md.PartitionChangeRecord, md.BeginTransactionRecord, md.EndTransactionRecord} <= kinds
    # Broker registrations, NoOps, ...: recognised as types rlm does not interpret.
    assert {r.api_key for r in records.values() if isinstance(r, md.UnknownMetadataRecord)} >= {0, 20}


def test_hand_built_config_record() -> None:
    # frame 1, type 4, version 0; int8 2; "t" compact; "retention.ms"; null value; no tags.
    value = bytes([1, 4, 0, 2, 2]) + b"t" + bytes([13]) + b"retention.ms" + bytes([0, 0])
    assert md.decode_metadata_record(value) == md.ConfigRecord(2, "t", "retention.ms", None)


def test_hand_built_partition_change_tags() -> None:
    topic_id = bytes(range(16))
    # partition 3, tags: 1 = Leader 7 (4 bytes), 0 = Isr [7, 8] (compact array: 3, then two int32)
    tags = bytes([2, 0, 9, 3]) + struct.pack(">ii", 7, 8) + bytes([1, 4]) + struct.pack(">i", 7)
    value = bytes([1, 5, 0]) + struct.pack(">i", 3) + topic_id + tags
    record = md.decode_metadata_record(value)
    assert record == md.PartitionChangeRecord(md.uuid_from_bytes(topic_id), 3, leader=7, isr=(7, 8))


@pytest.mark.parametrize(
    "record",
    [
        md.TopicRecord("orders", "0CM0rYlfQiqSTCH-x54Zhw"),
        md.PartitionRecord("0CM0rYlfQiqSTCH-x54Zhw", 4, (1, 2, 3), (1, 2), 2, 9, 12),
        md.PartitionChangeRecord("0CM0rYlfQiqSTCH-x54Zhw", 1),
        md.PartitionChangeRecord("0CM0rYlfQiqSTCH-x54Zhw", 1, leader=-1, isr=(), replicas=(5, 6)),
        md.RemoveTopicRecord("h21Hd1FxRjC-20k1lF5oYA"),
        md.ConfigRecord(md.RESOURCE_BROKER, "", "log.retention.ms", "604800000"),
        md.ConfigRecord(md.RESOURCE_TOPIC, "tópico", "cleanup.policy", None),
        md.FeatureLevelRecord("metadata.version", 19),
        md.BeginTransactionRecord("migration"),
        md.EndTransactionRecord(),
        md.AbortTransactionRecord(None),
        md.UnknownMetadataRecord(20, 0),
    ],
)
def test_round_trip(record: md.MetadataRecord) -> None:
    assert md.decode_metadata_record(encode_metadata_record(record), offset=5) == record


def test_newer_version_of_a_known_type_reads_the_known_fields() -> None:
    value = bytearray(encode_metadata_record(md.TopicRecord("orders", "0CM0rYlfQiqSTCH-x54Zhw")))
    value[2] = 7  # version 7: fields rlm does not know may follow
    value += b"\x05future"
    assert md.decode_metadata_record(bytes(value)) == md.TopicRecord("orders", "0CM0rYlfQiqSTCH-x54Zhw")


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (None, "null value"),
        (b"", "frame version"),
        (bytes([2, 4, 0]), "unknown frame version 2"),
        (bytes([1, 4, 0, 2, 9]) + b"ab", "ConfigRecord.ResourceName needs 8 bytes"),
        (bytes([1, 4, 0, 2, 0]), "ConfigRecord.ResourceName is null"),
        (bytes([1, 2, 0, 2]) + b"t" + bytes(16) + b"\x00\x99", "1 bytes left after the record body"),
        (bytes([1, 2, 0, 2, 0xFF]), "TopicRecord.Name is not UTF-8"),
        (bytes([1, 0x80, 0x80, 0x80, 0x80, 0x80]), "overlong unsigned varint"),
    ],
)
def test_garbage_names_the_offset(value: bytes | None, fragment: str) -> None:
    with pytest.raises(CorruptMetadataRecordError) as info:
        md.decode_metadata_record(value, offset=4242)
    assert fragment in str(info.value)
    assert info.value.offset == 4242


def test_uuid_text_form() -> None:
    # The topic id in the KRaft log's own partition.metadata (fixtures).
    assert md.uuid_from_bytes(bytes(15) + b"\x01") == "AAAAAAAAAAAAAAAAAAAAAQ"
    assert md.uuid_to_bytes("AAAAAAAAAAAAAAAAAAAAAQ") == bytes(15) + b"\x01"
    with pytest.raises(ValueError):
        md.uuid_to_bytes("AAAA")
