"""Record routes (docs/http-api.md §3, §4): ``GET .../records`` (one fetch, raw bytes or decoded JSON)
and ``GET .../records/stream`` (raw batches up to the visible end, chunked; docs/streaming.md).
Both answer only what a Kafka consumer may see (docs/visibility.md, docs/transactions.md)."""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.params import Depends as DependsParam
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from rlm.errors import InvalidArgumentError
from rlm.formats.records import Record
from rlm.formats.records.as_json import record_json
from rlm.http.stream import (
    DEFAULT_STREAM_BYTES,
    MAX_STREAM_BYTES,
    BatchStream,
    StreamMetrics,
    first_chunk,
    stream_body,
    stream_headers,
)
from rlm.tiering.read import FetchResult, TieredReaders
from rlm.tiering.read import isolation as txn

__all__ = ["MAX_FETCH_BYTES", "fetch_json", "install_records_routes", "json_body", "reader_key"]

#: the largest ``max_bytes`` of one ``/records`` answer (64 MiB): a bigger read is a stream
MAX_FETCH_BYTES = 64 << 20

#: What the OpenAPI document says a fetch answers: raw batches, or JSON with ``format=json`` (the
#: schemathesis run found the raw answer undocumented).
_FETCH_CONTENT: dict[str, Any] = {
    "description": "record batches (format=raw) or their decoded records (format=json)",
    "content": {
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        "application/json": {"schema": {"type": "object"}},
    },
}


def install_records_routes(
    app: FastAPI,
    readers: TieredReaders,
    auth: list[DependsParam],
    *,
    stall_s: float,
    metrics: StreamMetrics,
    max_decoded_bytes: int,
) -> None:
    """The two record routes; a stream whose next chunk takes longer than ``stall_s`` seconds to
    read is cut (``server.request_timeout_ms``); a JSON answer holds at most ``max_decoded_bytes``
    of decoded keys, values and header values (``server.max_decoded_bytes``)."""
    _install_fetch_route(app, readers, auth, max_decoded_bytes)
    _install_stream_route(app, readers, auth, stall_s, metrics)


def _install_fetch_route(
    app: FastAPI, readers: TieredReaders, auth: list[DependsParam], max_decoded_bytes: int
) -> None:
    @app.get(
        "/v1/topics/{topic}/partitions/{partition}/records",
        tags=["fetch"],
        dependencies=auth,
        response_class=Response,
        responses={200: _FETCH_CONTENT},
    )
    async def records(
        request: Request,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int = 1_048_576,
        format: Literal["raw", "json"] = "raw",
        verify: bool = False,
        isolation: txn.Isolation = "read_uncommitted",
    ) -> Response:
        """``verify``: CRC-check remote batches again (they were checked before upload).
        ``isolation``: Kafka's; read_committed answers only committed records (docs/transactions.md).
        ``format=json`` stops before the batch whose records would take the decoded bytes above
        ``server.max_decoded_bytes`` (``next_offset`` is that batch's; docs/http-api.md §8)."""
        reader = readers.reader(topic, partition)
        if max_bytes <= 0 or max_bytes > MAX_FETCH_BYTES:
            raise InvalidArgumentError(
                f"max_bytes {max_bytes} must be in [1, {MAX_FETCH_BYTES}]", field="max_bytes"
            )
        fetched = await run_in_threadpool(
            txn.fetch, reader, offset, max_bytes, isolation, verify=verify, reader_key=reader_key(request)
        )
        if format == "json":
            # Decoding and serializing take CPU in proportion to the decoded size: a worker thread,
            # never the event loop every other request and stream shares (docs/http-api.md §8).
            body = await run_in_threadpool(json_body, fetched, max_decoded_bytes)
            return Response(body, media_type="application/json")
        # The fetched bytes go to the socket as they are (no re-encoding, no join).
        return Response(fetched.data, media_type="application/octet-stream", headers=_raw_headers(fetched))


def _install_stream_route(
    app: FastAPI, readers: TieredReaders, auth: list[DependsParam], stall_s: float, metrics: StreamMetrics
) -> None:
    @app.get(
        "/v1/topics/{topic}/partitions/{partition}/records/stream",
        tags=["fetch"],
        dependencies=auth,
        response_class=Response,
        responses={
            200: {
                "content": {"application/octet-stream": _FETCH_CONTENT["content"]["application/octet-stream"]}
            }
        },
    )
    async def records_stream(
        request: Request,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int = DEFAULT_STREAM_BYTES,
        verify: bool = False,
        isolation: txn.Isolation = "read_uncommitted",
    ) -> Response:
        """Raw record batches back to back from the batch holding ``offset`` (chunked) while they
        fit ``max_bytes`` (≥ 1 batch), ending at the visible end; the same bytes as successive
        ``/records`` calls (docs/streaming.md). read_committed: only committed data batches, up to
        the last stable offset (docs/transactions.md)."""
        reader = readers.reader(topic, partition)
        if not 0 < max_bytes <= MAX_STREAM_BYTES:
            raise InvalidArgumentError(
                f"max_bytes {max_bytes} must be in [1, {MAX_STREAM_BYTES}]", field="max_bytes"
            )
        fetch = txn.fetcher(reader, isolation, verify=verify, reader_key=reader_key(request))
        first = await first_chunk(fetch, offset, max_bytes)
        headers = stream_headers(first, offset)
        if not first.batches:  # at the visible end: as /records there, 200 and no records
            headers.update({"X-Rlm-Batches": "0", "X-Rlm-Next-Offset": str(first.next_offset)})
            return Response(b"", media_type="application/octet-stream", headers=headers)
        where = f"{topic}-{partition} stream from {offset}"
        body = stream_body(first, fetch, max_bytes, stall_s=stall_s, metrics=metrics, where=where)
        return BatchStream(body, media_type="application/octet-stream", headers=headers)


