"""Kafka's partition.metadata: real broker files, Kafka's rules, and random/mutated bytes."""

from __future__ import annotations

import base64
import contextlib
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlm.errors import PartitionMetadataError
from rlm.formats.partition_metadata import (
    format_partition_metadata,
    parse_partition_metadata,
    validate_topic_id,
)
from rlm.logdir.discovery import discover_partitions, read_topic_id

GOOD = b"version: 0\ntopic_id: h21Hd1FxRjC-20k1lF5oYA"


def _random_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def test_real_broker_files_parse(fixtures_dir: Path) -> None:
    files = sorted((fixtures_dir / "kafka-logs").glob("*/*/partition.metadata"))
    assert files, "the broker fixtures carry partition.metadata files"
    for path in files:
        meta = parse_partition_metadata(path.read_bytes())
        assert meta.version == 0
        assert format_partition_metadata(meta.topic_id) == path.read_bytes().rstrip(b"\n")


def test_round_trip_and_tolerated_layout() -> None:
    tid = _random_id()
    assert parse_partition_metadata(format_partition_metadata(tid)).topic_id == tid
    assert parse_partition_metadata(GOOD + b"\n").topic_id == "h21Hd1FxRjC-20k1lF5oYA"
    assert parse_partition_metadata(b"version:  0\r\ntopic_id:\th21Hd1FxRjC-20k1lF5oYA\n\n").version == 0


@pytest.mark.parametrize(
    ("data", "field", "position"),
    [
        (b"", "version", None),
        (b"version: 1\ntopic_id: h21Hd1FxRjC-20k1lF5oYA", "version", 0),
        (b"version: x\ntopic_id: h21Hd1FxRjC-20k1lF5oYA", "version", 0),
        (b"version: 0\n", "topic_id", None),
        (b"version: 0\ntopicid: h21Hd1FxRjC-20k1lF5oYA", "topic_id", 11),
        (b"version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA", "topic_id", 11),  # Kafka's ZERO_UUID
        (b"version: 0\ntopic_id: h21Hd1FxRjC-20k1lF5oYB", "topic_id", 11),  # non-canonical tail
        (b"version: 0\ntopic_id: h21Hd1FxRjC+20k1lF5oYA", "topic_id", 11),  # base64, not base64url
        (b"version: 0\ntopic_id: h21Hd1FxRjC-20k1lF5o", "topic_id", 11),  # too short
    ],
)
def test_malformed_files_name_the_field(data: bytes, field: str, position: int | None) -> None:
    with pytest.raises(PartitionMetadataError) as info:
        parse_partition_metadata(data)
    assert f"'{field}'" in str(info.value)
    assert info.value.position == position


def test_non_ascii_and_oversized() -> None:
    with pytest.raises(PartitionMetadataError, match="ASCII"):
        parse_partition_metadata("version: 0\ntopic_id: é".encode())
    with pytest.raises(PartitionMetadataError, match="too long"):
        parse_partition_metadata(GOOD + b" " * 5000)


def test_bad_file_is_one_line_naming_file_and_field(tmp_path: Path) -> None:
    part = tmp_path / "t-0"
    part.mkdir()
    (part / "partition.metadata").write_bytes(b"version: 0\ntopic_id: nope")
    with pytest.raises(PartitionMetadataError) as info:
        read_topic_id(part)
    text = str(info.value)
    assert "\n" not in text and str(part / "partition.metadata") in text and "'topic_id'" in text
    # Discovery does not fail: the partition is reported with its identity unknown.
    [found] = discover_partitions([tmp_path])
    assert found.topic_id is None and found.identity_error == text
    (part / "partition.metadata").write_bytes(GOOD)
    [found] = discover_partitions([tmp_path])
    assert found.topic_id == "h21Hd1FxRjC-20k1lF5oYA" and found.identity_error is None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_the_format_error(data: bytes) -> None:
    try:
        meta = parse_partition_metadata(data)
    except PartitionMetadataError:
        return
    assert validate_topic_id(meta.topic_id) == meta.topic_id


@settings(max_examples=300, deadline=None)
@given(st.integers(0, len(GOOD) - 1), st.integers(0, 255), st.booleans())
def test_mutated_files_raise_only_the_format_error(at: int, byte: int, delete: bool) -> None:
    data = bytearray(GOOD)
    if delete:
        del data[at]
    else:
        data[at] = byte
    with contextlib.suppress(PartitionMetadataError):
        parse_partition_metadata(bytes(data))
