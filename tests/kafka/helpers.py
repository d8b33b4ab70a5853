"""The Kafka listener's acceptance tests share: log dirs with data in both tiers, a real ``rlm run``
subprocess with ``[kafka] listen``, a raw wire client, and an independent oracle.

The oracle decodes the original segments (before their local copies are deleted) with kafka-python's
record parser, never with rlm's: what a consumer must see is every data record of the batches below
the high watermark (``replication-offset-checkpoint``; whole batches, docs/visibility.md) and at or
after the log start offset, control batches left out, each with its offset, timestamp, key, value
and headers.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from rlm.formats import naming
from rlm.logdir.discovery import list_segments
from rlm.logdir.writer import LogWriter
from rlm.testing.daemon import rlm_cli

REPO = Path(__file__).resolve().parents[2]

Row = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]


# -- log dirs ---------------------------------------------------------------------------------------


def write_kafka_python_topic(
    log_dir: Path, topic: str = "kp", partition: int = 0, *, batches: int = 60, t0: int = 1_750_000_000_000
) -> None:
    """A partition whose batches kafka-python's own builder encoded (every codec, with headers and
    null keys), appended byte for byte by rlm's LogWriter into small segments."""
    codecs = [
        DefaultRecordBatchBuilder.CODEC_NONE,
        DefaultRecordBatchBuilder.CODEC_GZIP,
        DefaultRecordBatchBuilder.CODEC_SNAPPY,
        DefaultRecordBatchBuilder.CODEC_LZ4,
        DefaultRecordBatchBuilder.CODEC_ZSTD,
    ]
    with LogWriter(
        log_dir, topic, partition, segment_bytes=4096, index_interval_bytes=512, clock=lambda: t0
    ) as w:
        for i in range(batches):
            b = DefaultRecordBatchBuilder(
                magic=2,
                compression_type=codecs[i % len(codecs)],
                is_transactional=False,
                producer_id=-1,
                producer_epoch=-1,
                base_sequence=-1,
                batch_size=1 << 20,
            )
            for n in range(1 + i % 7):
                ts = t0 + i * 1000 + n * (n % 2)  # equal timestamps inside batches, rising across
                key = None if n == 3 else f"k{i}-{n}".encode()
                headers = [("h", f"{i}".encode()), ("empty", None)] if n % 2 else []
                b.append(n, timestamp=ts, key=key, value=(f"v{i}-{n}-" * (n + 1)).encode(), headers=headers)
            w.append_raw(bytes(b.build()))  # as a leader: base offset and epoch assigned
        w.roll()


def checkpoint(log_dir: Path, name: str) -> dict[tuple[str, int], int]:
    path = log_dir / name
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines()[2:]:
        topic, part, off = line.rsplit(" ", 2)
        out[(topic, int(part))] = int(off)
    return out


@dataclass
class Expected:
    """One partition as a consumer must read it."""

    topic: str
    partition: int
    rows: list[Row]
    log_start: int
    high_watermark: int
    below_hw: list[Row] = field(default_factory=list)  # + the records below the HW in a batch reaching it
    deleted_bases: list[int] = field(default_factory=list)  # local segments gone after tiering

    def first_at_or_after(self, ts: int) -> Row | None:
        """Kafka's ListOffsets by timestamp: any record below the high watermark counts, also one in
        a batch that reaches it (a consumer's fetch stops before that batch)."""
        return next((r for r in self.below_hw if r[1] >= ts), None)


def oracle(part_dir: Path, topic: str, partition: int) -> Expected:
    """Every visible data record of the partition, decoded by kafka-python (see the module doc)."""
    log_dir = part_dir.parent
    batches = []
    for seg in list_segments(part_dir):
        records = MemoryRecords(seg.log.read_bytes())
        while (batch := records.next_batch()) is not None:
            batches.append(batch)
    last = batches[-1].base_offset + batches[-1].last_offset_delta + 1 if batches else 0
    hw = checkpoint(log_dir, "replication-offset-checkpoint").get((topic, partition), last)
    start = checkpoint(log_dir, "log-start-offset-checkpoint").get(
        (topic, partition), batches[0].base_offset if batches else 0
    )
    rows: list[Row] = []
    below: list[Row] = []
    for batch in batches:
        if batch.is_control_batch:
            continue
        got = [
            (r.offset, r.timestamp, r.key, r.value, tuple((k, v) for k, v in r.headers))
            for r in batch
            if start <= r.offset < hw
        ]
        below += got
        if batch.base_offset + batch.last_offset_delta < hw:
            rows += got
    return Expected(topic, partition, rows, start, hw, below)


def delete_tiered_segments(part_dir: Path, highest_tiered: int) -> list[int]:
    """Delete the local files of every segment wholly at or below ``highest_tiered`` (as the log
    store does once they are tiered), never the active (last) segment."""
    segments = list_segments(part_dir)
    doomed = [
        s.base_offset for s, nxt in itertools.pairwise(segments) if nxt.base_offset - 1 <= highest_tiered
    ]
    for base in doomed:
        for suffix in (naming.LOG, naming.INDEX, naming.TIME_INDEX, naming.TXN_INDEX):
            (part_dir / naming.segment_file_name(base, suffix)).unlink(missing_ok=True)
    return doomed


# -- the daemon -------------------------------------------------------------------------------------


