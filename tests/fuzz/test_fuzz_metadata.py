"""Fuzz the KRaft metadata record decoder (``formats/metadata.py``) and the image it feeds
(``logdir/kraft.py`` ``MetadataImage.apply``), and a metadata log directory read end to end.

Seeds: one record of each decoded type encoded by ``rlm.testing.kraft`` (the inverse of the
decoder), every record value of the real broker's ``__cluster_metadata`` segment when the
fixtures are present, and a metadata log written by LogWriter.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from rlm.config import Settings, settings_from_mapping
from rlm.formats import metadata as md
from rlm.formats.records import decode_records, iter_batches
from rlm.logdir.kraft import KraftMetadataLog, MetadataImage
from rlm.testing.kraft import encode_metadata_record, metadata_writer, write_records
from rlm.tiering.expire.policy import TopicPolicyResolver
from tests.fuzz.harness import expect_clean, fix_crcs, fuzz_settings, mutated
from tests.fuzz.seeds import fixture_files

_TID = md.uuid_from_bytes(bytes(range(16)))
_RECORDS: list[md.MetadataRecord] = [
    md.TopicRecord("orders", _TID),
    md.PartitionRecord(_TID, 0, (1, 2, 3), (1, 2), 1, 4, 7),
    md.PartitionChangeRecord(_TID, 0, leader=2, isr=(2,), replicas=(2, 3)),
    md.PartitionChangeRecord(_TID, 0),
    md.ConfigRecord(md.RESOURCE_TOPIC, "orders", "retention.ms", "86400000"),
    md.ConfigRecord(md.RESOURCE_TOPIC, "orders", "retention.bytes", "9" * 30),
    md.ConfigRecord(md.RESOURCE_TOPIC, "orders", "cleanup.policy", "compact,delete"),
    md.ConfigRecord(md.RESOURCE_TOPIC, "orders", "remote.storage.enable", "TRUE"),
    md.ConfigRecord(md.RESOURCE_BROKER, "", "log.retention.ms", "-7"),
    md.ConfigRecord(md.RESOURCE_BROKER, "", "log.retention.bytes", None),
    md.FeatureLevelRecord("metadata.version", 20),
    md.BeginTransactionRecord("tx"),
    md.EndTransactionRecord(),
    md.AbortTransactionRecord("why"),
    md.RemoveTopicRecord(_TID),
]


@functools.cache
def value_seeds() -> list[bytes]:
    seeds = [encode_metadata_record(r) for r in _RECORDS]
    for data in fixture_files(".log", max_bytes=1 << 20, limit=200).values():
        if len(seeds) > 60:
            break
        for batch in iter_batches(data):
            if batch.is_control:
                continue
            seeds += [r.value for r in decode_records(data, batch) if r.value and r.value[:1] == b"\x01"]
    return seeds


@functools.cache
def following_settings() -> Settings:
    return settings_from_mapping(
        {
            "topics": {
                "follow_kafka_configs": True,
                "overrides": {"orders*": {"retention_ms": 5, "archive_compacted": True}},
            }
        }
    )


def decode_and_apply(values: list[bytes]) -> None:
    """Decode, replay into an image, then resolve every topic's policy from it (Kafka's configs
    as the KRaft log holds them: any string for retention.ms, cleanup.policy, ...)."""
    image = MetadataImage()
    for offset, value in enumerate(values):
        record = md.decode_metadata_record(value, offset=offset)
        image.apply(record)
        image.offset = offset
    resolver = TopicPolicyResolver(following_settings())
    resolver.image = image
    for name in {*image.topics_by_name, *image.topic_configs, "orders"}:
        resolver.policy(name).as_dict()


@fuzz_settings(3)
@given(
    st.lists(
        st.sampled_from(value_seeds()).flatmap(lambda v: st.just(v) | mutated(v)) | st.binary(max_size=60),
        min_size=1,
        max_size=6,
    )
)
def test_metadata_records(values: list[bytes]) -> None:
    expect_clean(decode_and_apply, values, located=True)


@functools.cache
def metadata_segment() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        with metadata_writer(Path(tmp)) as w:
            write_records(w, [_RECORDS[:2], _RECORDS[2:7], _RECORDS[7:]])
        (log,) = Path(tmp).rglob("*.log")
        return log.read_bytes()


def poll_log(directory: Path, segment: bytes) -> None:
    part = directory / "__cluster_metadata-0"
    part.mkdir()
    (part / "00000000000000000000.log").write_bytes(segment)
    KraftMetadataLog(part).poll()


@fuzz_settings(0.5, cap=1000)
@given(mutated(metadata_segment()) | mutated(metadata_segment()).map(fix_crcs))
def test_metadata_log_directory(segment: bytes) -> None:
    tmp = tempfile.mkdtemp()
    try:
        expect_clean(poll_log, Path(tmp), segment)
    finally:
        shutil.rmtree(tmp)
