"""The Kafka-protocol listener of ``rlm run``: an asyncio TCP server (optionally TLS) in a thread of
its own (docs/kafka-listener.md).

Per connection, requests are answered one at a time in arrival order, as Kafka's broker does (a
client may pipeline; responses keep the order). The event loop only moves bytes: decoding a frame,
the handler and encoding the response run in a thread pool. The next request of a connection is
read only once its last response drained to the client, so a client that stops reading holds one
response — at most ``kafka.fetch_max_bytes`` of records + one batch (docs/kafka-listener.md §8).
A group request relayed to the cluster's coordinator (rlm/kafka/coordinator.py) is decoded in the
pool and then waits for its answer on the event loop, never holding a pool thread.
A frame declaring more than ``kafka.max_request_bytes`` — more than 512 KiB before SASL
authentication, when SASL is on — is refused from its size header, before its body is read; bytes
that are not a request, an API or version not served, a request before SASL authentication: the
connection is closed (Kafka closes it too). Connections beyond ``kafka.max_connections`` are closed
at accept. A connection silent for ``kafka.idle_timeout_ms`` — also in the middle of a frame, or
not reading its responses — is closed (rlm/kafka/idle_watch.py). One connection's failure is
logged and ends that one only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rlm.config.brokers import KafkaSettings
from rlm.config.tls import server_context
from rlm.errors import KafkaProtocolError, RlmError
from rlm.kafka.api import KafkaApi
from rlm.kafka.coordinator import RELAYED, Coordinator, RelaySession
from rlm.kafka.fetching import FetchPlan, FetchRead
from rlm.kafka.idle_watch import IdleWatch, Owing
from rlm.kafka.metrics import KafkaMetrics
from rlm.kafka.protocol import (
    API_VERSIONS_KEY,
    SERVED,
    Api,
    Frame,
    RequestFrame,
    api_versions_body,
    code_name,
    encode_fetch_response,
    encode_response,
    parse_request,
    peek_header,
    unsupported_api_versions,
)
from rlm.kafka.sasl import PlainUsers, authenticate, handshake
from rlm.kafka.steps import Conn as _Conn
from rlm.kafka.steps import Relay as _Relay
from rlm.kafka.steps import Rest as _Rest
from rlm.kafka.steps import Waiting as _Waiting
from rlm.nowait import without_waiting

__all__ = ["PRE_AUTH_MAX_BYTES", "KafkaListener", "split_listen"]

log = logging.getLogger(__name__)

_FETCH, _LIST_OFFSETS, _METADATA, _SASL_HANDSHAKE, _SASL_AUTHENTICATE = 1, 2, 3, 17, 36
_DELETE_RECORDS, _FIND_COORDINATOR = 21, 10
_BEFORE_AUTH = {API_VERSIONS_KEY, _SASL_HANDSHAKE, _SASL_AUTHENTICATE}
_POLL_S = 0.25  # a waiting Fetch re-checks offsets this often (the HW checkpoint moves every ~5 s)
#: Kafka's ``SaslServerAuthenticator`` MAX_RECEIVE_SIZE: the largest frame before authentication.
PRE_AUTH_MAX_BYTES = 524_288
_CHUNK = 1 << 20  # a response goes to the transport this much at a time: it copies what it queues


def split_listen(listen: str) -> tuple[str, int]:
    """``"host:port"`` (``[v6]:port``) → ``(host, port)``; the config validated the shape."""
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


def _tls(settings: KafkaSettings) -> ssl.SSLContext | None:
    """The listener's TLS context (rlm/config/tls.py, as the HTTP API's): errors name the key and path."""
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    return server_context(settings.tls_cert, settings.tls_key, section="kafka")


class KafkaListener:
    """The listener on ``kafka.listen`` (port 0 = any free port: see :attr:`port`)."""

    def __init__(
        self,
        api: KafkaApi,
        settings: KafkaSettings,
        *,
        threads: int = 8,
        metrics: KafkaMetrics | None = None,
        coordinator: Coordinator | None = None,
    ) -> None:
        """``coordinator``: relay consumer groups to the cluster (docs/kafka-listener.md §6); None:
        refuse them."""
        self.api = api
        self.coordinator = coordinator
        self.settings = settings
        self.metrics = metrics or KafkaMetrics()  # unregistered unless the daemon's are given
        self.metrics.fetch_sessions.set_function(lambda: len(api.sessions))
        self.metrics.fetch_session_partitions.set_function(api.sessions.partitions)
        host, port = split_listen(settings.listen)
        self._tls = _tls(settings)
        path = settings.sasl_plain_users_file
        self._users = PlainUsers(path) if path is not None else None
        self._sock = socket.socket(
            socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
        )  # IPPROTO_TCP: asyncio sets TCP_NODELAY then
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as err:
            self._sock.close()
            raise RlmError(f"kafka: cannot listen on {settings.listen}: {err.strerror}") from err
        self.host = host
        self.port: int = self._sock.getsockname()[1]
        self._idle_s = settings.idle_timeout_ms / 1000
        self._idle = IdleWatch(self._idle_s)
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="rlm-kafka")
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._run, name="rlm-kafka", daemon=True)
        self._handlers: dict[int, Callable[[Any, int], Any]] = {
            0: api.produce,
            2: api.list_offsets,
            10: api.find_coordinator,
            18: api.api_versions,
            22: api.init_producer_id,
            23: api.offset_for_leader_epoch,
            32: api.describe_configs,
            **{k: functools.partial(api.group_error, SERVED[k]) for k in (11, 12, 13, 14)},
        }

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def security_protocol(self) -> str:
        """Kafka's name for what a client must speak here."""
        tls = "SSL" if self._tls else "PLAINTEXT"
        return f"SASL_{tls}" if self._users else tls

    def start(self, wait_s: float = 10.0) -> KafkaListener:
        self._thread.start()
        if not self._ready.wait(wait_s) or not self._thread.is_alive():
            raise RlmError(f"kafka: the listener did not start on {self.address}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._sock.close()

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(
            self._serve,
            sock=self._sock,
            ssl=self._tls,
            ssl_handshake_timeout=self._idle_s if self._tls else None,
        )
        watch = asyncio.create_task(self._idle.run())
        self._ready.set()
        async with server:
            await self._stop.wait()
            watch.cancel()
            server.close()
            for writer in list(self._writers):
                writer.close()

    # -- one connection -----------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername") or ("?", 0)
        local = writer.get_extra_info("sockname") or (self.host, self.port)
        conn = _Conn(
            f"{peer[0]}:{peer[1]}",
            local[0],
            int(local[1]),
            (str(peer[0]), f"kafka:{peer[1]}"),
            Owing(asyncio.current_task()),
            authenticated=self._users is None,
        )
        if len(self._writers) >= self.settings.max_connections:
            log.info(
                "kafka: %s: closing the connection: %d open (kafka.max_connections)",
                conn.peer,
                len(self._writers),
            )
            self.metrics.closed.labels(reason="limit").inc()
            writer.close()
            return
        self._writers.add(writer)
        self._idle.add(conn.owing)
        self.metrics.connections.inc()
        reason = ""
        try:
            await self._loop_requests(conn, reader, writer)
            reason = "auth" if conn.auth_failed else ""
        except KafkaProtocolError as err:
            reason = "auth" if conn.auth_failed else "protocol"
            log.info("kafka: %s: closing the connection: %s", conn.peer, err)
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            log.debug("kafka: %s: connection closed by the client (or reset)", conn.peer)
        except asyncio.CancelledError:  # the idle watch, or the daemon stops (asyncio would log it)
            if conn.owing.expired:
                reason = "idle"
                log.info("kafka: %s: closing the connection: silent for kafka.idle_timeout_ms", conn.peer)
            else:
                log.debug("kafka: %s: connection closed at shutdown", conn.peer)
        except Exception:  # a handler bug: this connection ends, the listener and the others go on
            reason = "error"
            log.exception("kafka: %s: request failed; closing the connection", conn.peer)
        finally:
            self._idle.discard(conn.owing)
            self._writers.discard(writer)
            self.metrics.connections.dec()
            if reason:
                self.metrics.closed.labels(reason=reason).inc()
            if conn.relay is not None:
                conn.relay.close()
            writer.close()

    async def _loop_requests(
        self, conn: _Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """One request at a time: the next is not read before the last response drained to the
        client, so a client that stops reading holds one response and no more (backpressure).
        While it owes bytes (the next request, the rest of a frame, a drain) the idle watch may
        close it (rlm/kafka/idle_watch.py)."""
        assert self._loop is not None
        owing, clock = conn.owing, self._loop.time
        while True:
            owing.since = clock()
            try:
                head = await reader.readexactly(4)
            except asyncio.IncompleteReadError as err:
                if not err.partial:
                    return  # the client closed between requests
                raise
            owing.since = clock()  # the size header is progress: the frame gets a whole timeout
            frame = await reader.readexactly(self._frame_size(conn, head))
            owing.since = None  # answering is never idle
            await self._send(conn, writer, await self._answer(conn, frame))
            if conn.close_after:
                return

    def _frame_size(self, conn: _Conn, head: bytes) -> int:
        """The size a frame's header declares, checked before any of its body is read: at most
        ``kafka.max_request_bytes``, and :data:`PRE_AUTH_MAX_BYTES` before SASL authentication."""
        size = int.from_bytes(head, "big", signed=True)
        if not conn.authenticated and size > PRE_AUTH_MAX_BYTES:
            raise KafkaProtocolError(
                f"request frame of {size} bytes before SASL authentication (at most {PRE_AUTH_MAX_BYTES})"
            )
        if not 0 <= size <= self.settings.max_request_bytes:
            raise KafkaProtocolError(
                f"request frame of {size} bytes (kafka.max_request_bytes is "
                f"{self.settings.max_request_bytes})"
            )
        return size

    async def _send(self, conn: _Conn, writer: asyncio.StreamWriter, out: Frame) -> None:
        """Hand the response (its parts in order) to the transport a chunk at a time, draining in
        between (a wait the idle watch times): the transport queues a copy of what the socket does
        not take at once, so this keeps that copy to one chunk instead of a second whole response."""
        assert self._loop is not None
        for part in (out,) if isinstance(out, bytes | bytearray) else out:
            view = memoryview(part)
            for start in range(0, len(view), _CHUNK):
                writer.write(view[start : start + _CHUNK])
                if writer.transport.get_write_buffer_size():  # the socket did not take it all: wait
                    conn.owing.since = self._loop.time()
                    await writer.drain()
                    conn.owing.since = None

    async def _answer(self, conn: _Conn, frame: bytes) -> Frame:
        """The framed response. Decoding, the handler and encoding run in the thread pool — but a
        Fetch whose read needs nothing that waits, answered here (rlm/kafka/on_loop.py); only a
        Fetch that waits for ``min_bytes`` comes back here to wait."""
        assert self._loop is not None
        began = self._loop.time()
        here = self._on_loop(conn, frame)
        step: Frame | _Waiting | _Relay
        if here is None:
            step = await self._loop.run_in_executor(self._pool, self._step, conn, frame)
        elif isinstance(here, _Rest):
            step = await self._loop.run_in_executor(self._pool, here.run)
        else:
            step = here
        if isinstance(step, _Waiting):
            return await self._wait(conn, step, began)
        if isinstance(step, _Relay):
            assert self.coordinator is not None
            self.metrics.requests.labels(api=step.req.api.name).inc()
            conn.relay = conn.relay or RelaySession(self.coordinator)
            return await conn.relay.relay(step.req, step.frame)
        return step

    def _served(self) -> dict[int, Api]:
        """The APIs and versions answered: :data:`SERVED`, plus the relayed ones when delegating."""
        return SERVED if self.coordinator is None else self.coordinator.served(SERVED)

    def _step(self, conn: _Conn, frame: bytes) -> Frame | _Waiting | _Relay:
        """In the pool: decode, check authentication, handle, encode — or a Fetch to wait for."""
        if conn.raw_token_next:  # SaslHandshake v0: the next frame is the bare PLAIN token
            conn.raw_token_next = False
            user = self._users.authenticate(frame) if self._users is not None else None
            if user is None:
                conn.auth_failed = True
                raise KafkaProtocolError("SASL/PLAIN authentication failed")
            conn.authenticated, conn.user = True, user
            return b"\x00\x00\x00\x00"
        key, version, correlation_id = peek_header(frame)
        api = SERVED.get(key)
        if key == API_VERSIONS_KEY and api is not None and version > api.max_version:
            return unsupported_api_versions(correlation_id, self._served())
        if not conn.authenticated and key not in _BEFORE_AUTH:  # from the header, before decoding
            raise KafkaProtocolError(f"api_key {key} before SASL authentication")
        if self.coordinator is not None and key in RELAYED:
            return _Relay(parse_request(frame, self._served()), frame)
        req = parse_request(frame, self._served())
        if key == _FETCH:
            return self._fetch_step(conn, req, self.api.plan_fetch(req.body, req.version))
        return self._handled(conn, req)

    def _on_loop(self, conn: _Conn, frame: bytes) -> Frame | _Waiting | _Rest | None:
        """On the event loop: a Fetch answered (or to wait for) when its read waits for nothing
        (rlm/nowait.py), else what is left of it (:class:`_Rest`); a ListOffsets likewise, whole
        (:meth:`_offsets_on_loop`); None: not one to try here, the pool answers it whole
        (:meth:`_step`)."""
        if not conn.authenticated or conn.raw_token_next:
            return None
        key = peek_header(frame)[0]
        if key == _LIST_OFFSETS and conn.offsets_on_loop.due():
            return self._offsets_on_loop(conn, frame)
        if key != _FETCH or not conn.on_loop.due():
            return None
        req = parse_request(frame, self._served())
        plan = self.api.plan_fetch(req.body, req.version)
        sofar = self.api.begin_read(plan)
        try:
            with without_waiting():
                step = self._fetch_step(conn, req, plan, sofar)
        except BlockingIOError:  # the read stopped before the step that waits
            conn.on_loop.waited()
            self.metrics.fetch_on_loop.labels(outcome="handed").inc()
            return _Rest(functools.partial(self._fetch_step, conn, req, plan, sofar))
        conn.on_loop.answered()
        self.metrics.fetch_on_loop.labels(outcome="answered").inc()
        return step

    def _offsets_on_loop(self, conn: _Conn, frame: bytes) -> Frame | _Rest:
        """On the event loop: a ListOffsets answered whole when none of its partitions needs a
        step that waits (the latest, earliest and tiered offsets come from the listing,
        checkpoints and progress), else answered whole by a pool thread (a timestamp looked up in
        the store, a question to the broker about a log start that is not fresh)."""
        req = parse_request(frame, self._served())
        try:
            with without_waiting():
                body = self._dispatch(conn, req)
        except BlockingIOError:
            conn.offsets_on_loop.waited()
            self.metrics.list_offsets_on_loop.labels(outcome="handed").inc()
            return _Rest(functools.partial(self._handled, conn, req))
        conn.offsets_on_loop.answered()
        self.metrics.list_offsets_on_loop.labels(outcome="answered").inc()
        return self._encode(req, body)

    def _handled(self, conn: _Conn, req: RequestFrame) -> Frame:
        return self._encode(req, self._dispatch(conn, req))

    def _fetch_step(
        self, conn: _Conn, req: RequestFrame, plan: FetchPlan, sofar: FetchRead | None = None
    ) -> Frame | _Waiting:
        """A planned Fetch's read (going on with ``sofar``), then its answer or the wait."""
        read = self._fetch_pass(conn, req, plan, sofar)
        if not self._fetch_done(req, read):
            return _Waiting(req, plan, read)
        return self._render(req, plan, read)

    def _encode(self, req: RequestFrame, body: Any) -> Frame:
        self._observe(req, body)
        if req.api.key == _FETCH:  # the records go out as read, never copied into the frame
            return encode_fetch_response(req.api, req.version, req.correlation_id, body)
        return encode_response(req.api, req.version, req.correlation_id, body)

    def _observe(self, req: RequestFrame, body: Any) -> None:
        """Count the request; for Fetch and ListOffsets also the record bytes and partition errors."""
        api = req.api.name
        self.metrics.requests.labels(api=api).inc()
        if req.api.key not in (_FETCH, _LIST_OFFSETS):
            return
        for topic in body.responses if req.api.key == _FETCH else body.topics:
            for p in topic.partitions:
                if p.error_code:
                    self.metrics.partition_errors.labels(api=api, error=code_name(p.error_code)).inc()
                if req.api.key == _FETCH and p.records:
                    self.metrics.fetch_bytes.inc(len(p.records))

    def _dispatch(self, conn: _Conn, req: RequestFrame) -> Any:
        key, version = req.api.key, req.version
        if key == _SASL_HANDSHAKE:
            return handshake(self._users, conn, req.body, req.version)
        if key == _SASL_AUTHENTICATE:
            return authenticate(self._users, conn, req.body)
        if key == _METADATA:
            return self.api.metadata(req.body, version, conn.host, conn.port)
        if key == _DELETE_RECORDS:
            return self.api.delete_records(req.body, version, conn.user)
        if self.coordinator is not None and key == _FIND_COORDINATOR:
            return self.coordinator.find_coordinator(req.body, version, conn.host, conn.port)
        if self.coordinator is not None and key == API_VERSIONS_KEY:
            return api_versions_body(served=self._served())
        return self._handlers[key](req.body, version)

    # -- Fetch: answer at once, or wait for min_bytes -----------------------------------------

    def _fetch_pass(
        self, conn: _Conn, req: RequestFrame, plan: FetchPlan, sofar: FetchRead | None = None
    ) -> FetchRead:
        max_bytes, limit = req.body.max_bytes, self.settings.fetch_max_bytes
        return self.api.read_fetch(plan, max_bytes, conn.key, fetch_max_bytes=limit, sofar=sofar)

    def _fetch_done(self, req: RequestFrame, read: FetchRead) -> bool:
        """Whether to answer now: ``min_bytes`` of records, a partition failed, or no wait."""
        waits = min(max(req.body.max_wait_ms, 0), self.settings.max_wait_ms) > 0
        return read.errors or read.record_bytes >= req.body.min_bytes or not waits

    def _rendered(self, plan: FetchPlan, read: FetchRead) -> Any:
        """The Fetch answer that goes out (once per request: it opens or updates the session)."""
        body = self.api.render_fetch(plan, read)
        if plan.context.kind == "full" and body.session_id:
            self.metrics.fetch_sessions_opened.inc()
        return body

    def _render(self, req: RequestFrame, plan: FetchPlan, read: FetchRead) -> Frame:
        return self._encode(req, self._rendered(plan, read))

    async def _wait(self, conn: _Conn, waiting: _Waiting, began: float) -> Frame:
        """Wait up to ``max_wait_ms`` (capped by ``kafka.max_wait_ms``) for ``min_bytes``:
        every :data:`_POLL_S` the partitions' offsets are re-checked (no record read); records
        are read again only when a log start or visible end moved since the last read. At the end
        of the wait the last answer goes out as it is when nothing moved (docs/kafka-listener.md §5)."""
        assert self._loop is not None and self._stop is not None
        req, plan, read = waiting.req, waiting.plan, waiting.read
        seen = read.marks
        deadline = began + min(req.body.max_wait_ms, self.settings.max_wait_ms) / 1000
        pool, loop = self._pool, self._loop
        while (left := deadline - loop.time()) > 0 and not self._stop.is_set():
            with contextlib.suppress(TimeoutError):  # a shutdown wakes the wait at once
                await asyncio.wait_for(self._stop.wait(), min(left, _POLL_S))
            marks = await loop.run_in_executor(pool, plan.marks, self.api.readers, read.query)
            if marks == seen:
                continue
            read = await loop.run_in_executor(pool, self._fetch_pass, conn, req, plan)
            seen = read.marks  # what this read saw: a change after it is seen next
            if read.errors or read.record_bytes >= req.body.min_bytes:
                break
        return await loop.run_in_executor(pool, self._render, req, plan, read)
