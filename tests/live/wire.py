"""Raw Kafka-wire answers of one partition from a broker or rlm's listener, side by side
(kafka-python's protocol classes, the independent codec), and the HTTP API's answers.

A Fetch answer keeps every field a consumer gets (error, high watermark, last stable offset, log
start offset, aborted transactions) and its records cut into whole batches: a broker returns a byte
slice of ``partition_max_bytes`` that may end inside a batch (clients drop that tail), rlm only
whole batches (docs/kafka-listener.md §5), so the whole batches are what both must agree on.
"""

from __future__ import annotations

import http.client
import json
import socket
import struct
import urllib.parse
from dataclasses import dataclass
from typing import Any

from kafka.protocol.consumer import FetchResponse, ListOffsetsRequest, ListOffsetsResponse

from rlm.testing.kafka_wire import fetch_request
from tests.kafka.helpers import call

UNCOMMITTED, COMMITTED = 0, 1


@dataclass(frozen=True)
class Batch:
    """One whole record batch of a Fetch answer: its bytes and the header fields a consumer uses."""

    base_offset: int
    last_offset: int
    producer_id: int
    transactional: bool
    control: bool
    raw: bytes

    @property
    def timestamps(self) -> tuple[int, int]:
        """The batch header's base and max timestamps (ms)."""
        base, top = struct.unpack_from(">qq", self.raw, 27)
        return int(base), int(top)

    @property
    def abort_marker(self) -> bool:
        """A control batch whose record is an ABORT marker (key: version int16, type int16 = 0)."""
        return self.control and _control_type(self.raw) == 0


def _control_type(raw: bytes) -> int:
    from kafka.record.memory_records import MemoryRecords

    batch = MemoryRecords(raw).next_batch()
    (record,) = list(batch)
    return int(struct.unpack(">hh", record.key)[1])


def split_batches(data: bytes | None) -> tuple[list[Batch], int]:
    """The whole batches of ``data`` and how many bytes of a partial batch follow them."""
    data = bytes(data or b"")
    out: list[Batch] = []
    pos = 0
    while pos + 61 <= len(data):
        base, length = struct.unpack_from(">qi", data, pos)
        end = pos + 12 + length
        if end > len(data):
            break
        (attributes, delta) = struct.unpack_from(">hi", data, pos + 21)
        (producer_id,) = struct.unpack_from(">q", data, pos + 43)
        raw = data[pos:end]
        out.append(
            Batch(base, base + delta, producer_id, bool(attributes & 0x10), bool(attributes & 0x20), raw)
        )
        pos = end
    return out, len(data) - pos


@dataclass(frozen=True)
class Fetched:
    """One partition of a Fetch response (v12)."""

    error: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted: tuple[tuple[int, int], ...] | None  # (producer id, first offset); None = null
    batches: tuple[Batch, ...]
    partial_tail: int


@dataclass(frozen=True)
class Listed:
    error: int
    offset: int
    timestamp: int
    leader_epoch: int


class Wire:
    """One connection to a Kafka listener (a broker or rlm's), reused for every request."""

    def __init__(self, bootstrap: str) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.port = int(port)
        self.sock = socket.create_connection((host, self.port), timeout=30)

    def close(self) -> None:
        self.sock.close()

    def fetch(self, topic: str, partition: int, offset: int, isolation: int, max_bytes: int) -> Fetched:
        req = fetch_request(
            [(topic, partition, offset)],
            max_bytes=max_bytes,
            partition_max_bytes=max_bytes,
            isolation_level=isolation,
        )
        resp = call(self.port, req, 12, FetchResponse, sock=self.sock)
        assert resp is not None, "the listener closed the connection"
        p = resp.responses[0].partitions[0]
        batches, tail = split_batches(p.records)
        aborted = None
        if p.aborted_transactions is not None:
            aborted = tuple((a.producer_id, a.first_offset) for a in p.aborted_transactions)
        return Fetched(
            p.error_code,
            p.high_watermark,
            p.last_stable_offset,
            p.log_start_offset,
            aborted,
            tuple(batches),
            tail,
        )

    def list_offset(self, topic: str, partition: int, timestamp: int, isolation: int = UNCOMMITTED) -> Listed:
        t = ListOffsetsRequest.ListOffsetsTopic
        part = t.ListOffsetsPartition(partition_index=partition, current_leader_epoch=-1, timestamp=timestamp)
        req = ListOffsetsRequest(
            replica_id=-1, isolation_level=isolation, topics=[t(name=topic, partitions=[part])]
        )
        resp = call(self.port, req, 9, ListOffsetsResponse, sock=self.sock)
        assert resp is not None, "the listener closed the connection"
        p = resp.topics[0].partitions[0]
        return Listed(p.error_code, p.offset, p.timestamp, p.leader_epoch)


def consumer_filter(batches: tuple[Batch, ...], aborted: tuple[tuple[int, int], ...]) -> list[Batch]:
    """What a read_committed consumer keeps of a Fetch answer (Kafka's ``CompletedFetch``): a
    producer is aborted from its aborted transaction's first offset until its ABORT marker; its
    transactional batches in between and every control batch are dropped."""
    pending = sorted(aborted, key=lambda a: a[1])
    dropping: set[int] = set()
    kept: list[Batch] = []
    for b in batches:
        while pending and pending[0][1] <= b.last_offset:
            dropping.add(pending.pop(0)[0])
        if b.control:
            if b.abort_marker:
                dropping.discard(b.producer_id)
            continue
        if b.transactional and b.producer_id in dropping:
            continue
        kept.append(b)
    return kept


class Http:
    """rlm's HTTP API over one keep-alive connection."""

    def __init__(self, url: str) -> None:
        parsed = urllib.parse.urlparse(url)
        self.conn = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port, timeout=60)

    def close(self) -> None:
        self.conn.close()

    def get(self, path: str, **query: Any) -> tuple[int, dict[str, str], bytes]:
        qs = urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        for attempt in (1, 2):
            try:
                self.conn.request("GET", path + (f"?{qs}" if qs else ""))
                resp = self.conn.getresponse()
                body = resp.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.conn.close()  # the server closed an idle keep-alive connection: open another
                if attempt == 2:
                    raise
                continue
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body
        raise AssertionError("unreachable")

    def lookup(self, topic: str, partition: int, offset: int) -> dict[str, Any]:
        status, _, body = self.get(f"/v1/topics/{topic}/partitions/{partition}/offsets/{offset}")
        assert status == 200, (status, body[:300])
        doc: dict[str, Any] = json.loads(body)
        return doc

    def records(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        fmt: str = "raw",
        isolation: str | None = None,
        max_bytes: int | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        path = f"/v1/topics/{topic}/partitions/{partition}/records"
        return self.get(path, offset=offset, format=fmt, isolation=isolation, max_bytes=max_bytes)
