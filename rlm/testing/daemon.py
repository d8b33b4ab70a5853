"""`rlm run` as a real subprocess for tests and benches: start it, wait until its API answers
``/healthz``, stop it with SIGTERM (docs/cli.md). One helper instead of a copy per test module.

Its log goes to a file, never a pipe: a pipe nobody reads fills up and blocks the daemon.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Daemon", "clean_env", "free_port", "rlm_cli", "run_daemon", "stop", "wait_healthy"]


#: Where Linux takes the local ports of outgoing connections (``ip_local_port_range``).
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST_LISTEN_PORT = 10_000


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, picked at random *below* the kernel's ephemeral
    range when it can be read: every outgoing connection (a client, a broker's own links) takes
    its local port from that range, so a port chosen there and bound later — a restarted daemon
    keeps its port — could meanwhile be some connection's. Seen under 2 test workers: a restarted
    sidecar's "Address already in use". Else the OS picks one."""
    try:
        low = int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    rng = random.SystemRandom()
    for _ in range(64 if low > _LOWEST_LISTEN_PORT + 1000 else 0):
        port = rng.randrange(_LOWEST_LISTEN_PORT, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(extra: Mapping[str, str] | None = None, drop: tuple[str, ...] = ("RLM_",)) -> dict[str, str]:
    """This process's environment without variables starting with ``drop`` (the caller's ``RLM_*``
    would override the config under test), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(extra or {})
    return env


def rlm_cli(
    *args: str | Path | int,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m rlm ARGS`` as a real subprocess, text output captured, the caller's ``RLM_*``
    variables dropped (:func:`clean_env`) and ``env`` added; never raises on a non-zero exit."""
    return subprocess.run(
        [sys.executable, "-m", "rlm", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=clean_env(env),
        cwd=cwd,
    )


@dataclass
class Daemon:
    """A running ``rlm run``: its process, base URL and the file its stderr goes to."""

    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def alive(self) -> None:
        """Fail (AssertionError with the log's tail) when the daemon has exited."""
        assert self.proc.poll() is None, self.log_text()[-4000:]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def _answers(url: str, ca: Path | None) -> bool:
    context = ssl.create_default_context(cafile=str(ca)) if ca is not None else None
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=2, context=context) as resp:
            return int(resp.status) == 200
    except OSError:  # refused, reset, timed out, or an HTTP error status (HTTPError is an OSError)
        return False


def wait_healthy(
    daemon: Daemon, *, ca: Path | None = None, timeout: float = 60, ready: Callable[[], bool] | None = None
) -> None:
    """Poll until ``/healthz`` answers 200 (over TLS verified by ``ca`` for an https URL) and
    ``ready()`` holds; fail with the daemon's log if it exits or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not (_answers(daemon.url, ca) and (ready is None or ready())):
        daemon.alive()
        assert time.monotonic() < deadline, f"rlm run did not answer within {timeout} s: {daemon.log_text()}"
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """SIGTERM (a clean shutdown), then SIGKILL if it has not exited within ``timeout`` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


@contextmanager
def run_daemon(
    config: Path,
    port: int,
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    scheme: str = "http",
    ca: Path | None = None,
    wait: bool = True,
    ready: Callable[[], bool] | None = None,
) -> Iterator[Daemon]:
    """``python -m rlm run --config CONFIG`` serving on ``port``; yields once ``/healthz`` answers
    (and ``ready()`` holds) unless ``wait`` is False, and stops it on exit. ``env``: the whole
    environment (default :func:`clean_env`); stderr goes to ``log``, stdout is discarded."""
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlm", "run", "--config", str(config)],
            cwd=cwd,
            env=dict(env) if env is not None else clean_env(),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    daemon = Daemon(proc, f"{scheme}://127.0.0.1:{port}", log)
    try:
        if wait:
            wait_healthy(daemon, ca=ca, ready=ready)
        yield daemon
    finally:
        stop(proc)
