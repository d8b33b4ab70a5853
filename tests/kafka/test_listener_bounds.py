"""The listener's bounds against a hostile or slow client (docs/kafka-listener.md §8): a long poll
re-checks offsets instead of re-reading records; before SASL authentication a frame over 512 KiB is
refused from its size header alone; connections beyond ``kafka.max_connections`` are closed at
accept; requests are decoded and responses encoded in the thread pool, never on the event loop; a
client that stops reading has its next request left unread.

An in-process :class:`KafkaListener` over real segments written by LogWriter, driven by raw
sockets with kafka-python's protocol classes (the independent codec)."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from rlm.config import load_settings
from rlm.formats.records import RecordSpec
from rlm.kafka import server as kafka_server
from rlm.kafka.api import KafkaApi
from rlm.kafka.server import KafkaListener
from rlm.logdir.writer import LogWriter
from rlm.storage.local import LocalBackend
from rlm.testing.kafka_wire import fetch_request
from rlm.testing.secrets import write_secret
from rlm.tiering.read.lookup import PartitionReader
from rlm.tiering.read.readers import TieredReaders
from tests.kafka.helpers import call, closed_by_server, connect, read_frame, toml_config

T0 = 1_760_000_000_000
Listen = Callable[..., KafkaListener]


@pytest.fixture
def listen(tmp_path: Path) -> Iterator[Listen]:
    """``listen(**kafka_keys)``: a started listener over partitions ``w-0`` (20 batches of 10 records
    of 1 KiB) and ``big-0`` (48 batches of 256 KiB), its ``[kafka]`` keys replaced by
    ``kafka_keys``; stopped at the end."""
    logs = tmp_path / "logs"
    for topic, batches, size in (("w", 20, 1024), ("big", 48, 256 * 1024)):
        with LogWriter(logs, topic, 0, clock=lambda: T0) as w:
            for i in range(batches):
                w.append([RecordSpec(T0 + i, b"k", b"v" * size) for _ in range(10 if size == 1024 else 1)])
            w.high_watermark = w.log_end_offset
    settings = load_settings(toml_config(tmp_path / "rlm.toml", [logs], tmp_path / "store", {}))
    readers = TieredReaders(settings, LocalBackend(root=str(tmp_path / "store")))
    started: list[KafkaListener] = []

    def start(**keys: Any) -> KafkaListener:
        kafka = replace(settings.kafka, listen="127.0.0.1:0", **keys)
        started.append(KafkaListener(KafkaApi(readers), kafka).start())
        return started[-1]

    yield start
    for listener in started:
        listener.stop()
    readers.close()


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every record read (``PartitionReader.fetch`` that returned) appends its offset here."""
    seen: list[int] = []
    real = PartitionReader.fetch

    def counted(self: PartitionReader, offset: int, *args: Any, **kwargs: Any) -> Any:
        got = real(self, offset, *args, **kwargs)
        seen.append(offset)  # once read: one tried on the event loop that stopped read nothing
        return got

    monkeypatch.setattr(PartitionReader, "fetch", counted)
    return seen


def test_a_long_poll_does_not_re_read_records(listen: Listen, reads: list[int]) -> None:
    """Fails before #31: a Fetch whose ``min_bytes`` is more than there is re-read every record and
    threw the answer away every 250 ms until ``max_wait_ms``. Now the records are read once; the
    wait re-checks offsets only, and the answer (all 200 KiB) comes when the wait ends."""
    listener = listen(max_wait_ms=60_000)
    req = fetch_request([("w", 0, 0)], max_wait_ms=1500, min_bytes=10 << 20, max_bytes=1 << 20)
    got = call(listener.port, req, 12, FetchResponse)
    part = got.responses[0].partitions[0]
    assert part.error_code == 0 and len(part.records) > 200 * 1024
    assert reads == [0], f"{len(reads)} record reads for one long poll"


