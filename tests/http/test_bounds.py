"""The HTTP API against a hostile client (docs/http-api.md §8), over real sockets (ApiServer/uvicorn)
on a partition whose batches compress 4 MiB of records into a few hundred bytes:

* ``format=json`` decodes and serializes in a worker thread: ``/healthz`` answers while a JSON
  answer is still being built (ordered by events, not by timing);
* a JSON answer holds at most ``server.max_decoded_bytes`` of decoded records (then it pages), a
  first batch alone above it is a 400 naming ``format``;
* a body declared too large is refused 413 before a byte of it is sent, and a client that sends
  it anyway reads that 413 instead of a connection reset;
* a request head that does not complete within the request timeout, or grows past
  ``MAX_HEAD_BYTES``, closes its connection; connections past ``server.max_connections`` get 503.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import rlm.http.routes_records as routes_records
from rlm.cli.wiring import build_api
from rlm.formats.compression import Compression
from rlm.formats.records import RecordSpec
from rlm.http.protocol import MAX_HEAD_BYTES
from rlm.http.server import ApiServer
from rlm.logdir.writer import LogWriter
from rlm.storage.local import LocalBackend
from rlm.tiering.manager import RemoteLogManager
from tests.lookup.helpers import settings_for

RECORD = 256 << 10  # zeros: a 16-record batch decodes to 4 MiB and compresses to almost nothing
PER_BATCH = 16
BATCHES = 10
T0 = 1_700_000_000_000


def _write_compressible(logs: Path) -> None:
    with LogWriter(logs, "zeros", 0, segment_bytes=1 << 20, clock=lambda: T0) as w:
        for i in range(BATCHES):
            specs = [RecordSpec(T0 + i, f"k{i}".encode(), bytes(RECORD)) for _ in range(PER_BATCH)]
            w.append(specs, compression=Compression.ZSTD)


Serve = Callable[..., ApiServer]


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    tmp = tmp_path_factory.mktemp("bounds")
    logs, store = tmp / "logs", tmp / "store"
    _write_compressible(logs)
    servers: list[ApiServer] = []

    def start(**server: Any) -> ApiServer:
        settings = settings_for([logs], options={"root": str(store)}, server={"port": 0, **server})
        app = build_api(settings, RemoteLogManager(settings, LocalBackend(root=str(store)))).app
        api = ApiServer.for_settings(app, settings.server)  # as `rlm run` serves it
        servers.append(api.start())
        return api

    try:
        yield start
    finally:
        for api in servers:
            api.stop()


def _json(url: str, **params: Any) -> httpx.Response:
    params = {"offset": 0, "max_bytes": 1 << 20, "format": "json", **params}
    return httpx.get(f"{url}/v1/topics/zeros/partitions/0/records", params=params, timeout=60)


def test_json_is_built_off_the_event_loop(serve: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    api = serve()
    building, release = threading.Event(), threading.Event()
    real = routes_records.fetch_json

    def held(*args: Any, **kwargs: Any) -> dict[str, Any]:
        building.set()  # the JSON answer is being built now, and stays so until released
        assert release.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(routes_records, "fetch_json", held)
    answers: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: answers.append(_json(api.url)))
    worker.start()
    try:
        assert building.wait(60)
        # Built on the event loop, this request could not be answered before the release.
        health = httpx.get(f"{api.url}/healthz", timeout=20)
        assert health.status_code == 200 and not answers
    finally:
        release.set()
        worker.join(60)
    assert answers[0].status_code == 200, answers[0].text[:300]


def test_json_answer_stops_at_the_decoded_bound(serve: Serve) -> None:
    api = serve(max_decoded_bytes=10 << 20)  # two 4 MiB batches fit, a third does not
    raw = httpx.get(f"{api.url}/v1/topics/zeros/partitions/0/records", params={"offset": 0}, timeout=60)
    assert raw.status_code == 200 and int(raw.headers["X-Rlm-Batches"]) == BATCHES  # all compressed
    doc = _json(api.url).json()
    assert [b["base_offset"] for b in doc["batches"]] == [0, PER_BATCH]
    assert doc["next_offset"] == 2 * PER_BATCH  # the client goes on from the first batch not sent
    assert all(
        len(r["value"]) == 4 * -(-RECORD // 3)  # base64 of the whole value
        for b in doc["batches"]
        for r in b["records"]
    )
    rest = _json(api.url, offset=doc["next_offset"]).json()
    assert rest["batches"][0]["base_offset"] == 2 * PER_BATCH


def test_a_first_batch_above_the_bound_is_a_400_naming_format(serve: Serve) -> None:
    api = serve(max_decoded_bytes=1 << 20)
    resp = _json(api.url)
    assert resp.status_code == 400, resp.text[:300]
    err = resp.json()["error"]
    assert (
        err["field"] == "format"
        and "server.max_decoded_bytes" in err["reason"]
        and "format=raw" in err["reason"]
    )


def _head(size: int) -> bytes:
    return (
        f"POST /v1/offsets-for-times HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        f"Content-Length: {size}\r\n\r\n"
    ).encode()


def _read_answer(sock: socket.socket) -> bytes:
    """One response: its head, then its Content-Length of body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_413_before_any_of_the_body_is_sent(serve: Serve) -> None:
    api = serve()
    with socket.create_connection(("127.0.0.1", api.port), timeout=30) as sock:
        sock.sendall(_head(64 << 20))  # declares 64 MiB, sends none of it
        answer = _read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 413") and b"server.max_body_bytes" in answer


def test_a_client_sending_the_refused_body_reads_the_413(serve: Serve) -> None:
    api = serve()
    with socket.create_connection(("127.0.0.1", api.port), timeout=30) as sock:
        sock.sendall(_head(64 << 20))
        sock.sendall(bytes(64 << 20))  # raised a reset / broken pipe when the server closed unread
        answer = _read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 413")


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the server closes (EOF or reset); a timeout of the generous wait fails the test."""
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        return True
    return True


def test_a_slow_request_head_is_closed(serve: Serve) -> None:
    api = serve(request_timeout_ms=500)
    with socket.create_connection(("127.0.0.1", api.port), timeout=60) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")  # and never the blank line
        assert _closed_by_server(sock)
    with socket.create_connection(("127.0.0.1", api.port), timeout=60) as sock:  # kept alive, then slow
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        assert _read_answer(sock).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        assert _closed_by_server(sock)


def test_an_oversized_request_head_is_closed(serve: Serve) -> None:
    api = serve()
    with socket.create_connection(("127.0.0.1", api.port), timeout=60) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # closed while sending
            sock.sendall(b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * (MAX_HEAD_BYTES + 1))
        assert _closed_by_server(sock)


def test_connections_past_the_limit_get_503(serve: Serve) -> None:
    api = serve(max_connections=3)
    held: list[socket.socket] = []
    try:
        answers = []
        for _ in range(3):  # each connection held open (kept alive) after its answer
            held.append(sock := socket.create_connection(("127.0.0.1", api.port), timeout=30))
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            answers.append(_read_answer(sock).split(b"\r\n")[0])
        assert answers == [b"HTTP/1.1 200 OK", b"HTTP/1.1 200 OK", b"HTTP/1.1 503 Service Unavailable"]
    finally:
        for sock in held:
            sock.close()
    for _ in range(200):  # the server notices the closes on its own loop
        if httpx.get(f"{api.url}/healthz", timeout=20).status_code == 200:
            break
    else:
        pytest.fail("the API kept refusing after the held connections closed")
