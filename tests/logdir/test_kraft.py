"""KraftMetadataLog: the real brokers' metadata logs and snapshots (fixtures), and metadata logs
written here with LogWriter — configs changing and deleted over time, a topic deleted and re-created
with a new id, incremental polls, torn tails, transactions, snapshots, truncation and garbage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlm.errors import CorruptMetadataRecordError, CorruptRecordError
from rlm.formats import metadata as md
from rlm.formats.records import RecordSpec, iter_batches
from rlm.logdir.kraft import METADATA_LOG_DIR, KraftMetadataLog, find_metadata_log, list_snapshots
from rlm.logdir.writer import LogWriter
from rlm.testing.kraft import metadata_writer, write_records, write_snapshot

ARTHUR = "ArthurArutunyan04__Backend_labs"
ITUMELENG = "ItumelengMogase__Real-Time-Data-Pipeline-for-Patient-Admissions"
T1 = "0CM0rYlfQiqSTCH-x54Zhw"
T2 = "h21Hd1FxRjC-20k1lF5oYA"


def _topic_id(partition_dir: Path) -> str:
    text = (partition_dir / "partition.metadata").read_text()
    return dict(line.split(": ", 1) for line in text.splitlines())["topic_id"]


def test_arthur_metadata_log(fixtures_dir: Path) -> None:
    logs = fixtures_dir / "kafka-logs" / ARTHUR
    reader = KraftMetadataLog(logs / METADATA_LOG_DIR)
    image = reader.poll()
    assert reader.next_offset == 7320  # both segments: 0-5150 and 5151-7319
    assert image.snapshot is None and image.gaps == []
    assert image.features["metadata.version"] == 25
    assert set(image.topics_by_name) == {
        "oms_order_created",
        "oms_order_status_changed",
        "__consumer_offsets",
    }
    assert image.topic_configs["oms_order_created"] == {
        "cleanup.policy": "delete",
        "retention.ms": "86400000",
    }
    assert image.topic_configs["__consumer_offsets"]["cleanup.policy"] == "compact"
    assert len(image.topics_by_name["__consumer_offsets"].partitions) == 50
    # Every partition directory on disk belongs to the topic id the controller recorded.
    for part_dir in logs.iterdir():
        if (part_dir / "partition.metadata").is_file() and part_dir.name != METADATA_LOG_DIR:
            topic, _, number = part_dir.name.rpartition("-")
            topic_image = image.topics_by_name[topic]
            assert topic_image.topic_id == _topic_id(part_dir), part_dir.name
            assert int(number) in topic_image.partitions
    # leader-epoch-checkpoint of oms_order_created-1 ends at epoch 14 (leader 1); the controller's
    # last change, at the clean shutdown, moved leadership off the broker: epoch 15, no leader.
    part = image.topics_by_name["oms_order_created"].partitions[1]
    assert (part.leader, part.leader_epoch, part.replicas) == (-1, 15, (1,))
    assert reader.poll() is image  # nothing new: the same image, nothing re-read


def test_itumeleng_snapshots_only(fixtures_dir: Path, expected: dict[str, Any]) -> None:
    directory = fixtures_dir / "kafka-logs" / ITUMELENG / METADATA_LOG_DIR
    assert [s[:2] for s in list_snapshots(directory)] == [(7364, 1), (21265, 6), (60500, 25)]
    reader = KraftMetadataLog(directory)
    image = reader.poll()
    assert image.snapshot == "00000000000000060500-0000000025.checkpoint"
    assert reader.next_offset == 60500 and image.offset == 60499
    assert image.features == {"metadata.version": 19}
    # patient_admissions exists only in the newest snapshot (171 records vs 165 in the older ones).
    assert image.topics_by_name["patient_admissions"].topic_id == "FSJPF87NQN-J95EDLRWirw"
    assert image.topic_configs["_confluent-ksql-default__command_topic"]["retention.ms"] == "-1"
    assert image.topic_configs["_schemas"] == {"cleanup.policy": "compact"}
    assert "patient_admissions" not in image.topic_configs
    logs = directory.parent
    for name in ("_schemas-0", "docker-connect-configs-0", "__consumer_offsets-29"):
        assert image.topics_by_name[name.rpartition("-")[0]].topic_id == _topic_id(logs / name)


def test_find_metadata_log(tmp_path: Path, fixtures_dir: Path) -> None:
    arthur = fixtures_dir / "kafka-logs" / ARTHUR
    assert find_metadata_log((tmp_path, arthur)) == arthur / METADATA_LOG_DIR
    assert find_metadata_log((tmp_path,)) is None


def _create(name: str, topic_id: str, partitions: int = 2) -> list[md.MetadataRecord]:
    return [md.TopicRecord(name, topic_id)] + [
        md.PartitionRecord(topic_id, p, (1, 2), (1, 2), 1, 0, 0) for p in range(partitions)
    ]


def _cfg(topic: str, key: str, value: str | None) -> md.ConfigRecord:
    return md.ConfigRecord(md.RESOURCE_TOPIC, topic, key, value)


def test_changes_over_time_read_incrementally(tmp_path: Path) -> None:
    writer = metadata_writer(tmp_path)
    reader = KraftMetadataLog(tmp_path / METADATA_LOG_DIR)
    write_records(
        writer,
        [
            _create("orders", T1),
            [_cfg("orders", "retention.ms", "3600000"), _cfg("orders", "remote.storage.enable", "true")],
        ],
    )
    first = reader.poll()
    assert first.topic_configs["orders"] == {"retention.ms": "3600000", "remote.storage.enable": "true"}
    position = reader._position
    write_records(
        writer,
        [
            [
                _cfg("orders", "retention.ms", "60000"),
                md.ConfigRecord(md.RESOURCE_BROKER, "", "log.retention.bytes", "1000"),
                md.ConfigRecord(md.RESOURCE_BROKER, "1", "log.retention.ms", "5"),
                md.PartitionChangeRecord(T1, 1, leader=2, isr=(2,)),
            ]
        ],
    )
    second = reader.poll()
    assert reader._position > position
    assert first.topic_configs["orders"]["retention.ms"] == "3600000"  # handed-out images never change
    assert second.topic_configs["orders"]["retention.ms"] == "60000"
    assert second.broker_configs == {"": {"log.retention.bytes": "1000"}, "1": {"log.retention.ms": "5"}}
    part = second.topics_by_name["orders"].partitions[1]
    assert (part.leader, part.leader_epoch, part.isr, part.partition_epoch) == (2, 1, (2,), 1)
    # A deletion (null value) drops the key; deleting the topic drops its configs and partitions;
    # the re-created topic has a new id and starts without the old configs.
    write_records(writer, [[_cfg("orders", "remote.storage.enable", None)]])
    assert reader.poll().topic_configs["orders"] == {"retention.ms": "60000"}
    write_records(writer, [[md.RemoveTopicRecord(T1)]])
    gone = reader.poll()
    assert "orders" not in gone.topics_by_name and "orders" not in gone.topic_configs
    assert T1 not in gone.topics_by_id
    write_records(
        writer, [_create("orders", T2, partitions=1), [_cfg("orders", "cleanup.policy", "compact")]]
    )
    again = reader.poll()
    assert again.topics_by_name["orders"].topic_id == T2 and list(again.topics_by_id) == [T2]
    assert again.topic_configs["orders"] == {"cleanup.policy": "compact"}
    assert reader.next_offset == writer.log_end_offset
    # A fresh reader from scratch agrees with the incremental one.
    fresh = KraftMetadataLog(tmp_path / METADATA_LOG_DIR).poll()
    assert fresh.topic_configs == again.topic_configs and fresh.broker_configs == again.broker_configs
    assert fresh.topics_by_name.keys() == again.topics_by_name.keys()
    writer.close()


def test_rolled_segments_and_a_torn_tail(tmp_path: Path) -> None:
    writer = metadata_writer(tmp_path, segment_bytes=300)  # a few batches per segment
    write_records(writer, [_create("a", T1)] + [[_cfg("a", "retention.ms", str(n))] for n in range(20)])
    assert len(writer.segment_base_offsets) > 3
    reader = KraftMetadataLog(tmp_path / METADATA_LOG_DIR)
    assert reader.poll().topic_configs["a"]["retention.ms"] == "19"
    # Half a batch at the end of the active segment (the broker is still writing it).
    write_records(writer, [[_cfg("a", "retention.ms", "100")]])
    active = tmp_path / METADATA_LOG_DIR / f"{writer.segment_base_offsets[-1]:020d}.log"
    full = active.read_bytes()
    size = len(full)
    head = full[: reader._position]
    active.write_bytes(full[: size - 10])
    assert reader.poll().topic_configs["a"]["retention.ms"] == "19"
    active.write_bytes(full)
    assert reader.poll().topic_configs["a"]["retention.ms"] == "100"
    assert active.read_bytes().startswith(head)
    # A roll leaves an empty active segment: polls read nothing and never mistake it for a truncation.
    image = reader.poll()
    writer.roll()
    assert reader.poll() is image and reader.poll() is image
    write_records(writer, [[_cfg("a", "retention.ms", "101")]])
    assert reader.poll().topic_configs["a"]["retention.ms"] == "101"
    assert reader.poll().topic_configs["a"]["retention.ms"] == "101"
    writer.close()


def test_metadata_transactions_apply_whole(tmp_path: Path) -> None:
    writer = metadata_writer(tmp_path)
    reader = KraftMetadataLog(tmp_path / METADATA_LOG_DIR)
    write_records(
        writer, [[md.BeginTransactionRecord("bulk"), *_create("x", T1)], [_cfg("x", "retention.ms", "1")]]
    )
    assert "x" not in reader.poll().topics_by_name  # not ended yet: nothing applied
    write_records(writer, [[md.EndTransactionRecord()]])
    assert reader.poll().topic_configs["x"] == {"retention.ms": "1"}
    write_records(
        writer,
        [
            [md.BeginTransactionRecord(None), _cfg("x", "retention.ms", "2")],
            [md.AbortTransactionRecord("controller failover")],
        ],
    )
    assert reader.poll().topic_configs["x"] == {"retention.ms": "1"}
    writer.close()


def test_a_new_snapshot_replaces_the_image(tmp_path: Path) -> None:
    writer = metadata_writer(tmp_path)
    directory = tmp_path / METADATA_LOG_DIR
    write_records(writer, [_create("old", T1), [_cfg("old", "retention.ms", "1")]])
    reader = KraftMetadataLog(directory)
    assert set(reader.poll().topics_by_name) == {"old"}
    writer.close()
    # The controller snapshotted at offset 50, the segments before were deleted, the log goes on.
    for path in directory.glob("0000*"):
        path.unlink()
    write_snapshot(directory, 50, 3, [*_create("new", T2), _cfg("new", "retention.bytes", "10")])
    tail = LogWriter(tmp_path, "__cluster_metadata", 0, start_offset=50)
    write_records(tail, [[_cfg("new", "cleanup.policy", "delete")]])
    image = reader.poll()
    assert image.snapshot == "00000000000000000050-0000000003.checkpoint"
    assert set(image.topics_by_name) == {"new"} and "old" not in image.topic_configs
    assert image.topic_configs["new"] == {"retention.bytes": "10", "cleanup.policy": "delete"}
    assert reader.next_offset == 51 and image.gaps == []
    tail.close()


def test_truncation_reloads(tmp_path: Path) -> None:
    writer = metadata_writer(tmp_path)
    write_records(
        writer, [_create("a", T1), [_cfg("a", "retention.ms", "1")], [_cfg("a", "retention.ms", "2")]]
    )
    writer.close()
    reader = KraftMetadataLog(tmp_path / METADATA_LOG_DIR)
    assert reader.poll().topic_configs["a"]["retention.ms"] == "2"
    # Raft truncates the uncommitted tail and the new leader writes different records there.
    log_file = tmp_path / METADATA_LOG_DIR / f"{0:020d}.log"
    data = log_file.read_bytes()
    (tmp_path / METADATA_LOG_DIR).rename(tmp_path / "old")
    rewritten = metadata_writer(tmp_path)
    write_records(
        rewritten,
        [
            _create("a", T1),
            [_cfg("a", "retention.ms", "1")],
            [_cfg("a", "retention.ms", "7"), _cfg("a", "x", "y")],
        ],
    )
    assert log_file.read_bytes() != data
    assert reader.poll().topic_configs["a"] == {"retention.ms": "7", "x": "y"}
    rewritten.close()
    kept = list(iter_batches(log_file.read_bytes()))[1].end_position  # the first two batches
    log_file.write_bytes(log_file.read_bytes()[:kept])  # shorter than what was read
    image = reader.poll()
    assert image.topic_configs["a"] == {"retention.ms": "1"} and reader.next_offset == 4


def test_a_gap_without_a_snapshot_is_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    writer = LogWriter(tmp_path, "__cluster_metadata", 0, start_offset=100)
    write_records(writer, [_create("a", T1)])
    image = KraftMetadataLog(tmp_path / METADATA_LOG_DIR).poll()
    assert image.gaps == ["offsets 0-99 are in no segment or snapshot (deleted before they were read)"]
    assert "offsets 0-99 are in no segment or snapshot" in caplog.text  # a warning, not silence
    assert "a" in image.topics_by_name
    writer.close()


def test_garbage_names_file_and_offset(tmp_path: Path) -> None:
    writer = metadata_writer(tmp_path)
    write_records(writer, [_create("a", T1)])
    writer.append([md_spec(b"\x01\x04\x00\x02\x09ab")])  # a ConfigRecord cut short
    writer.close()
    reader = KraftMetadataLog(tmp_path / METADATA_LOG_DIR)
    with pytest.raises(CorruptMetadataRecordError) as info:
        reader.poll()
    assert info.value.file is not None and info.value.file.endswith("00000000000000000000.log")
    assert info.value.offset == 3
    log_file = Path(info.value.file)
    data = bytearray(log_file.read_bytes())
    data[70] ^= 0xFF  # inside the first batch: its CRC no longer matches
    log_file.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError) as crc:
        reader.poll()
    assert crc.value.file == str(log_file) and crc.value.offset == 0


def test_snapshot_without_footer_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / METADATA_LOG_DIR
    write_snapshot(directory, 10, 1, _create("a", T1), footer=False)
    with pytest.raises(CorruptRecordError, match="SnapshotFooter") as info:
        KraftMetadataLog(directory).poll()
    assert info.value.file is not None and info.value.file.endswith("-0000000001.checkpoint")


def md_spec(value: bytes) -> RecordSpec:
    return RecordSpec(1_700_000_000_000, None, value)


def test_expected_json_snapshot_counts(fixtures_dir: Path, expected: dict[str, Any]) -> None:
    snaps = expected[ITUMELENG]["_kraft_snapshots"]
    assert json.dumps(snaps)  # the README's inventory: 3 snapshots, 165/165/171 records
    directory = fixtures_dir / "kafka-logs" / ITUMELENG / METADATA_LOG_DIR
    assert len(list_snapshots(directory)) == len(snaps)


def test_records_that_change_nothing_held_do_not_copy_the_image(tmp_path: Path) -> None:
    """The controller appends a NoOpRecord (type 20) every 500 ms and brokers' registrations change
    too: a poll that read only such records advances the image's offset on a shallow copy (the
    image handed out before keeps its offset); a deep copy per poll of a 10 000-partition image
    was most of an idle sidecar's CPU. A record that changes what is held still copies."""
    writer = metadata_writer(tmp_path)
    reader = KraftMetadataLog(tmp_path / METADATA_LOG_DIR)
    write_records(writer, [_create("orders", T1)])
    first = reader.poll()
    noop = md.UnknownMetadataRecord(20, 0)
    write_records(writer, [[noop, noop], [noop]])
    quiet = reader.poll()
    assert quiet.offset == writer.log_end_offset - 1 and first.offset < quiet.offset
    assert quiet.topics_by_id is first.topics_by_id  # nothing was copied
    assert reader.poll() is quiet  # nothing new: the same image

    write_records(writer, [[md.PartitionChangeRecord(T1, 0, leader=2, isr=(2,)), noop]])
    moved = reader.poll()
    assert moved.offset == writer.log_end_offset - 1
    assert moved.topics_by_name["orders"].partitions[0].leader == 2
    assert quiet.topics_by_name["orders"].partitions[0].leader != 2  # handed-out images never change
    writer.close()