def toml_config(
    path: Path,
    log_dirs: list[Path],
    store: Path,
    kafka: dict[str, Any],
    *,
    remote: list[str] | None = None,
    server: dict[str, Any] | None = None,
) -> Path:
    """A config: the local backend at ``store`` unless ``remote`` gives the [remote…] lines;
    ``server``: more ``[server]`` keys."""
    remote = remote or [
        "[remote]",
        'backend = "local"',
        "[remote.options]",
        f"root = {json.dumps(str(store))}",
    ]
    lines = [
        "[log]",
        f"dirs = {json.dumps([str(d) for d in log_dirs])}",
        'eligibility = "rolled"',
        *remote,
        "[topics]",
        "follow_kafka_configs = false",
        "[cluster]",
        'leadership = "always"',
        "[tiering]",
        "gc_grace_ms = 0",
        "task_interval_ms = 60000",
        "[server]",
        "port = 0",
        *(f"{k} = {json.dumps(v)}" for k, v in (server or {}).items()),
        # SASL/PLAIN without TLS (these tests run on loopback): allowed explicitly (docs/security.md §6)
        *(
            ["allow_insecure_exposure = true"]
            if "sasl_plain_users_file" in kafka and "tls_cert" not in kafka
            else []
        ),
        "[kafka]",
    ] + [f"{k} = {json.dumps(v)}" for k, v in kafka.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def rlm(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return rlm_cli(*args, timeout=timeout, cwd=REPO)


def tier_then_delete(config: Path, parts: dict[tuple[str, int], Path]) -> dict[tuple[str, int], list[int]]:
    """``rlm run --once``, then delete every tiered local segment; the deleted bases per partition."""
    once = rlm("run", "--config", config, "--once", "--quiet")
    assert once.returncode == 0, once.stderr
    status = rlm("status", "--config", config)
    assert status.returncode == 0, status.stderr
    deleted = {}
    for row in (json.loads(line) for line in status.stdout.splitlines() if line.strip()):
        for r in row if isinstance(row, list) else [row]:
            key = (r["topic"], r["partition"])
            if key in parts and r.get("highest_tiered_offset", -1) >= 0:
                deleted[key] = delete_tiered_segments(parts[key], r["highest_tiered_offset"])
    return deleted


class Daemon:
    """``python -m rlm run`` with the Kafka listener; its address is read from its log."""

    def __init__(self, config: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RLM_")}
        self.log = config.with_suffix(".log")
        self._err = self.log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlm", "run", "--config", str(config)],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self._err,
        )
        self.port = self._wait_for(r"Kafka listener on 127\.0\.0\.1:(\d+)")
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.http_port = self._wait_for(r"HTTP API on http://127\.0\.0\.1:(\d+)")

    def metric(self, name: str, **labels: str) -> float:
        """One sample of the daemon's /metrics (0 when absent)."""
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            series, _, value = line.rpartition(" ")
            if series == (f"{name}{{{want}}}" if labels else name):
                return float(value)
        return 0.0

    def _wait_for(self, pattern: str, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.log.read_text())
            if found:
                return int(found.group(1))
            assert self.proc.poll() is None, self.log.read_text()
            time.sleep(0.1)
        raise AssertionError(f"no {pattern!r} in {self.log.read_text()}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._err.close()


# -- a raw wire client (kafka-python's protocol classes; tests only) ---------------------------------


def connect(port: int, timeout: float = 10) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    return sock


def read_frame(sock: socket.socket) -> bytes | None:
    """One response frame, or None when the server closed the connection."""
    head = _read(sock, 4)
    if head is None:
        return None
    body = _read(sock, int.from_bytes(head, "big"))
    return body


def _read(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        buf += chunk
    return buf


def call(port: int, request: Any, version: int, response_cls: Any, sock: socket.socket | None = None) -> Any:
    """Send one request (correlation id 7) and decode its response; None when the server closed."""
    own = sock is None
    sock = sock or connect(port)
    try:
        request.with_header(correlation_id=7, client_id="rlm-test")
        sock.sendall(bytes(request.encode(version=version, header=True, framed=True)))
        frame = read_frame(sock)
        if frame is None:
            return None
        resp = response_cls.decode(frame, version=version, header=True)
        assert resp.header.correlation_id == 7
        return resp
    finally:
        if own:
            sock.close()


def closed_by_server(sock: socket.socket, timeout: float = 15) -> bool:
    """Whether the server closes ``sock`` (EOF or reset) within ``timeout`` seconds."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def copy_fixture_dirs(fixtures_dir: Path, dest: Path) -> list[Path]:
    """Private copies of the fixture log dirs (never the originals)."""
    out = []
    for src in sorted((fixtures_dir / "kafka-logs").iterdir()):
        out.append(Path(shutil.copytree(src, dest / src.name)))
    return out


def api_versions_of_a_future_client(port: int) -> Any:
    """The answer to an ApiVersions request of version 77 (correlation id 9), which no listener
    knows: Kafka's v0 fallback, decoded at v0."""
    from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

    sock = connect(port)
    try:
        req = ApiVersionsRequest()
        req.with_header(correlation_id=9, client_id="future-client")
        frame = bytearray(req.encode(version=0, header=True, framed=True))
        frame[6:8] = (77).to_bytes(2, "big")  # api_version 77
        sock.sendall(bytes(frame))
        body = read_frame(sock)
        assert body is not None
        return ApiVersionsResponse.decode(body, version=0, header=True)
    finally:
        sock.close()
