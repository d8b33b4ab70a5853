"""Exposure rules and secret-file modes enforced at start (docs/security.md §6): a surface beyond
loopback without TLS and authentication, or SASL/PLAIN without TLS, is refused with one line naming
the key unless ``[server] allow_insecure_exposure`` (then a WARNING at every start); a secret file
group or others may access is refused naming key, path and mode. Real ``rlm run`` subprocesses for
the refusals and the override; nothing here listens beyond loopback (a refused daemon never binds)."""

from __future__ import annotations

import base64
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from rlm.cli.generate import generate_log_dir
from rlm.config import settings_from_mapping
from rlm.config.exposure import check_exposure, check_secret_file, is_loopback
from rlm.config.server import bearer_token
from rlm.config.tls import server_context
from rlm.errors import ConfigError
from rlm.kafka.sasl import PlainUsers
from rlm.testing.daemon import free_port, rlm_cli, run_daemon
from rlm.testing.secrets import write_secret
from rlm.testing.toml import toml_value
from tests.http.certs import make_pki


def _settings(server: dict[str, Any] | None = None, kafka: dict[str, Any] | None = None) -> Any:
    return settings_from_mapping({"server": server or {}, "kafka": kafka or {}})


def _config(tmp: Path, server: dict[str, Any], kafka: dict[str, Any] | None = None) -> Path:
    logs = tmp / "logs"
    generate_log_dir(logs, [("t", 1)], records=20)
    lines = [
        "[log]",
        f"dirs = {toml_value([str(logs)])}",
        "[remote]",
        'backend = "local"',
        "[remote.options]",
        f"root = {toml_value(str(tmp / 'store'))}",
        "[cluster]",
        'leadership = "always"',
        "[server]",
    ] + [f"{k} = {toml_value(v)}" for k, v in server.items()]
    if kafka:
        lines += ["[kafka]"] + [f"{k} = {toml_value(v)}" for k, v in kafka.items()]
    path = tmp / "rlm.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _one_error(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("rlm: error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    return errors[0]


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("rlm.example.com", False),
    ],
)
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_the_defaults_and_loopback_with_anything_start() -> None:
    check_exposure(_settings())
    check_exposure(_settings({"host": "::1"}, {"listen": "127.0.0.1:0"}))


@pytest.mark.parametrize(
    ("server", "kafka", "needles"),
    [
        ({"host": "0.0.0.0"}, {}, ["server.host = '0.0.0.0'", "server.tls_cert and server.token"]),
        ({"host": "0.0.0.0", "token": "t"}, {}, ["server.host", "without server.tls_cert"]),
        ({}, {"listen": "0.0.0.0:9092"}, ["kafka.listen = '0.0.0.0:9092'", "kafka.sasl_plain_users_file"]),
        (
            {},
            {"listen": "127.0.0.1:0", "sasl_plain_users_file": "/u"},
            ["kafka.sasl_plain_users_file", "in clear"],
        ),
    ],
    ids=["api-open", "api-no-tls", "listener-open", "plain-without-tls"],
)
def test_insecure_exposure_is_refused_naming_the_key(
    server: dict[str, Any], kafka: dict[str, Any], needles: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(ConfigError) as info:
        check_exposure(_settings(server, kafka))
    text = str(info.value)
    assert all(n in text for n in needles) and "server.allow_insecure_exposure" in text and "\n" not in text
    with caplog.at_level(logging.WARNING, logger="rlm"):
        check_exposure(_settings({**server, "allow_insecure_exposure": True}, kafka))
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "INSECURE EXPOSURE" in warned[0] and needles[0] in warned[0]


def test_rlm_run_refuses_an_open_api_before_listening(tmp_path: Path) -> None:
    config = _config(tmp_path, {"host": "0.0.0.0", "port": 0})
    done = rlm_cli("run", "--config", config, timeout=60)
    assert done.returncode == 2
    line = _one_error(done.stderr)
    assert "server.host = '0.0.0.0'" in line and "allow_insecure_exposure" in line
    assert "HTTP API on" not in done.stderr


def test_rlm_run_with_the_override_starts_and_warns(tmp_path: Path) -> None:
    users = write_secret(tmp_path / "users", "alice:pw\n")
    port = free_port()
    config = _config(
        tmp_path,
        {"port": port, "allow_insecure_exposure": True},
        {"listen": "127.0.0.1:0", "sasl_plain_users_file": str(users)},  # PLAIN without TLS, on loopback
    )
    with run_daemon(config, port, tmp_path / "rlm.log") as daemon:
        log = daemon.log_text()
    assert "INSECURE EXPOSURE" in log and "kafka.sasl_plain_users_file" in log and "WARNING" in log


def _key_file(path: Path) -> Path:
    return write_secret(path, base64.b64encode(os.urandom(32)).decode() + "\n")


def test_secret_files_open_to_others_are_refused_naming_key_path_and_mode(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    token, users, key = (
        write_secret(tmp_path / "token", "t0k\n"),
        write_secret(tmp_path / "users", "a:b\n"),
        _key_file(tmp_path / "k1"),
    )
    readers = {
        "server.token_file": (token, lambda: bearer_token(_settings({"token_file": str(token)}).server)),
        "server.tls_key": (pki.key, lambda: server_context(pki.cert, pki.key)),
        "kafka.tls_key": (pki.key, lambda: server_context(pki.cert, pki.key, section="kafka")),
        "kafka.sasl_plain_users_file": (users, lambda: PlainUsers(users)),
        "remote.encryption.key_files.k1": (
            key,
            lambda: settings_from_mapping(
                {"remote": {"encryption": {"key_files": {"k1": str(key)}, "active_key": "k1"}}}
            ),
        ),
    }
    for name, (path, read) in readers.items():
        read()  # 0600: accepted
        for mode in (0o644, 0o640, 0o604, 0o620):
            path.chmod(mode)
            with pytest.raises(ConfigError) as info:
                read()
            text = str(info.value)
            assert f"config key {name} = '{path}'" in text and f"mode {mode:04o}" in text, text
        path.chmod(0o400)
        read()  # 0400: accepted
        path.chmod(0o600)


def test_rlm_run_refuses_a_world_readable_token_file(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t0k\n")
    token.chmod(0o644)
    config = _config(tmp_path, {"port": 0, "token_file": str(token)})
    done = rlm_cli("run", "--config", config, timeout=60)
    assert done.returncode == 2
    line = _one_error(done.stderr)
    assert f"server.token_file = '{token}'" in line and "mode 0644" in line


def test_a_one_shot_command_refuses_a_shared_key_file(tmp_path: Path) -> None:
    key = _key_file(tmp_path / "k1")
    key.chmod(0o640)
    config = _config(tmp_path, {"port": 0})
    with config.open("a") as f:
        f.write(f'[remote.encryption]\nactive_key = "k1"\nkey_files = {{ k1 = {toml_value(str(key))} }}\n')
    done = rlm_cli("status", "--config", config, timeout=60)
    assert done.returncode == 2
    assert "remote.encryption.key_files.k1" in _one_error(done.stderr) and "mode 0640" in done.stderr


def test_a_directory_or_missing_file_is_left_to_its_reader(tmp_path: Path) -> None:
    check_secret_file("server.token_file", tmp_path)  # a directory: the reader names the error
    check_secret_file("server.token_file", tmp_path / "missing")
