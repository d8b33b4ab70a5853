"""`rlm run` serving HTTPS (docs/security.md): a real daemon subprocess with a certificate made in
the test (tests/http/certs.py), its token read from a file; clients verify it with the test CA.

Checked: requests and httpx over TLS with verification on, plain HTTP refused, a wrong or missing
token 401 on the API and stream routes, the status page served, records read through
``RlmClient.for_server`` equal to the log's; a bad certificate or token file ends ``rlm run`` with
one line naming the key and path (exit 2) before it listens.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import requests

from rlm.cli.generate import generate_log_dir
from rlm.config import Settings, load_settings
from rlm.http.client import RlmClient
from rlm.testing.configs import write_config
from rlm.testing.daemon import free_port, rlm_cli, run_daemon
from rlm.testing.secrets import write_secret
from tests.http.certs import Pki, make_pki
from tests.lookup.helpers import BruteLog
from tests.tiering.helpers import REPO

TOKEN = "tls-daemon-token-8c1f"
TOPIC = "secure.t"


def _config(tmp: Path, logs: Path, port: int, pki: Pki, token_file: Path, **server: str) -> Path:
    cfg = write_config(tmp / "rlm.toml", [logs], root=tmp / "store", task_interval_ms=200)
    keys = {
        "host": "127.0.0.1",
        "port": port,
        "token_file": str(token_file),
        "tls_cert": str(pki.cert),
        "tls_key": str(pki.key),
        "tls_ca": str(pki.ca),
        **server,
    }
    lines = ["[server]"] + [f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {v}" for k, v in keys.items()]
    with cfg.open("a") as f:  # write_config without server_port ends with [tiering]
        f.write("\n".join(lines).replace("'", '"') + "\n")
    return cfg


@dataclass
class Daemon:
    url: str
    pki: Pki
    settings: Settings
    logs: Path
    stderr: Path


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("tls-daemon")
    logs = tmp / "logs"
    generate_log_dir(logs, [(TOPIC, 1)], seed=7, records=300, segment_bytes=8 * 1024)
    pki = make_pki(tmp / "pki")
    token_file = tmp / "token"
    write_secret(token_file, TOKEN + "\n")
    token_file.chmod(0o600)
    port = free_port()
    cfg = _config(tmp, logs, port, pki, token_file)
    stderr = tmp / "daemon.stderr"
    with run_daemon(cfg, port, stderr, cwd=REPO, scheme="https", ca=pki.ca) as running:
        yield Daemon(running.url, pki, load_settings(cfg, environ={}), logs, stderr)
    assert running.proc.returncode == 0, stderr.read_text()


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.integration
def test_requests_over_tls_with_the_ca(daemon: Daemon) -> None:
    ca = str(daemon.pki.ca)
    resp = requests.get(daemon.url + "/v1/partitions", headers=_auth(TOKEN), verify=ca, timeout=10)
    assert resp.status_code == 200 and [r["topic"] for r in resp.json()] == [TOPIC]
    with pytest.raises(requests.exceptions.SSLError):  # verification on: the system CAs refuse it
        requests.get(daemon.url + "/healthz", timeout=10)


@pytest.mark.integration
def test_plain_http_is_refused(daemon: Daemon) -> None:
    plain = daemon.url.replace("https://", "http://")
    with pytest.raises(requests.ConnectionError):
        requests.get(plain + "/healthz", timeout=10)
    with pytest.raises(httpx.TransportError):
        httpx.get(plain + "/v1/partitions", headers=_auth(TOKEN), timeout=10)


@pytest.mark.integration
@pytest.mark.parametrize(
    "path",
    [
        "/v1/partitions",
        "/metrics",
        "/v1/store",
        f"/v1/topics/{TOPIC}/partitions/0/records?offset=0",
        f"/v1/topics/{TOPIC}/partitions/0/records/stream?offset=0",
        f"/v1/topics/{TOPIC}/partitions/0/offsets/0",
    ],
)
def test_wrong_or_missing_token_is_401(daemon: Daemon, path: str) -> None:
    verify = str(daemon.pki.ca)
    for headers in ({}, _auth("wrong"), _auth(TOKEN + "x"), _auth(TOKEN[:-1]), {"Authorization": TOKEN}):
        resp = requests.get(daemon.url + path, headers=headers, verify=verify, timeout=10)
        assert resp.status_code == 401, (path, headers, resp.text)
        assert resp.json()["error"]["field"] == "authorization"
    assert requests.get(daemon.url + path, headers=_auth(TOKEN), verify=verify, timeout=10).status_code == 200


@pytest.mark.integration
def test_status_page_is_served_over_tls(daemon: Daemon) -> None:
    with httpx.Client(verify=ssl.create_default_context(cafile=daemon.pki.ca), timeout=10) as client:
        page = client.get(daemon.url + "/")
        assert page.status_code == 200 and "<html" in page.text.lower()
        assert client.get(daemon.url + "/static/status.js").status_code == 200


@pytest.mark.integration
def test_client_from_settings_reads_the_log_over_tls(daemon: Daemon) -> None:
    brute = BruteLog.scan(daemon.logs / f"{TOPIC}-0")
    with RlmClient.for_server(daemon.settings.server) as client:
        hw = next(r for r in client.partitions() if r["topic"] == TOPIC)["high_watermark"]
        got = [(r.offset, r.key, r.value) for r in client.iter_records(TOPIC, 0, 0)]
    want = [(r.offset, r.key, r.value) for r in brute.records if r.offset < hw]
    assert hw > 0 and got == want


@pytest.mark.integration
def test_the_token_is_never_logged(daemon: Daemon) -> None:
    requests.get(daemon.url + "/v1/partitions", headers=_auth("wrong"), verify=str(daemon.pki.ca), timeout=10)
    log = daemon.stderr.read_text()
    assert TOKEN not in log and "Traceback" not in log


@pytest.mark.integration
@pytest.mark.parametrize("case", ["mismatched key", "missing cert", "empty token file"])
def test_bad_tls_or_token_file_ends_run_with_one_line(tmp_path: Path, case: str) -> None:
    logs = tmp_path / "logs"
    generate_log_dir(logs, [(TOPIC, 1)], seed=1, records=20, segment_bytes=8 * 1024)
    pki, other = make_pki(tmp_path / "pki"), make_pki(tmp_path / "other")
    token_file = tmp_path / "token"
    write_secret(token_file, "" if case == "empty token file" else TOKEN)
    server = {
        "mismatched key": {"tls_key": str(other.key)},
        "missing cert": {"tls_cert": str(tmp_path / "nope.pem")},
    }.get(case, {})
    cfg = _config(tmp_path, logs, free_port(), pki, token_file, **server)
    proc = rlm_cli("run", "--config", cfg, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    needle = {
        "mismatched key": f"server.tls_key = '{other.key}'",
        "missing cert": f"server.tls_cert = '{tmp_path / 'nope.pem'}': cannot be read",
        "empty token file": f"server.token_file = '{token_file}': the file is empty",
    }[case]
    assert needle in lines[0]
