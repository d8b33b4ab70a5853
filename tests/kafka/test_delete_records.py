"""DeleteRecords on rlm's Kafka listener (docs/kafka-listener.md "DeleteRecords"): kafka-python's
``KafkaAdminClient.delete_records`` against a real ``rlm run`` — allowed on a SASL-authenticated
connection only; then ListOffsets earliest, Fetch and the HTTP API answer the new log start."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import OffsetSpec
from kafka.errors import TopicAuthorizationFailedError

from rlm.cli.generate import generate_log_dir
from rlm.logdir.discovery import list_segments
from rlm.testing.secrets import write_secret
from tests.kafka.helpers import Daemon, rlm, toml_config

pytestmark = pytest.mark.integration

TP = TopicPartition("drk", 0)
SASL = {
    "security_protocol": "SASL_PLAINTEXT",
    "sasl_mechanism": "PLAIN",
    "sasl_plain_username": "alice",
    "sasl_plain_password": "s3cret",
}


def _daemon(tmp: Path, kafka: dict[str, Any]) -> tuple[Daemon, list[int]]:
    logs = tmp / "logs"
    generate_log_dir(logs, [("drk", 1)], seed=6, records=500, segment_bytes=8 * 1024)
    config = toml_config(tmp / "rlm.toml", [logs], tmp / "store", {"listen": "127.0.0.1:0", **kafka})
    assert rlm("run", "--config", config, "--once", "--quiet").returncode == 0
    return Daemon(config), [s.base_offset for s in list_segments(logs / "drk-0")]


@pytest.fixture
def sasl_daemon(tmp_path: Path) -> Iterator[tuple[Daemon, list[int]]]:
    users = tmp_path / "users"
    write_secret(users, "alice:s3cret\n")
    daemon, bases = _daemon(tmp_path, {"sasl_plain_users_file": str(users)})
    try:
        yield daemon, bases
    finally:
        daemon.stop()


def _admin(bootstrap: str, **extra: Any) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000, **extra)


def test_delete_records_from_an_authenticated_client(sasl_daemon: tuple[Daemon, list[int]]) -> None:
    daemon, bases = sasl_daemon
    point = bases[1] + 3
    admin = _admin(daemon.bootstrap, **SASL)
    try:
        got = admin.delete_records({TP: point})
        assert got[TP]["low_watermark"] == point
        assert admin.delete_records({TP: 1})[TP]["low_watermark"] == point  # never backwards
        earliest = admin.list_partition_offsets({TP: OffsetSpec.EARLIEST})[TP].offset
        assert earliest == point
    finally:
        admin.close()
    consumer = KafkaConsumer(
        bootstrap_servers=daemon.bootstrap, group_id=None, auto_offset_reset="earliest", **SASL
    )
    try:
        consumer.assign([TP])
        consumer.seek(TP, point - 1)  # out of range now: the consumer resets to the new earliest
        got: list[int] = []
        for _ in range(10):  # a reset, then the fetch: a few polls
            got += [m.offset for ms in consumer.poll(timeout_ms=2000).values() for m in ms]
            if got:
                break
        assert got[0] == point
    finally:
        consumer.close()
    url = f"http://127.0.0.1:{daemon.http_port}/v1/topics/drk/partitions/0/offsets/{point - 1}"
    assert httpx.get(url).json()["found"] is False


def test_delete_records_without_authentication_is_refused(tmp_path: Path) -> None:
    daemon, bases = _daemon(tmp_path, {})
    try:
        admin = _admin(daemon.bootstrap)
        try:
            with pytest.raises(TopicAuthorizationFailedError):
                admin.delete_records({TP: bases[1]})
            assert admin.list_partition_offsets({TP: OffsetSpec.EARLIEST})[TP].offset == 0
        finally:
            admin.close()
    finally:
        daemon.stop()
