"""The listener over a protected store on a real S3 server (SeaweedFS, tests/s3servers.py): segments
zstd-compressed and AES-256-GCM-encrypted per index entry, keys spread under hash prefixes
(docs/protection.md, docs/key-spread.md), local segments deleted. Kafka clients read every record
exactly — the listener serves what the tiered readers decrypt, never the stored bytes."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from tests.kafka.helpers import Daemon, oracle, tier_then_delete, toml_config, write_kafka_python_topic
from tests.protection.helpers import key_file
from tests.s3servers import S3Target

pytestmark = [pytest.mark.s3, pytest.mark.integration]


def test_clients_read_a_compressed_encrypted_spread_s3_store(tmp_path: Path, s3_target: S3Target) -> None:
    logs = tmp_path / "logs"
    write_kafka_python_topic(logs, "kp", 0, batches=80)
    part = logs / "kp-0"
    expected = oracle(part, "kp", 0)
    key = key_file(tmp_path / "keys", "k1")
    remote = _protected_spread_remote(s3_target, key)
    config = toml_config(
        tmp_path / "rlm.toml", [logs], tmp_path / "unused", {"listen": "127.0.0.1:0"}, remote=remote
    )
    deleted = tier_then_delete(config, {("kp", 0): part})[("kp", 0)]
    assert deleted and not list(part.glob(f"{deleted[0]:020d}.log"))
    daemon = Daemon(config)
    try:
        tp = TopicPartition("kp", 0)
        consumer = KafkaConsumer(
            bootstrap_servers=daemon.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            max_partition_fetch_bytes=8192,
        )
        try:
            consumer.assign([tp])
            consumer.seek_to_beginning()
            got = []
            while len(got) < len(expected.rows):
                batch = consumer.poll(timeout_ms=5000)
                assert batch, f"stalled after {len(got)} of {len(expected.rows)} records"
                got += [
                    (m.offset, m.timestamp, m.key, m.value, tuple(m.headers))
                    for ms in batch.values()
                    for m in ms
                ]
            mid = expected.rows[len(expected.rows) // 2]
            found = consumer.offsets_for_times({tp: mid[1]})[tp]
        finally:
            consumer.close()
        assert got == expected.rows
        first = expected.first_at_or_after(mid[1])
        assert first is not None and (found.offset, found.timestamp) == (first[0], first[1])
        if shutil.which("kcat"):
            assert _kcat_offsets(daemon.bootstrap, "kp", 0) == [r[0] for r in expected.rows]
    finally:
        daemon.stop()
    assert "Traceback" not in daemon.log.read_text()


def _protected_spread_remote(s3_target: S3Target, key: Path) -> list[str]:
    """The ``[remote]`` TOML lines: the S3 store, keys under 2 hash-prefix levels, zstd, key ``k1`` active."""
    remote = ["[remote]", 'backend = "s3"', "prefix_spread = 2", "[remote.options]"]
    remote += [f"{k} = {json.dumps(v)}" for k, v in s3_target.options().items()]
    encryption = ["[remote.encryption]", 'active_key = "k1"', "[remote.encryption.key_files]"]
    return [*remote, "[remote.compression]", 'codec = "zstd"', *encryption, f"k1 = {json.dumps(str(key))}"]


def _kcat_offsets(bootstrap: str, topic: str, partition: int) -> list[int]:
    """The offsets librdkafka (kcat) consumes from the beginning of the partition to its end."""
    where = ["-b", bootstrap, "-C", "-t", topic, "-p", str(partition), "-o", "beginning"]
    out = subprocess.run(
        ["kcat", *where, "-e", "-q", "-f", "%o\n"],
        capture_output=True,
        timeout=120,
        check=True,
    )
    return [int(x) for x in out.stdout.split()]
