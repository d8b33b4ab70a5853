"""S3 servers for the storage tests: moto's real HTTP server and npm s3rver, both on 127.0.0.1.

Neither mocks boto in-process: the backend talks HTTP to a real server. s3rver is installed with npm
into ``<repo>/.cache/s3rver`` on first use (skipped when ``node`` is absent).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.needs import unavailable

REPO = Path(__file__).resolve().parents[2]
S3RVER_DIR = REPO / ".cache" / "s3rver"
S3RVER_SCRIPT = S3RVER_DIR / "node_modules" / "s3rver" / "bin" / "s3rver.js"
BUCKET = "rlm-test"
FAKE_CREDS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def aws_env() -> Iterator[None]:
    """Dummy credentials and the region via the environment (never a real account)."""
    saved = {
        k: os.environ.get(k)
        for k in [*FAKE_CREDS, "AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"]
    }
    os.environ.update(FAKE_CREDS)
    os.environ.pop("AWS_PROFILE", None)
    os.environ["AWS_CONFIG_FILE"] = os.devnull
    os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def make_bucket(endpoint: str, bucket: str, **creds: Any) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, **creds)
    try:
        client.create_bucket(Bucket=bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    finally:
        client.close()


@pytest.fixture(scope="session")
def moto_endpoint(aws_env: None) -> Iterator[str]:
    """``http://127.0.0.1:<port>`` of a ThreadedMotoServer holding bucket ``rlm-test``."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    make_bucket(endpoint, BUCKET)
    yield endpoint
    server.stop()


def ensure_s3rver() -> tuple[str, Path]:
    """Return (node, s3rver.js), installing s3rver@3 with npm on first use; skip without node."""
    node = shutil.which("node")
    if node is None:
        unavailable("node is not installed: the s3rver tests need Node.js (npm s3rver@3)")
    if not S3RVER_SCRIPT.is_file():
        npm = shutil.which("npm")
        if npm is None:
            unavailable("npm is not installed: cannot install s3rver@3")
        S3RVER_DIR.mkdir(parents=True, exist_ok=True)
        # Two xdist workers may both need it first: one installs, the other waits on the lock and
        # finds it installed (two npm installs into one prefix can leave a broken tree).
        with open(S3RVER_DIR / ".install.lock", "wb") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            _npm_install_s3rver(npm)
    return node, S3RVER_SCRIPT


def _npm_install_s3rver(npm: str) -> None:
    """``npm install s3rver@3`` into :data:`S3RVER_DIR` unless already there; fails the test on error."""
    if not S3RVER_SCRIPT.is_file():
        proc = subprocess.run(
            [npm, "install", "--prefix", str(S3RVER_DIR), "--no-audit", "--no-fund", "s3rver@3"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if proc.returncode != 0 or not S3RVER_SCRIPT.is_file():
            pytest.fail(f"npm install s3rver@3 failed ({proc.returncode}): {proc.stderr[-2000:]}")


@pytest.fixture(scope="session")
def s3rver_endpoint(aws_env: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``http://127.0.0.1:<port>`` of an s3rver (credentials S3RVER/S3RVER) holding ``rlm-test``."""
    node, script = ensure_s3rver()
    data = tmp_path_factory.mktemp("s3rver")
    proc = subprocess.Popen(
        [
            node,
            str(script),
            "--directory",
            str(data),
            "--address",
            "127.0.0.1",
            "--port",
            "0",
            "--configure-bucket",
            BUCKET,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # s3rver 3 encrypts continuation tokens with a cipher OpenSSL 3 (Node >= 17) disables:
        # without the legacy provider every truncated listing fails with 500 InternalError.
        env={**os.environ, "NODE_OPTIONS": "--openssl-legacy-provider"},
    )
    assert proc.stdout is not None
    endpoint = None
    for _ in range(50):
        line = proc.stdout.readline()
        if not line:
            break
        m = re.search(r"listening on ([\d.]+):(\d+)", line)
        if m:
            endpoint = f"http://{m.group(1)}:{m.group(2)}"
            break
    if endpoint is None:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        pytest.fail("s3rver did not start")
    # keep draining its request log so the pipe never fills up
    drain = threading.Thread(target=lambda: [None for _ in proc.stdout or []], daemon=True)
    drain.start()
    yield endpoint
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    drain.join(timeout=10)  # EOF once the server is gone; then the pipe can be closed (no leak)
    proc.stdout.close()
