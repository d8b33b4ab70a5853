"""``[kafka]``: the keys are validated once, bad files fail ``rlm run`` before anything starts, and
the SASL/PLAIN users file is parsed as documented (docs/kafka-listener.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlm.cli.generate import generate_log_dir
from rlm.config import settings_from_mapping
from rlm.errors import ConfigError
from rlm.kafka.sasl import PlainUsers
from rlm.kafka.server import split_listen
from rlm.testing.secrets import write_secret
from tests.kafka.helpers import rlm, toml_config

BASE = {"log": {"dirs": ["/tmp"]}, "remote": {"backend": "memory"}}


def _kafka(**keys: object) -> object:
    return settings_from_mapping({**BASE, "kafka": keys}).kafka


def test_defaults_are_off_and_kafkas() -> None:
    k = _kafka()
    assert k.listen == "" and k.max_request_bytes == 104_857_600 and k.idle_timeout_ms == 600_000
    assert k.fetch_max_bytes == 57_671_680 and k.max_connections == 1000  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [
        ("fetch_max_bytes", 1023, r"\[1024, 2147483647\]"),
        ("fetch_max_bytes", 2**31, r"\[1024, 2147483647\]"),
        ("max_connections", 0, r"\[1, 1000000\]"),
    ],
)
def test_bound_keys_are_validated(name: str, value: int, allowed: str) -> None:
    with pytest.raises(ConfigError, match=rf"kafka\.{name}.*{value}.*{allowed}"):
        _kafka(**{name: value})


@pytest.mark.parametrize("listen", ["127.0.0.1", "host:", ":9093", "h:99999", "h:-1", 9093, "h:port"])
def test_listen_must_be_host_and_port(listen: object) -> None:
    with pytest.raises(ConfigError, match=r"kafka\.listen"):
        _kafka(listen=listen)


def test_listen_forms() -> None:
    assert split_listen(_kafka(listen="0.0.0.0:0").listen) == ("0.0.0.0", 0)  # type: ignore[attr-defined]
    assert split_listen(_kafka(listen="[::1]:9093").listen) == ("::1", 9093)  # type: ignore[attr-defined]


def test_tls_needs_both_files() -> None:
    with pytest.raises(ConfigError, match=r"kafka\.tls_key"):
        _kafka(tls_cert="/etc/c.pem")
    with pytest.raises(ConfigError, match=r"kafka\.tls_cert"):
        _kafka(tls_key="/etc/k.pem")


def test_users_file_lines(tmp_path: Path) -> None:
    path = tmp_path / "users"
    write_secret(path, "# comment\n\nalice:pa:ss\nbob:\n")
    users = PlainUsers(path)
    assert users.authenticate(b"\x00alice\x00pa:ss") == "alice"
    assert users.authenticate(b"alice\x00alice\x00pa:ss") == "alice"
    assert users.authenticate(b"\x00bob\x00") == "bob"  # an empty password is a password
    for bad in (
        b"\x00alice\x00pa",
        b"\x00carol\x00pa:ss",
        b"bob\x00alice\x00pa:ss",
        b"alice\x00pa:ss",
        b"\x00\xff\x00x",
    ):
        assert users.authenticate(bad) is None, bad
    path.write_text("alice:new\n")  # rotated without a restart
    assert users.authenticate(b"\x00alice\x00new") == "alice"
    path.write_text("no colon here\n")
    with pytest.raises(ConfigError, match=r"line 1"):
        PlainUsers(path)


def test_rlm_run_refuses_a_bad_users_file_before_starting(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    generate_log_dir(logs, [("t", 1)], records=50)
    users = tmp_path / "users"
    write_secret(users, "alice\n")
    config = toml_config(
        tmp_path / "c.toml",
        [logs],
        tmp_path / "store",
        {"listen": "127.0.0.1:0", "sasl_plain_users_file": str(users)},
    )
    proc = rlm("run", "--config", config, timeout=60)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("rlm: error:")]
    assert len(errors) == 1 and str(users) in errors[0] and "line 1" in errors[0]
    assert "Traceback" not in proc.stderr and "HTTP API on" not in proc.stderr