def test_a_frame_over_512_kib_before_sasl_closes_at_its_header(
    listen: Listen, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Fails before #31: before authentication a peer had the whole max_request_bytes (100 MiB)
    budget, and the listener waited for the body. Now a header declaring more than 512 KiB closes
    the connection at once — the body is never sent here — and one line names peer and size."""
    users = write_secret(tmp_path / "users", "alice:secret\n")
    listener = listen(sasl_plain_users_file=users, idle_timeout_ms=600_000)
    sock = connect(listener.port)
    try:
        with caplog.at_level(logging.INFO, logger="rlm.kafka.server"):
            sock.sendall((524_289).to_bytes(4, "big") + b"\x00\x12\x00\x00")  # + 4 bytes of 512 KiB
            assert closed_by_server(sock, timeout=5)
        said = [r.getMessage() for r in caplog.records if "524289" in r.getMessage()]
        assert len(said) == 1 and "127.0.0.1:" in said[0], said
    finally:
        sock.close()
    ok = connect(listener.port)
    try:
        assert call(listener.port, ApiVersionsRequest(), 3, ApiVersionsResponse, sock=ok) is not None
    finally:
        ok.close()


def test_connections_beyond_max_connections_are_closed_at_accept(
    listen: Listen, caplog: pytest.LogCaptureFixture
) -> None:
    """Fails before #31: no connection cap. With ``max_connections`` 2 a third is closed at once;
    once one of the two closes, a new connection is served again."""
    listener = listen(max_connections=2)
    first, second = connect(listener.port), connect(listener.port)
    try:
        for sock in (first, second):
            assert call(listener.port, ApiVersionsRequest(), 3, ApiVersionsResponse, sock=sock)
        with caplog.at_level(logging.INFO, logger="rlm.kafka.server"):
            third = connect(listener.port)
            try:
                assert closed_by_server(third, timeout=10)
            finally:
                third.close()
        assert any("kafka.max_connections" in r.getMessage() for r in caplog.records)
        first.close()
        _eventually_served(listener.port)
    finally:
        first.close()
        second.close()


def _eventually_served(port: int) -> None:
    """The listener notices a closed connection when it reads its EOF: a new one may race it."""
    for _ in range(50):
        with connect(port) as sock:
            if call(port, ApiVersionsRequest(), 3, ApiVersionsResponse, sock=sock) is not None:
                return
        threading.Event().wait(0.1)
    raise AssertionError("no connection served after one of the two closed")


def test_decoding_and_encoding_run_in_the_thread_pool(
    listen: Listen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fails before #31: frames were decoded and responses encoded on the event loop's thread.
    (A Fetch answer is encoded by ``encode_fetch_response``: its records go out as read.) A Fetch
    is decoded on the loop, where it is tried (rlm/kafka/on_loop.py); this one reads a segment's
    records on disk, so its read goes on in the pool, which encodes its answer."""
    threads: list[str] = []
    for name in ("parse_request", "encode_response", "encode_fetch_response"):
        real = getattr(kafka_server, name)

        def traced(*args: Any, _real: Any = real) -> Any:
            threads.append(threading.current_thread().name)
            return _real(*args)

        monkeypatch.setattr(kafka_server, name, traced)
    listener = listen()
    call(listener.port, ApiVersionsRequest(), 3, ApiVersionsResponse)
    call(listener.port, fetch_request([("w", 0, 0)]), 12, FetchResponse)
    assert len(threads) == 4 and threads[2] == "rlm-kafka", threads  # the Fetch's decoding
    assert all(t.startswith("rlm-kafka_") for t in threads[:2] + threads[3:]), threads


def test_a_client_that_does_not_read_has_its_next_request_left_unread(
    listen: Listen, reads: list[int]
) -> None:
    """Backpressure: three pipelined Fetches of 12 MiB responses (more than the sockets' buffers
    hold) on a connection that reads nothing: the first is answered, the second is not even read
    until the first drains — a slow client holds one response."""
    listener = listen()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", listener.port))
    try:
        for cid in range(3):
            req = fetch_request([("big", 0, 0)], max_bytes=16 << 20, partition_max_bytes=16 << 20)
            req.with_header(correlation_id=cid, client_id="slow")
            sock.sendall(bytes(req.encode(version=12, header=True, framed=True)))
        threading.Event().wait(1.0)  # what a second read would need; none may come
        assert reads == [0]
        frames = [read_frame(sock) for _ in range(3)]  # reading lets the next ones through
        assert all(f is not None for f in frames) and reads == [0, 0, 0]
    finally:
        sock.close()
