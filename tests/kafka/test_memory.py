"""Issue #31's memory finding, measured on a real ``rlm run``: 8 connections each ask a 200 MiB
partition for 2^31−1 bytes (``max_bytes`` = ``partition_max_bytes``) and do not read the answers
(or read them slowly). The daemon's resident memory must stay within the configured bounds plus a
fixed margin (docs/kafka-listener.md §8):

    8 connections × 2 × (fetch_max_bytes + one batch) + 48 MiB

Two copies of a response may be alive at once per connection — the records read and the encoded
frame, while it is encoded in the thread pool — and one stays queued while the client does not
read. The 48 MiB cover what is not per-response: the allocator's arenas and the pages of the
segment's mmap touched by reads (the CRC check), which the kernel counts in RSS until unmapped.
Before #31 each connection read the whole 200 MiB segment, encoded a copy and queued a third: the
daemon grew by gigabytes (the test stops at 1.5 GiB over the baseline)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka.protocol.consumer import FetchResponse

from rlm.formats.records import RecordSpec
from rlm.logdir.writer import LogWriter
from rlm.testing.kafka_wire import fetch_request
from tests.kafka.helpers import Daemon, call, toml_config

pytestmark = pytest.mark.integration

MIB = 1 << 20
FETCH_MAX = 4 * MIB
BATCH = MIB  # one record of 1 MiB per batch (+ 70-odd bytes of batch and record headers)
CONNECTIONS = 8
MARGIN = 48 * MIB
BOUND = CONNECTIONS * 2 * (FETCH_MAX + BATCH + 4096) + MARGIN
CEILING = 1536 * MIB  # main's daemon is stopped here rather than left to take the host


@dataclass
class Served:
    daemon: Daemon


def rss(pid: int) -> int:
    """The process's resident set (VmRSS), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("memory")
    logs = root / "logs"
    value = bytes(range(256)) * (BATCH // 256)
    with LogWriter(logs, "mem", 0, clock=lambda: 1_760_000_000_000) as w:
        for i in range(200):  # 200 MiB in the active segment: never tiered, read from the log dir
            w.append([RecordSpec(1_760_000_000_000 + i, b"k%d" % i, value)])
        w.high_watermark = w.log_end_offset
    config = toml_config(
        root / "rlm.toml", [logs], root / "store", {"listen": "127.0.0.1:0", "fetch_max_bytes": FETCH_MAX}
    )
    daemon = Daemon(config)
    try:
        yield Served(daemon)
    finally:
        daemon.stop()


def _fetches(daemon: Daemon) -> float:
    return daemon.metric("rlm_kafka_requests_total", api="Fetch")


def _ask(port: int, cid: int) -> socket.socket:
    """A connection with a small receive buffer that sent one Fetch of 2^31−1 bytes from offset 0."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", port))
    req = fetch_request([("mem", 0, 0)], max_bytes=2**31 - 1, partition_max_bytes=2**31 - 1)
    req.with_header(correlation_id=cid, client_id="hog")
    sock.sendall(bytes(req.encode(version=12, header=True, framed=True)))
    return sock


def _peak_while(
    daemon: Daemon, answered: float, socks: list[socket.socket], got: list[bytearray] | None
) -> int:
    """Sample the daemon's RSS until all 8 Fetches were answered (and 0.5 s more); the peak.
    ``got``: read 64 KiB of each connection per sample into these (a slow client), or nothing."""
    peak, settle = 0, None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        peak = max(peak, rss(daemon.proc.pid))
        if peak > CEILING:
            break
        if settle is None and _fetches(daemon) >= answered + CONNECTIONS:
            settle = time.monotonic() + 0.5
        if settle is not None and time.monotonic() > settle:
            break
        for sock, buf in zip(socks, got or [], strict=False):
            buf += sock.recv(64 * 1024)
        time.sleep(0.02)
    return peak


def _read_to(sock: socket.socket, buf: bytearray, n: int) -> None:
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        assert chunk, "closed by the daemon"
        buf += chunk


@pytest.mark.parametrize("slow", [False, True], ids=["not-reading", "reading-slowly"])
def test_eight_hogs_stay_within_the_configured_bound(served: Served, slow: bool) -> None:
    daemon = served.daemon
    warm = call(daemon.port, fetch_request([("mem", 0, 0)], max_bytes=MIB), 12, FetchResponse)
    assert warm.responses[0].partitions[0].error_code == 0
    base, answered = rss(daemon.proc.pid), _fetches(daemon)
    socks = [_ask(daemon.port, cid) for cid in range(CONNECTIONS)]
    got = [bytearray() for _ in socks] if slow else None
    try:
        peak = _peak_while(daemon, answered, socks, got)
        print(f"RSS: baseline {base / MIB:.0f} MiB, peak +{(peak - base) / MIB:.0f} MiB")
        assert peak - base <= BOUND, f"RSS grew {(peak - base) / MIB:.0f} MiB (bound {BOUND / MIB:.0f} MiB)"
        assert _fetches(daemon) >= answered + CONNECTIONS
        for sock, buf in zip(socks, got, strict=True) if got else ():  # one response each, ≤ the bound
            _read_to(sock, buf, 4)
            size = int.from_bytes(buf[:4], "big")
            assert size <= FETCH_MAX + BATCH + 4096
            _read_to(sock, buf, 4 + size)
            resp = FetchResponse.decode(bytes(buf[4:]), version=12, header=True)
            assert FETCH_MAX - BATCH - 100 < len(resp.responses[0].partitions[0].records) <= FETCH_MAX
    finally:
        for sock in socks:
            sock.close()
    assert daemon.alive()
