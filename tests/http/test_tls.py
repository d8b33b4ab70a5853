"""[server] transport security in-process: config checks, the token file, TLS contexts built from
real PEM files (made by tests/http/certs.py), and an ApiServer speaking HTTPS to httpx/RlmClient.

The daemon end to end (`python -m rlm run` with HTTPS) is tests/cli/test_tls_daemon.py."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from rlm.config import ServerSettings, settings_from_mapping
from rlm.config.server import MAX_TOKEN_FILE_BYTES, bearer_token
from rlm.config.tls import client_context, server_context
from rlm.errors import ConfigError, RlmHttpError
from rlm.http.client import RlmClient
from rlm.http.server import ApiServer
from rlm.http.tls import serving_context
from rlm.testing.secrets import write_secret
from tests.http.certs import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _server(**keys: Any) -> ServerSettings:
    return settings_from_mapping(
        {"server": {k: str(v) if isinstance(v, Path) else v for k, v in keys.items()}}
    ).server


# -- config checks ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "needles"),
    [
        ({"tls_cert": "/x/cert.pem"}, ["server.tls_key is empty", "server.tls_cert is set"]),
        ({"tls_key": "/x/key.pem"}, ["server.tls_cert is empty", "server.tls_key is set"]),
        ({"token": "a", "token_file": "/x/t"}, ["server.token and server.token_file"]),
        ({"tls_ca": "/x/ca.pem"}, ["server.tls_ca is set but server.tls_cert is not"]),
    ],
)
def test_config_refuses_half_configured_security(keys: dict[str, str], needles: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        _server(**keys)
    for needle in needles:
        assert needle in str(info.value)


def test_repr_never_shows_the_token(tmp_path: Path) -> None:
    server = _server(token="hunter2-very-secret")
    assert "hunter2" not in repr(server) and "hunter2" not in str(server)


# -- token file ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "token"),
    [
        (b"tok-1\n", "tok-1"),
        (b"tok-2", "tok-2"),
        (b"tok-3\r\n", "tok-3"),
        ("t\u00f6k".encode(), "t\u00f6k"),
    ],
)
def test_token_file_one_trailing_newline_dropped(tmp_path: Path, content: bytes, token: str) -> None:
    path = write_secret(tmp_path / "token", content)
    assert bearer_token(_server(token_file=path)) == token


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"", "empty"),
        (b"\n", "empty"),
        (b"a\nb\n", "one line"),
        (b" a\n", "surrounding spaces"),
        (b"a\n\n", "one line"),
        (b"\xff\xfe", "not UTF-8"),
        (b"x" * (MAX_TOKEN_FILE_BYTES + 1), "larger than"),
    ],
)
def test_bad_token_file_is_one_error_naming_key_and_path(tmp_path: Path, content: bytes, needle: str) -> None:
    path = write_secret(tmp_path / "token", content)
    with pytest.raises(ConfigError) as info:
        bearer_token(_server(token_file=path))
    text = str(info.value)
    assert needle in text and "server.token_file" in text and str(path) in text
    assert "\n" not in text


def test_missing_token_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nope"
    with pytest.raises(ConfigError, match=r"server.token_file = '.*nope': cannot be read"):
        bearer_token(_server(token_file=path))


def test_token_comes_from_config_when_no_file() -> None:
    assert bearer_token(_server(token="abc")) == "abc"
    assert bearer_token(_server()) == ""


# -- TLS contexts -------------------------------------------------------------------------------


def test_server_context_errors_name_the_key_and_path(tmp_path: Path, pki: Pki) -> None:
    other = make_pki(tmp_path / "other")
    garbage = write_secret(tmp_path / "garbage.pem", "hello\n")
    no_cert, no_key = tmp_path / "missing.pem", tmp_path / "missing.key"
    cases: list[tuple[Path, Path, str]] = [
        (no_cert, pki.key, f"server.tls_cert = '{no_cert}': cannot be read: No such file"),
        (pki.cert, no_key, f"server.tls_key = '{no_key}': cannot be read: No such file"),
        (garbage, pki.key, f"server.tls_cert = '{garbage}': not a PEM certificate"),
        (pki.cert, garbage, f"server.tls_key = '{garbage}': not a PEM private key"),
        (pki.cert, other.key, "not a usable certificate and matching private key"),
        (pki.key, pki.key, "not a PEM certificate"),
    ]
    for cert, key, needle in cases:
        with pytest.raises(ConfigError) as info:
            server_context(cert, key)
        assert needle in str(info.value), (cert, key, str(info.value))


def test_kafka_listener_errors_name_its_own_keys(tmp_path: Path, pki: Pki) -> None:
    from rlm.config.brokers import KafkaSettings
    from rlm.kafka.server import _tls

    garbage = write_secret(tmp_path / "garbage.key", "nope\n")
    with pytest.raises(ConfigError, match=rf"config key kafka.tls_key = '{garbage}': not a PEM private key"):
        _tls(KafkaSettings(listen="127.0.0.1:0", tls_cert=pki.cert, tls_key=garbage))
    ctx = _tls(KafkaSettings(listen="127.0.0.1:0", tls_cert=pki.cert, tls_key=pki.key))
    assert ctx is not None and ctx.minimum_version == ssl.TLSVersion.TLSv1_2


def test_unreadable_key_names_the_path(tmp_path: Path, pki: Pki) -> None:
    # A directory: unreadable as a file even for root (a mode-000 file is not, to root).
    key = tmp_path / "keys.d"
    key.mkdir()
    with pytest.raises(ConfigError, match=r"server.tls_key = '.*keys.d': cannot be read: Is a directory"):
        server_context(pki.cert, key)
    with pytest.raises(ConfigError, match=r"server.token_file = '.*keys.d': cannot be read: Is a directory"):
        bearer_token(_server(token_file=key))


def test_encrypted_key_is_refused_without_a_prompt(tmp_path: Path, pki: Pki) -> None:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pki.key.read_bytes(), None)
    locked = write_secret(
        tmp_path / "enc.key",
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"pw"),
        ),
    )
    with pytest.raises(ConfigError, match="encrypted"):
        server_context(pki.cert, locked)


def test_contexts_floor_tls_1_2(pki: Pki) -> None:
    ctx = serving_context(_server(tls_cert=pki.cert, tls_key=pki.key))
    assert ctx is not None and ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert serving_context(_server()) is None
    client = client_context(pki.ca)
    assert client.verify_mode == ssl.CERT_REQUIRED and client.check_hostname
    with pytest.raises(ConfigError, match=r"server.tls_ca = .*not a PEM certificate bundle"):
        client_context(pki.key)


# -- HTTPS in-process ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def https(pki: Pki) -> Any:
    app = FastAPI()

    @app.get("/hello")
    async def hello() -> dict[str, str]:
        return {"hello": "tls"}

    server = ApiServer(app, "127.0.0.1", 0, tls=server_context(pki.cert, pki.key)).start()
    try:
        yield server
    finally:
        server.stop()


def test_https_answers_with_the_ca_and_refuses_without(https: ApiServer, pki: Pki) -> None:
    assert https.url.startswith("https://127.0.0.1:")
    resp = httpx.get(https.url + "/hello", verify=client_context(pki.ca), timeout=10)
    assert resp.json() == {"hello": "tls"}
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(https.url + "/hello", timeout=10)  # the system's CAs do not know the test CA
    other = make_pki(pki.ca.parent / "other", ca_name="another CA")
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(https.url + "/hello", verify=client_context(other.ca), timeout=10)


def test_plain_http_gets_no_answer(https: ApiServer) -> None:
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{https.port}/hello", timeout=10)
    # The raw socket: a plain request line gets no HTTP answer (the TLS layer closes or alerts).
    with socket.create_connection(("127.0.0.1", https.port), timeout=10) as sock:
        sock.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        try:
            while chunk := sock.recv(4096):
                got += chunk
        except ConnectionResetError:
            pass
    assert not got.startswith(b"HTTP/") and b"tls" not in got


def test_host_name_is_verified(tmp_path: Path, https: ApiServer) -> None:
    wrong = make_pki(tmp_path / "wrong", hosts=("db.example.com",))
    server = ApiServer(FastAPI(), "127.0.0.1", 0, tls=server_context(wrong.cert, wrong.key)).start()
    try:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(server.url + "/", verify=client_context(wrong.ca), timeout=10)
    finally:
        server.stop()


def test_client_for_server_uses_https_token_and_ca(https: ApiServer, pki: Pki, tmp_path: Path) -> None:
    token = write_secret(tmp_path / "token", "t0k\n")
    settings = _server(port=https.port, tls_cert=pki.cert, tls_key=pki.key, tls_ca=pki.ca, token_file=token)
    with RlmClient.for_server(settings) as client:
        assert client._http.base_url.scheme == "https"
        assert client._http.headers["authorization"] == "Bearer t0k"
        with pytest.raises(RlmHttpError) as info:  # a route this app does not have: a 404 over TLS
            client.healthz()
        assert info.value.status == 404
    wild = _server(host="0.0.0.0", port=https.port, tls_cert=pki.cert, tls_key=pki.key, tls_ca=pki.ca)
    with RlmClient.for_server(wild) as client:
        assert str(client._http.base_url).startswith(f"https://127.0.0.1:{https.port}")