def reader_key(request: Request) -> tuple[str, str]:
    """Who reads, for read-ahead (docs/read-path.md): the client's ``X-Rlm-Reader`` header (one
    reader across connections) or else its connection (address and port)."""
    client = request.client
    host, port = (client.host, str(client.port)) if client is not None else ("", "")
    named = request.headers.get("x-rlm-reader")
    return (host, "reader:" + named) if named else (host, port)


def _raw_headers(fetched: FetchResult) -> dict[str, str]:
    """What a raw answer says besides its bytes: tier, where to go on, how many batches, the high
    watermark applied, and for read_committed the LSO and how many aborted transactions the range
    had (only committed data batches are in the body; docs/transactions.md)."""
    headers = {
        "X-Rlm-Tier": fetched.tier,
        "X-Rlm-Next-Offset": str(fetched.next_offset),
        "X-Rlm-Batches": str(len(fetched.batches)),
    }
    if fetched.isolation == "read_committed":
        headers["X-Rlm-Isolation"] = fetched.isolation
        headers["X-Rlm-Aborted-Transactions"] = str(len(fetched.aborted_transactions))
        if fetched.last_stable_offset is not None:
            headers["X-Rlm-Last-Stable-Offset"] = str(fetched.last_stable_offset)
    if fetched.high_watermark is not None:
        headers["X-Rlm-High-Watermark"] = str(fetched.high_watermark)
    return headers


def _txn_fields(fetched: FetchResult) -> dict[str, Any]:
    """The read_committed fields of a JSON answer (none for read_uncommitted)."""
    if fetched.isolation != "read_committed":
        return {}
    return {
        "isolation": fetched.isolation,
        "last_stable_offset": fetched.last_stable_offset,
        "aborted_transactions": [a.to_json() for a in fetched.aborted_transactions],
        "scanned_segments": len(fetched.txn_scanned),
    }


def _decoded_size(record: Record) -> int:
    """The bytes a record's key, value and header values decode to (what base64 then encodes)."""
    size = len(record.key or b"") + len(record.value or b"")
    return size + sum(len(h.key) + len(h.value or b"") for h in record.headers)


def fetch_json(fetched: FetchResult, max_decoded_bytes: int | None = None) -> dict[str, Any]:
    """The ``format=json`` answer: the batches with their records decoded, keys, values and
    header values in base64 (docs/http-api.md §3). With ``max_decoded_bytes``, batches stop before
    the one that would take the decoded bytes above it (``next_offset`` becomes its base offset);
    a first batch alone above it is an :class:`InvalidArgumentError` (field ``format``)."""
    batches: list[dict[str, Any]] = []
    next_offset, decoded = fetched.next_offset, 0
    for b in fetched.batches:
        records = list(fetched.records(b))
        decoded += sum(_decoded_size(r) for r in records)
        if max_decoded_bytes is not None and decoded > max_decoded_bytes:
            if not batches:
                raise InvalidArgumentError(
                    f"the batch at offset {b.base_offset} decodes to more than {max_decoded_bytes} "
                    "bytes (server.max_decoded_bytes); fetch it with format=raw",
                    field="format",
                )
            next_offset = b.base_offset
            break
        flags = {"base_offset": b.base_offset, "last_offset": b.last_offset, "is_control": b.is_control}
        batches.append({**flags, "records": [record_json(r) for r in records]})
    return {
        "topic": fetched.topic,
        "partition": fetched.partition,
        "tier": fetched.tier,
        "next_offset": next_offset,
        "high_watermark": fetched.high_watermark,
        "log_start_offset": fetched.log_start_offset,
        **_txn_fields(fetched),
        "batches": batches,
    }


def json_body(fetched: FetchResult, max_decoded_bytes: int) -> bytes:
    """:func:`fetch_json` serialized as FastAPI's JSON answers are (compact, UTF-8); blocking:
    run in a worker thread."""
    answer = fetch_json(fetched, max_decoded_bytes)
    return json.dumps(answer, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
