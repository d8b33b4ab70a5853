"""A small Python client for the rlm HTTP API (httpx), mirroring the routes one to one.

:meth:`RlmClient.iter_batches` / :meth:`RlmClient.iter_records` read a partition through the
streaming route (docs/streaming.md): one request per ``request_bytes`` (256 MiB by default) instead
of one per MiB, batches yielded as soon as they are whole.

HTTPS: an ``https://`` base URL is verified against the system's CAs, or ``ca_file`` (a PEM
bundle); :meth:`RlmClient.for_server` builds URL, token and CA from a ``[server]`` section
(docs/security.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from rlm.config import ServerSettings
from rlm.config.server import bearer_token
from rlm.config.tls import client_context
from rlm.errors import RlmHttpError, StreamInterruptedError
from rlm.formats.records import Record, RecordBatch, decode_records, iter_batches

__all__ = ["RlmClient", "StreamedBatch"]

#: a v0-v2 batch / message set entry starts with offset (8 bytes) and size (4 bytes)
_ENTRY_HEADER = 12


@dataclass(frozen=True, slots=True)
class StreamedBatch:
    """One record batch of a stream: ``batch`` positions are relative to ``chunk`` (the bytes
    received with it, shared by the batches of that chunk: no copy per batch)."""

    batch: RecordBatch
    chunk: bytes

    @property
    def data(self) -> bytes:
        """The batch's own bytes (Kafka's on-disk format)."""
        return self.chunk[self.batch.position : self.batch.end_position]

    def records(self) -> list[Record]:
        return decode_records(self.chunk, self.batch)


class RlmClient:
    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        reader: str | None = None,
        ca_file: Path | None = None,
    ) -> None:
        """``reader``: a name the server's read engine knows this client by (``X-Rlm-Reader``),
        for sequential-read detection across connections; default: the connection. ``ca_file``:
        PEM bundle verifying an ``https://`` server (default: the system's CAs); the certificate
        and host name are always verified."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if reader:
            headers["X-Rlm-Reader"] = reader
        self._http = httpx.Client(
            base_url=base_url, headers=headers, timeout=timeout, verify=client_context(ca_file)
        )

    @classmethod
    def for_server(cls, server: ServerSettings, *, host: str | None = None, **kwargs: Any) -> RlmClient:
        """A client of the API ``server`` describes: ``https`` when it has ``tls_cert`` (verified
        with ``tls_ca``), its token (``token`` or ``token_file``); ``host`` defaults to the
        server's, a wildcard address (0.0.0.0, ::) to loopback. ``host`` must match the
        certificate's names under HTTPS."""
        target = host or {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(server.host, server.host)
        scheme = "https" if server.tls_cert is not None else "http"
        authority = f"[{target}]" if ":" in target else target
        return cls(
            f"{scheme}://{authority}:{server.port}",
            token=bearer_token(server) or None,
            ca_file=server.tls_ca,
            **kwargs,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RlmClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self, resp: httpx.Response) -> httpx.Response:
        if resp.status_code >= 400:
            try:
                err = resp.json()["error"]
                raise RlmHttpError(resp.status_code, err.get("field"), err.get("reason", ""))
            except (ValueError, KeyError, TypeError):
                raise RlmHttpError(resp.status_code, None, resp.text[:200]) from None
        return resp

    def _get(self, path: str, **params: Any) -> Any:
        return self._check(self._http.get(path, params=params or None)).json()

    def _object(self, path: str, **params: Any) -> dict[str, Any]:
        doc: dict[str, Any] = self._get(path, **params)
        return doc

    def _rows(self, doc: Any) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = doc
        return rows

    def healthz(self) -> dict[str, Any]:
        return self._object("/healthz")

    def partitions(self) -> list[dict[str, Any]]:
        return self._rows(self._get("/v1/partitions"))

    def pins(self) -> list[dict[str, Any]]:
        """``GET /v1/pins``: per log dir, the pinned bytes and their bound (docs/http-api.md §2)."""
        return self._rows(self._get("/v1/pins"))

    def lookup_offset(self, topic: str, partition: int, offset: int) -> dict[str, Any]:
        return self._object(f"/v1/topics/{topic}/partitions/{partition}/offsets/{offset}")

    def lookup_timestamp(self, topic: str, partition: int, timestamp: int) -> dict[str, Any]:
        return self._object(f"/v1/topics/{topic}/partitions/{partition}/timestamps/{timestamp}")

    def fetch_raw(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int = 1 << 20,
        *,
        isolation: str = "read_uncommitted",
    ) -> tuple[bytes, dict[str, str]]:
        """Raw batches and the X-Rlm-* headers (tier, next offset, high watermark); with
        ``isolation="read_committed"`` only committed data batches (docs/transactions.md)."""
        params = _record_params(offset, max_bytes, isolation)
        resp = self._check(
            self._http.get(f"/v1/topics/{topic}/partitions/{partition}/records", params=params)
        )
        return resp.content, {k: v for k, v in resp.headers.items() if k.lower().startswith("x-rlm-")}

    def fetch_json(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int = 1 << 20,
        *,
        isolation: str = "read_uncommitted",
    ) -> dict[str, Any]:
        return self._object(
            f"/v1/topics/{topic}/partitions/{partition}/records",
            format="json",
            **_record_params(offset, max_bytes, isolation),
        )

    def offsets_for_times(
        self, timestamp: int, topics: list[str] | None = None, minus_ms: int = 0
    ) -> list[dict[str, Any]]:
        body = {"timestamp": timestamp, "topics": topics, "minus_ms": minus_ms}
        return self._rows(self._check(self._http.post("/v1/offsets-for-times", json=body)).json())

    def delete_records(self, topic: str, partition: int, before: int) -> dict[str, Any]:
        """rlm's DeleteRecords (docs/http-api.md §7): the answer's fields, low watermark first."""
        url = f"/v1/topics/{topic}/partitions/{partition}/delete-records"
        answer: dict[str, Any] = self._check(self._http.post(url, json={"before": before})).json()
        return answer

    def metrics(self) -> str:
        return self._check(self._http.get("/metrics")).text

    # -- streaming --------------------------------------------------------------------------------

    def iter_batches(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        request_bytes: int = 256 << 20,
        verify_crc: bool = False,
        isolation: str = "read_uncommitted",
    ) -> Iterator[StreamedBatch]:
        """Every batch from the one holding ``offset`` up to the visible end as the server sees it,
        over as many streaming requests as ``request_bytes`` (per request) needs.

        Errors of the first request of each stream are :class:`RlmHttpError` (416 out of range…);
        a stream that breaks mid-way raises :class:`StreamInterruptedError` after yielding every
        whole batch received. ``verify_crc`` re-checks each batch's CRC here (TCP and the server's
        upload check already cover the bytes). Closing the generator closes the connection's
        stream at once (the server stops reading). ``isolation="read_committed"``: only committed
        data batches, up to the last stable offset (docs/transactions.md).
        """
        while True:
            last: RecordBatch | None = None
            high_watermark: int | None = None
            for item in self._stream(topic, partition, offset, request_bytes, verify_crc, isolation):
                if isinstance(item, int):
                    high_watermark = item
                    continue
                last = item.batch
                yield item
            if last is None:
                return  # at the visible end
            offset = last.last_offset + 1
            if high_watermark is not None and offset >= high_watermark:
                return

    def iter_records(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        request_bytes: int = 256 << 20,
        isolation: str = "read_uncommitted",
    ) -> Iterator[Record]:
        """The records a consumer reading from ``offset`` sees: none below ``offset`` (the first
        batch may start before it), none of a control batch (transaction markers)."""
        for streamed in self.iter_batches(
            topic, partition, offset, request_bytes=request_bytes, isolation=isolation
        ):
            if streamed.batch.is_control:
                continue
            for record in streamed.records():
                if record.offset >= offset:
                    yield record

    def _stream(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int,
        verify_crc: bool,
        isolation: str = "read_uncommitted",
    ) -> Iterator[StreamedBatch | int]:
        """One streaming request: the high watermark header (an int) first, then the batches."""
        path = f"/v1/topics/{topic}/partitions/{partition}/records/stream"
        params = _record_params(offset, max_bytes, isolation)
        with self._http.stream("GET", path, params=params) as resp:
            if resp.status_code >= 400:
                resp.read()
                self._check(resp)
            hw = resp.headers.get("x-rlm-high-watermark")
            if hw is not None:
                yield int(hw)
            pending = bytearray()
            try:
                for piece in resp.iter_raw():
                    pending += piece
                    whole = _whole_entries(pending)
                    if not whole:
                        continue
                    chunk = bytes(pending[:whole])
                    del pending[:whole]
                    for batch in iter_batches(chunk, verify_crc=verify_crc):
                        yield StreamedBatch(batch, chunk)
            except httpx.TransportError as err:
                raise StreamInterruptedError(
                    f"stream of {topic}-{partition} from offset {offset} broke "
                    f"after the last whole batch: {err}"
                ) from err
            if pending:
                raise StreamInterruptedError(
                    f"stream of {topic}-{partition} from offset {offset} ended "
                    f"inside a batch ({len(pending)} bytes left over)"
                )


def _whole_entries(buf: bytearray) -> int:
    """How many leading bytes of ``buf`` are whole batches (offset, size, then size bytes)."""
    pos = 0
    while pos + _ENTRY_HEADER <= len(buf):
        size = int.from_bytes(buf[pos + 8 : pos + _ENTRY_HEADER], "big", signed=True)
        end = pos + _ENTRY_HEADER + max(size, 0)
        if end > len(buf):
            break
        pos = end
        if size <= 0:
            break  # corrupt: hand it to iter_batches, which names it
    return pos


def _record_params(offset: int, max_bytes: int, isolation: str) -> dict[str, Any]:
    """Query parameters of the record routes; ``isolation`` is sent only when it is not the
    server's default (read_uncommitted), so requests to older servers stay unchanged."""
    params: dict[str, Any] = {"offset": offset, "max_bytes": max_bytes}
    if isolation != "read_uncommitted":
        params["isolation"] = isolation
    return params
