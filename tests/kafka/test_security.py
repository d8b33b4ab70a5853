"""TLS and SASL/PLAIN on the Kafka listener, with kafka-python (security_protocol SSL and
SASL_PLAINTEXT) against a real ``rlm run``; the records compared with kafka-python's decode of the
segments."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from rlm.cli.generate import generate_log_dir
from rlm.testing.secrets import write_secret
from tests.kafka.helpers import Daemon, Expected, call, closed_by_server, connect, oracle, toml_config

pytestmark = [
    pytest.mark.integration,
    # outside CI a machine without openssl skips; in CI a missing openssl fails (tests/needs.py)
    pytest.mark.skipif(
        shutil.which("openssl") is None and not os.environ.get("CI"), reason="needs openssl for a test cert"
    ),
]


def _served(tmp: Path, kafka: dict[str, Any]) -> tuple[Daemon, Expected]:
    logs = tmp / "logs"
    generate_log_dir(logs, [("sec", 1)], seed=3, records=400, segment_bytes=8 * 1024)
    expected = oracle(logs / "sec-0", "sec", 0)
    config = toml_config(tmp / "rlm.toml", [logs], tmp / "store", {"listen": "127.0.0.1:0", **kafka})
    return Daemon(config), expected


def _read_all(consumer: KafkaConsumer, want: int) -> list[tuple[int, bytes | None]]:
    tp = TopicPartition("sec", 0)
    consumer.assign([tp])
    consumer.seek_to_beginning()
    got: list[tuple[int, bytes | None]] = []
    deadline = time.monotonic() + 60
    while len(got) < want and time.monotonic() < deadline:
        for msgs in consumer.poll(timeout_ms=1000).values():
            got += [(m.offset, m.value) for m in msgs]
    return got


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-keyout",
            str(d / "key.pem"),
            "-out",
            str(d / "cert.pem"),
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )
    return d / "cert.pem", d / "key.pem"


@pytest.fixture
def tls_daemon(tmp_path: Path, cert: tuple[Path, Path]) -> Iterator[tuple[Daemon, Expected, Path]]:
    daemon, expected = _served(tmp_path, {"tls_cert": str(cert[0]), "tls_key": str(cert[1])})
    try:
        yield daemon, expected, cert[0]
    finally:
        daemon.stop()


def test_tls_consumer_reads_everything(tls_daemon: tuple[Daemon, Expected, Path]) -> None:
    daemon, expected, ca = tls_daemon
    consumer = KafkaConsumer(
        bootstrap_servers=daemon.bootstrap,
        security_protocol="SSL",
        ssl_cafile=str(ca),
        group_id=None,
        enable_auto_commit=False,
    )
    try:
        got = _read_all(consumer, len(expected.rows))
    finally:
        consumer.close()
    assert got == [(r[0], r[3]) for r in expected.rows]
    # A plaintext client speaking to the TLS port: its connection fails, the listener goes on.
    sock = connect(daemon.port)
    try:
        req = ApiVersionsRequest()
        req.with_header(correlation_id=1, client_id="plain")
        sock.sendall(bytes(req.encode(version=0, header=True, framed=True)))
        assert closed_by_server(sock)
    finally:
        sock.close()
    assert daemon.alive()


@pytest.fixture
def sasl_daemon(tmp_path: Path) -> Iterator[tuple[Daemon, Expected]]:
    users = tmp_path / "users"
    write_secret(users, "# user:password\nalice:s3cret:with-colon\nbob:hunter2\n")
    daemon, expected = _served(tmp_path, {"sasl_plain_users_file": str(users)})
    try:
        yield daemon, expected
    finally:
        daemon.stop()


def _sasl_consumer(daemon: Daemon, user: str, password: str) -> KafkaConsumer:
    return KafkaConsumer(
        bootstrap_servers=daemon.bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username=user,
        sasl_plain_password=password,
        group_id=None,
        enable_auto_commit=False,
        bootstrap_timeout_ms=5000,
    )


def test_sasl_plain_authenticates_and_refuses(sasl_daemon: tuple[Daemon, Expected]) -> None:
    daemon, expected = sasl_daemon
    with pytest.raises(KafkaError):
        _sasl_consumer(daemon, "alice", "wrong").topics()
    with pytest.raises(KafkaError):
        _sasl_consumer(daemon, "mallory", "s3cret:with-colon").topics()
    assert "SASL/PLAIN authentication failed" in daemon.log.read_text()
    for token, code in (
        (b"\0alice\0nope", 58),
        (b"bob\0alice\0s3cret:with-colon", 58),
        (b"\0alice\0s3cret:with-colon", 0),
    ):
        sock = connect(daemon.port)
        try:
            hs = call(
                daemon.port, SaslHandshakeRequest(mechanism="PLAIN"), 1, SaslHandshakeResponse, sock=sock
            )
            assert (hs.error_code, hs.mechanisms) == (0, ["PLAIN"])
            auth = call(
                daemon.port, SaslAuthenticateRequest(auth_bytes=token), 2, SaslAuthenticateResponse, sock=sock
            )
            assert auth.error_code == code, token
            if code:  # answered, then closed (as Kafka does)
                assert closed_by_server(sock)
            else:
                meta = call(daemon.port, MetadataRequest(topics=None), 1, MetadataResponse, sock=sock)
                assert [t.name for t in meta.topics] == ["sec"]
        finally:
            sock.close()
    # Unauthenticated, only ApiVersions (and the SASL requests) are answered; anything else closes.
    sock = connect(daemon.port)
    try:
        assert call(daemon.port, ApiVersionsRequest(), 0, ApiVersionsResponse, sock=sock).error_code == 0
        assert call(daemon.port, MetadataRequest(topics=None), 1, MetadataResponse, sock=sock) is None
    finally:
        sock.close()
    consumer = _sasl_consumer(daemon, "alice", "s3cret:with-colon")
    try:
        assert "sec" in consumer.topics()
        got = _read_all(consumer, len(expected.rows))
    finally:
        consumer.close()
    assert got == [(r[0], r[3]) for r in expected.rows]
    assert daemon.alive()
