"""The streaming read (GET .../records/stream, RlmClient.iter_batches/iter_records) over a real socket:
ApiServer (uvicorn) on tiered partitions (remote + local, many segments and index entries), checked
against successive /records calls and a brute-force scan of the .log files (docs/streaming.md)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from rlm.cli.wiring import build_api
from rlm.errors import RlmHttpError, StreamInterruptedError
from rlm.formats.records import RecordSpec, iter_batches
from rlm.http.app import create_app
from rlm.http.client import RlmClient
from rlm.http.server import ApiServer
from rlm.logdir.discovery import list_segments
from rlm.logdir.writer import LogWriter
from rlm.storage.local import LocalBackend
from rlm.testing.counting import CountingBackend
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read.cache import RemoteRangeCache
from rlm.tiering.read.readers import TieredReaders
from tests.lookup.helpers import BruteLog, delete_local_segments, settings_for, write_generated

TOKEN = "stream-token"
STREAM = "/v1/topics/{t}/partitions/{p}/records/stream"


class SlowBackend(CountingBackend):
    """The store, with ``delay_s`` added to every ranged read (a slow or stalling store)."""

    def __init__(self, inner: LocalBackend) -> None:
        super().__init__(inner)
        self.delay_s = 0.0

    def _read(self, key: str, start: int, end: int | None) -> bytes:
        time.sleep(self.delay_s)
        return super()._read(key, start, end)


@dataclass
class Served:
    url: str  # token required, default deadline
    slow_url: str  # no token, request_timeout_ms = 1000, reads through ``slow``
    slow: SlowBackend
    brute: dict[str, BruteLog]
    local_start: dict[str, int]

    def client(self, **kw: object) -> RlmClient:
        return RlmClient(self.url, token=TOKEN, **kw)  # type: ignore[arg-type]


def _write_big(logs: Path) -> None:
    """~24 MiB of ~1 MiB batches (uncompressed) in 4 MiB segments: more than socket buffers hold."""
    with LogWriter(logs, "big", 0, segment_bytes=4 << 20, clock=lambda: 1_700_000_000_000) as w:
        for i in range(24):
            w.append(
                [
                    RecordSpec(1_700_000_000_000 + i, b"k%d" % i, bytes([i % 251]) * (64 << 10))
                    for _ in range(16)
                ]
            )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("stream")
    logs, store = tmp / "logs", tmp / "store"
    write_generated(logs, "orders", 0, batches=250, seed=1)
    _write_big(logs)
    brute = {p.name: BruteLog.scan(p) for p in sorted(logs.iterdir()) if p.is_dir()}
    settings = settings_for(
        [logs],
        options={"root": str(store)},
        index_entry_bytes=4_000,
        server={"host": "127.0.0.1", "port": 0, "token": TOKEN},
    )
    manager = RemoteLogManager(settings, LocalBackend(root=str(store)))
    assert all(r.error is None for r in manager.run_once())
    delete_local_segments(logs / "orders-0", keep_last=2)
    delete_local_segments(logs / "big-0", keep_last=2)
    local_start = {name: list_segments(logs / name)[0].base_offset for name in brute}
    server = ApiServer(build_api(settings, manager).app, "127.0.0.1", 0).start()  # as `rlm run` wires it
    slow = SlowBackend(LocalBackend(root=str(store)))
    slow_settings = settings_for(
        [logs],
        options={"root": str(store)},
        index_entry_bytes=4_000,
        server={"host": "127.0.0.1", "port": 0, "request_timeout_ms": 1_000},
    )
    from prometheus_client import CollectorRegistry

    slow_readers = TieredReaders(
        slow_settings, slow, progress=manager.live_progress, cache=RemoteRangeCache(0)
    )  # every read reaches the (slow) store
    slow_readers.resources.read_ahead = False
    slow_server = ApiServer(
        create_app(slow_readers, slow_settings.server, status=manager.status, registry=CollectorRegistry()),
        "127.0.0.1",
        0,
    ).start()
    try:
        yield Served(server.url, slow_server.url, slow, brute, local_start)
    finally:
        server.stop()
        slow_server.stop()


def _stream(url: str, topic: str, partition: int, token: str | None = TOKEN, **params: int) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(url + STREAM.format(t=topic, p=partition), params=params, headers=headers, timeout=60)


def _successive_records(c: RlmClient, topic: str, partition: int, offset: int, max_bytes: int) -> bytes:
    """What a client gets by calling /records again and again from each X-Rlm-Next-Offset, cut at
    ``max_bytes`` by whole batches (at least one)."""
    out: list[bytes] = []
    total = 0
    while True:
        data, headers = c.fetch_raw(topic, partition, offset, 1 << 20)
        if not data:
            return b"".join(out)
        for b in iter_batches(data):
            if out and total + b.size > max_bytes:
                return b"".join(out)
            out.append(data[b.position : b.end_position])
            total += b.size
        offset = int(headers["x-rlm-next-offset"])


def _brute_stream(brute: BruteLog, offset: int, max_bytes: int) -> bytes:
    start = next(i for i, b in enumerate(brute.batches) if b.batch.last_offset >= offset)
    out: list[bytes] = []
    total = 0
    for b in brute.batches[start:]:
        if out and total + b.batch.size > max_bytes:
            break
        out.append(b.data)
        total += b.batch.size
    return b"".join(out)


# --- bytes ----------------------------------------------------------------------------------------


def test_stream_bytes_equal_successive_records_calls_across_segments_and_tiers(served: Served) -> None:
    brute = served.brute["orders-0"]
    local_start = served.local_start["orders-0"]
    segments = {b.segment_base for b in brute.batches}
    assert local_start > 0 and len(segments) > 4  # remote-only segments, then local ones
    records = brute.records
    offsets = [
        0,
        records[5].offset,
        records[len(records) // 3].offset,
        local_start - 1,
        local_start,
        records[-3].offset,
    ]
    with served.client() as c:
        for offset in offsets:
            for max_bytes in (1, 5_000, 60_000, 1 << 30):
                resp = _stream(served.url, "orders", 0, offset=offset, max_bytes=max_bytes)
                assert resp.status_code == 200, resp.text
                want = _successive_records(c, "orders", 0, offset, max_bytes)
                assert resp.content == want, (offset, max_bytes)
                assert resp.content == _brute_stream(brute, offset, max_bytes), (offset, max_bytes)
                assert resp.headers["x-rlm-high-watermark"] == str(records[-1].offset + 1)
    whole = _stream(served.url, "orders", 0, offset=0, max_bytes=1 << 30)
    assert whole.headers.get("transfer-encoding") == "chunked"
    assert whole.content == b"".join(b.data for b in brute.batches)  # every segment, both tiers


def test_stream_of_large_batches_over_many_chunks(served: Served) -> None:
    brute = served.brute["big-0"]
    total = sum(b.batch.size for b in brute.batches)
    assert total > 20 << 20
    resp = _stream(served.url, "big", 0, offset=0, max_bytes=1 << 30)
    assert resp.content == b"".join(b.data for b in brute.batches)
    cut = _stream(served.url, "big", 0, offset=brute.records[20].offset, max_bytes=5 << 20)
    assert cut.content == _brute_stream(brute, brute.records[20].offset, 5 << 20)
    assert 4 << 20 < len(cut.content) <= 5 << 20


# --- edges and errors ------------------------------------------------------------------------------


def test_stream_at_the_visible_end_is_empty_and_above_it_416(served: Served) -> None:
    end = served.brute["orders-0"].records[-1].offset + 1
    at_end = _stream(served.url, "orders", 0, offset=end)
    assert at_end.status_code == 200 and at_end.content == b""
    assert at_end.headers["x-rlm-next-offset"] == str(end) and at_end.headers["x-rlm-batches"] == "0"
    for params, status, field in [
        ({"offset": end + 1}, 416, "offset"),
        ({"offset": 0, "max_bytes": 0}, 400, "max_bytes"),
        ({"offset": 0, "max_bytes": (1 << 40) + 1}, 400, "max_bytes"),
        ({"offset": -1}, 400, "offset"),
        ({}, 400, "offset"),
    ]:
        resp = _stream(served.url, "orders", 0, **params)
        assert resp.status_code == status, (params, resp.text)
        assert resp.json()["error"]["field"] == field, (params, resp.text)
    assert _stream(served.url, "nosuch", 0, offset=0).status_code == 404
    assert _stream(served.url, "bad name", 0, offset=0).status_code == 400


def test_stream_needs_the_token(served: Served) -> None:
    for token in (None, "wrong", ""):
        resp = _stream(served.url, "orders", 0, token=token, offset=0)
        assert resp.status_code == 401 and resp.json()["error"]["field"] == "authorization"
        assert resp.headers["www-authenticate"] == "Bearer"
    with RlmClient(served.url, token="wrong") as c, pytest.raises(RlmHttpError) as err:
        next(c.iter_batches("orders", 0, 0))
    assert err.value.status == 401


def test_stream_route_is_in_the_openapi_document(served: Served) -> None:
    spec = httpx.get(served.url + "/openapi.json").json()
    assert "/v1/topics/{topic}/partitions/{partition}/records/stream" in spec["paths"]
    assert "/v1/topics/{topic}/partitions/{partition}/records" in spec["paths"]


# --- the client --------------------------------------------------------------------------------------


@pytest.mark.parametrize("request_bytes", [1 << 30, 10_000])
def test_iter_records_yields_what_a_consumer_sees(served: Served, request_bytes: int) -> None:
    brute = served.brute["orders-0"]
    start = brute.records[37].offset  # inside a batch: the records before it are not yielded
    with served.client() as c:
        got = [
            (r.offset, r.timestamp, r.key, r.value)
            for r in c.iter_records("orders", 0, start, request_bytes=request_bytes)
        ]
        batches = list(c.iter_batches("orders", 0, 0, request_bytes=request_bytes, verify_crc=True))
    want = [(r.offset, r.timestamp, r.key, r.value) for r in brute.records if r.offset >= start]
    assert got == want
    assert [b.data for b in batches] == [b.data for b in brute.batches]
    with served.client() as c, pytest.raises(RlmHttpError) as err:
        next(c.iter_records("orders", 0, brute.records[-1].offset + 2))
    assert err.value.status == 416


def test_iter_batches_at_the_visible_end_yields_nothing(served: Served) -> None:
    end = served.brute["orders-0"].records[-1].offset + 1
    with served.client() as c:
        assert list(c.iter_batches("orders", 0, end)) == []


# --- server-side resources -------------------------------------------------------------------------------


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
    lines = [line for line in text.splitlines() if line.startswith(name + " ")]
    assert lines, name
    return float(lines[0].split()[-1])


def test_a_client_that_disconnects_mid_stream_frees_the_server_side(served: Served) -> None:
    total = sum(b.batch.size for b in served.brute["big-0"].batches)
    sent_before = _metric(served.url, "rlm_http_stream_bytes_total")
    aborted_before = _metric(served.url, "rlm_http_streams_aborted_total")
    with served.client() as c:
        stream = c.iter_batches("big", 0, 0)
        first = next(stream)
        assert first.batch.base_offset == 0
        assert _metric(served.url, "rlm_http_streams_active") == 1
        stream.close()  # closes the response: the connection goes away mid-body
    deadline = time.monotonic() + 10
    while _metric(served.url, "rlm_http_streams_active") != 0:
        assert time.monotonic() < deadline, "the server still holds the stream"
        time.sleep(0.05)
    assert _metric(served.url, "rlm_http_streams_aborted_total") == aborted_before + 1
    time.sleep(0.5)
    sent = _metric(served.url, "rlm_http_stream_bytes_total") - sent_before
    assert sent < total / 2, (sent, total)  # it stopped reading: not the whole partition


# --- deadline ------------------------------------------------------------------------------------------


def test_a_stream_that_makes_progress_outlives_the_request_deadline(served: Served) -> None:
    """The store turns slow once the response has started: the stream then makes progress for far
    longer than the deadline. (Slowed from the first read, the reads made before the response
    starts left too little of the 1 s: a busy machine, a parallel run beside other work, answered
    504 before the first byte.)"""
    body = bytearray()
    try:
        with httpx.stream(
            "GET", served.slow_url + STREAM.format(t="big", p=0), params={"offset": 0}, timeout=60
        ) as resp:
            t0 = time.monotonic()
            # each chunk from here on takes 0.15 s, well inside the 1 s a chunk may take (0.3 s
            # plus a loaded machine's decode passed 1 s); the ~16 chunks left take far longer
            served.slow.delay_s = 0.15
            for chunk in resp.iter_bytes():
                body += chunk
            took = time.monotonic() - t0
    finally:
        served.slow.delay_s = 0.0
    assert resp.status_code == 200
    assert bytes(body) == b"".join(b.data for b in served.brute["big-0"].batches)
    assert took > 1.0, took  # longer than request_timeout_ms, yet not cut


def test_a_request_past_the_deadline_is_504_and_a_stalled_stream_is_cut(served: Served) -> None:
    served.slow.delay_s = 1.5
    try:
        resp = httpx.get(
            served.slow_url + "/v1/topics/big/partitions/0/records", params={"offset": 0}, timeout=60
        )
        assert resp.status_code == 504 and "1000 ms" in resp.json()["error"]["reason"]
        first_stream = httpx.get(
            served.slow_url + STREAM.format(t="big", p=0), params={"offset": 0}, timeout=60
        )
        assert first_stream.status_code == 504
    finally:
        served.slow.delay_s = 0.0
    got: list[int] = []
    with RlmClient(served.slow_url) as c, pytest.raises(StreamInterruptedError):
        for streamed in c.iter_batches("big", 0, 0):
            got.append(streamed.batch.base_offset)
            served.slow.delay_s = 1.5  # every later chunk stalls past the deadline
    served.slow.delay_s = 0.0
    want = [b.batch.base_offset for b in served.brute["big-0"].batches]
    assert got and got == want[: len(got)] and len(got) < len(want)


def test_a_client_that_stops_reading_is_cut_after_the_deadline(served: Served) -> None:
    total = sum(b.batch.size for b in served.brute["big-0"].batches)
    got = 0
    with (
        httpx.Client(timeout=30) as http,
        http.stream("GET", served.slow_url + STREAM.format(t="big", p=0), params={"offset": 0}) as resp,
    ):
        assert resp.status_code == 200
        pieces = resp.iter_raw()
        got += len(next(pieces))
        time.sleep(3.0)  # > request_timeout_ms (1 s): the server's writes wait on full buffers
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            for piece in pieces:  # what was buffered, then the body ends without its last chunk
                got += len(piece)
    assert 0 < got < total


# --- verify ----------------------------------------------------------------------------------------------


def test_verify_true_refuses_bytes_corrupted_in_the_store(tmp_path: Path) -> None:
    """``verify=true`` re-checks every batch's CRC-32C: a byte flipped in the stored segment (inside
    a batch body, so the framing still parses) is an error, never bytes served as good."""
    logs, store = tmp_path / "logs", tmp_path / "store"
    write_generated(logs, "orders", 0, batches=60, seed=9)
    settings = settings_for(
        [logs], options={"root": str(store)}, index_entry_bytes=4_000, server={"host": "127.0.0.1", "port": 0}
    )
    manager = RemoteLogManager(settings, LocalBackend(root=str(store)))
    assert all(r.error is None for r in manager.run_once())
    delete_local_segments(logs / "orders-0", keep_last=1)
    stored = sorted(store.rglob("segment.log"))[0]
    data = bytearray(stored.read_bytes())
    first = next(iter_batches(bytes(data)))
    data[first.position + first.size - 3] ^= 0xFF  # the last record's value
    stored.write_bytes(bytes(data))
    from prometheus_client import CollectorRegistry

    readers = TieredReaders(settings, LocalBackend(root=str(store)), progress=manager.live_progress)
    server = ApiServer(
        create_app(readers, settings.server, status=manager.status, registry=CollectorRegistry()),
        "127.0.0.1",
        0,
    ).start()
    try:
        for path in ("/v1/topics/orders/partitions/0/records", STREAM.format(t="orders", p=0)):
            resp = httpx.get(server.url + path, params={"offset": 0, "verify": "true"}, timeout=30)
            assert resp.status_code >= 500 and "crc" in resp.text.lower(), (path, resp.text)
    finally:
        server.stop()
