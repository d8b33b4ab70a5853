from __future__ import annotations

import pytest

from rlm.errors import InvalidArgumentError, LogDirError
from rlm.formats import naming


def test_segment_file_name_is_20_digit_zero_padded() -> None:
    assert naming.segment_file_name(81908, naming.LOG) == "00000000000000081908.log"
    assert naming.segment_file_name(0, naming.REMOTE_LOG_INDEX) == "00000000000000000000.remotelogindex"


def test_segment_file_name_rejects_negative() -> None:
    with pytest.raises(InvalidArgumentError):
        naming.segment_file_name(-1, naming.LOG)


@pytest.mark.parametrize(
    ("name", "offset"),
    [
        ("00000000000000081908.log", 81908),
        ("00000000000000081908.log.deleted", 81908),
        ("00000000000000005151.timeindex", 5151),
        ("00000000000000094646.snapshot", 94646),
    ],
)
def test_parse_base_offset_uses_text_before_first_dot(name: str, offset: int) -> None:
    assert naming.parse_base_offset(name) == offset


@pytest.mark.parametrize(
    "name", ["00000000000000007364-0000000001.checkpoint", "leader-epoch-checkpoint", ".log", "-1.log"]
)
def test_parse_base_offset_rejects_non_segment_names(name: str) -> None:
    with pytest.raises(LogDirError):
        naming.parse_base_offset(name)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("oms_order_created-1", ("oms_order_created", 1)),
        ("__cluster_metadata-0", ("__cluster_metadata", 0)),
        ("_confluent-ksql-default__command_topic-0", ("_confluent-ksql-default__command_topic", 0)),
        ("a.b-c-12", ("a.b-c", 12)),
    ],
)
def test_parse_partition_dir_splits_at_last_dash(name: str, expected: tuple[str, int]) -> None:
    assert naming.parse_partition_dir(name) == expected


@pytest.mark.parametrize(
    "name",
    [
        "topic",  # no partition
        "topic-",  # empty partition
        "-3",  # empty topic
        ".-0",
        "..-0",
        "to pic-0",
        "topic-x",
        "t-0.0123456789abcdef-delete",  # Kafka's deleted-partition dir
        "t-0.0123456789abcdef-future",
        "a" * 250 + "-0",
    ],
)
def test_parse_partition_dir_rejects(name: str) -> None:
    with pytest.raises(LogDirError):
        naming.parse_partition_dir(name)


def test_topic_of_249_chars_is_legal() -> None:
    assert naming.parse_partition_dir("a" * 249 + "-7") == ("a" * 249, 7)


@pytest.mark.parametrize(
    ("name", "transient"),
    [
        ("00000000000000000000.log.deleted", True),
        ("00000000000000000000.log.cleaned", True),
        ("00000000000000000000.index.swap", True),
        ("00000000000000000000.log", False),
        ("00000000000000000000.remotelogindex", False),
    ],
)
def test_is_transient(name: str, transient: bool) -> None:
    assert naming.is_transient(name) is transient


@pytest.mark.parametrize("topic", sorted(naming.INTERNAL_TOPICS))
def test_kafka_internal_logs_are_internal(topic: str) -> None:
    assert naming.is_internal_topic(topic)


@pytest.mark.parametrize(
    "topic",
    [
        "_schemas",
        "_confluent-ksql-default__command_topic",
        "__consumer_offsets2",
        "consumer_offsets",
        "oms_order_created",
    ],
)
def test_user_topics_are_not_internal(topic: str) -> None:
    assert not naming.is_internal_topic(topic)
