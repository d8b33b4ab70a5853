"""A Fetch with ``min_bytes`` waits (up to ``max_wait_ms``) for data the broker appends meanwhile:
a live partition written by LogWriter while ``rlm run`` serves it; kafka-python's consumer, polling
at the end of the log, receives the new records."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from rlm.formats.records import RecordSpec
from rlm.logdir.writer import LogWriter
from rlm.testing.kafka_wire import fetch_request
from tests.kafka.helpers import Daemon, call, connect, toml_config

pytestmark = pytest.mark.integration

T0 = 1_760_000_000_000


def test_a_waiting_fetch_returns_what_arrives_meanwhile(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    writer = LogWriter(logs, "live", 0, clock=lambda: T0)
    writer.append([RecordSpec(T0 + i, b"k%d" % i, b"old-%d" % i) for i in range(10)])
    writer.flush()
    writer.write_checkpoints()
    daemon = Daemon(
        toml_config(
            tmp_path / "rlm.toml",
            [logs],
            tmp_path / "store",
            {"listen": "127.0.0.1:0", "max_wait_ms": 60_000},
        )
    )
    try:
        req = fetch_request([("live", 0, 10)], max_wait_ms=60_000, min_bytes=1)
        answer: list[object] = []
        waiting = threading.Thread(target=lambda: answer.append(call(daemon.port, req, 12, FetchResponse)))
        waiting.start()
        waiting.join(timeout=1.5)  # still waiting: nothing at offset 10 yet (min_bytes = 1)
        assert waiting.is_alive() and not answer
        writer.append([RecordSpec(T0 + 100, b"new", b"arrived")])
        writer.flush()
        writer.write_checkpoints()  # the broker's high-watermark checkpoint moves
        waiting.join(timeout=60)
        assert answer, "the waiting fetch never answered"
        part = answer[0].responses[0].partitions[0]  # type: ignore[attr-defined]
        assert part.error_code == 0 and part.high_watermark == 11
        from kafka.record.memory_records import MemoryRecords

        batch = MemoryRecords(bytes(part.records)).next_batch()
        assert [(r.offset, r.key, r.value) for r in batch] == [(10, b"new", b"arrived")]
    finally:
        writer.close()
        daemon.stop()


def test_sigterm_with_open_and_waiting_connections_exits_cleanly(tmp_path: Path) -> None:
    """``rlm run`` stops promptly on SIGTERM while a Fetch waits and another connection idles: the
    listener wakes the wait, closes both, and nothing is logged as an error."""
    logs = tmp_path / "logs"
    with LogWriter(logs, "live", 0, clock=lambda: T0) as writer:
        writer.append([RecordSpec(T0, b"k", b"v")])
    daemon = Daemon(
        toml_config(
            tmp_path / "rlm.toml",
            [logs],
            tmp_path / "store",
            {"listen": "127.0.0.1:0", "max_wait_ms": 60_000},
        )
    )
    req = fetch_request([("live", 0, 1)], max_wait_ms=60_000, min_bytes=1)
    req.with_header(correlation_id=1, client_id="waiting")
    waiting, idle = connect(daemon.port), connect(daemon.port)
    try:
        waiting.sendall(bytes(req.encode(version=12, header=True, framed=True)))
        assert call(daemon.port, ApiVersionsRequest(), 0, ApiVersionsResponse, sock=idle) is not None
        daemon.stop()  # SIGTERM, then at most 30 s
        assert daemon.proc.returncode == 0
        log = daemon.log.read_text()
        assert "Traceback" not in log and " ERROR " not in log, log
    finally:
        waiting.close()
        idle.close()
        if daemon.alive():
            daemon.stop()
