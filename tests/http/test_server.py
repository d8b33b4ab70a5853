"""ApiServer's listening socket: TCP as asyncio recognises it, so responses are not Nagle-delayed."""

from __future__ import annotations

import socket

from fastapi import FastAPI

from rlm.http.server import ApiServer


def test_listening_socket_is_tcp_so_asyncio_sets_nodelay() -> None:
    # asyncio (base_events._set_nodelay) sets TCP_NODELAY on accepted connections only when
    # sock.proto == IPPROTO_TCP; with proto 0 each request waited ~40 ms for a delayed ACK.
    server = ApiServer(FastAPI(), "127.0.0.1", 0)
    try:
        sock = server._sock
        want = (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        assert (sock.family, sock.type, sock.proto) == want
        assert server.port > 0
    finally:
        server._sock.close()
