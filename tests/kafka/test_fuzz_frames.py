"""The Kafka listener's coverage-guided fuzzer (fuzz/kafka_frames.py, docs/fuzzing.md "The Kafka
listener") for a bounded number of inputs, in a subprocess (atheris instruments what it imports),
and the regression tests of what it found."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlm.errors import KafkaProtocolError
from rlm.kafka.protocol import parse_request
from tests.kafka.helpers import REPO

RUNS = 4000


def test_the_frame_fuzzer_runs_clean(tmp_path: Path) -> None:
    """libFuzzer exits 0 after RUNS inputs (seeded with every served API), 1 with the input and
    the traceback when the property fails; -rss_limit_mb bounds its memory."""
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "fuzz" / "kafka_frames.py"),
            f"-runs={RUNS}",
            "-seed=31",
            "-rss_limit_mb=1024",
            f"-artifact_prefix={tmp_path}/",
            str(tmp_path / "corpus"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    tail = "\n".join(line for line in done.stderr.splitlines() if "Instrumenting" not in line)[-4000:]
    assert done.returncode == 0, tail
    assert f"Done {RUNS} runs" in done.stderr, tail
    assert not list(tmp_path.glob("crash-*")), tail


@pytest.mark.parametrize(
    "frame",
    [
        # Produce v9 whose topic_data array has length -1: kafka-python decodes it as None and the
        # handler iterated it (TypeError: the connection closed with a traceback in the log).
        bytes.fromhex("000000090000000700046675") + bytes(22) + b"zz" + bytes(8) + b"\x01\x00",
    ],
    ids=["produce-null-topic-data"],
)
def test_a_null_non_nullable_field_is_a_protocol_error(frame: bytes) -> None:
    """Found by the fuzzer: Kafka refuses a non-nullable field serialized as null, so does rlm."""
    with pytest.raises(KafkaProtocolError, match=r"non-nullable field .* is null"):
        parse_request(frame)


def test_a_zero_uuid_is_not_a_null_field() -> None:
    """librdkafka sends Metadata v12 with each topic's ``topic_id`` all zeros, which kafka-python
    decodes as None: a UUID has no null encoding, so that is no null field (the first version of
    the null check above closed librdkafka's connections; bench/kafka_bounds_bench.py found it)."""
    import uuid

    from kafka.protocol.metadata import MetadataRequest

    topic = MetadataRequest.MetadataRequestTopic(topic_id=uuid.UUID(int=0), name="kbench")
    req = MetadataRequest(
        topics=[topic], allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    req.with_header(correlation_id=1, client_id="rdkafka")
    got = parse_request(bytes(req.encode(version=12, header=True)))
    assert [t.name for t in got.body.topics] == ["kbench"]
