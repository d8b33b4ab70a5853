"""Progress bars of the long CLI commands: on a terminal (a real pty as stderr) they show, piped or
with --quiet they stay silent; stdout (JSON) is the same either way."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from rlm.cli.generate import generate_log_dir
from rlm.testing.configs import write_config
from tests.tiering.helpers import REPO


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLM_")}
    env["COLUMNS"] = "120"
    return env


def _run(args: list[str], *, tty: bool, timeout: float = 120) -> tuple[int, str, str]:
    """``python -m rlm ARGS`` with stderr on a pty (tty=True) or a pipe; → (rc, stdout, stderr)."""
    cmd = [sys.executable, "-m", "rlm", *args]
    if not tty:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, check=False, env=_env(), cwd=REPO
        )
        return proc.returncode, proc.stdout, proc.stderr
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # a 120x40 terminal
    try:
        child = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave, env=_env(), cwd=REPO
        )
    finally:
        os.close(slave)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if child.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        assert child.stdout is not None
        out = child.stdout.read().decode()
        rc = child.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(master)
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
    return rc, out, b"".join(chunks).decode(errors="replace")


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("progress")
    logs = tmp / "logs"
    generate_log_dir(logs, [("progress.t", 3)], seed=7, records=300, segment_bytes=8 * 1024)
    return write_config(tmp / "c.toml", [logs], root=tmp / "store")


@pytest.mark.integration
def test_run_once_bar_on_a_terminal_only(config: Path) -> None:
    rc, out, err = _run(["run", "--config", str(config), "--once"], tty=True)
    assert rc == 0, err
    summary = json.loads(out)
    assert summary["partitions"] == 3 and summary["segments_copied"] > 0
    assert "tiering" in err and "3/3" in err and "partition" in err, err
    assert f"copied {summary['segments_copied']} segments" in err, err

    rc, out, err = _run(["run", "--config", str(config), "--once"], tty=False)  # piped
    assert rc == 0 and json.loads(out)["partitions"] == 3
    assert "tiering" not in err and "\r" not in err, err
    rc, out, err = _run(["run", "--config", str(config), "--once", "--quiet"], tty=True)
    assert rc == 0 and json.loads(out)["partitions"] == 3
    assert "tiering" not in err and "\r" not in err, err


@pytest.mark.integration
@pytest.mark.parametrize("command", [["gc"], ["rebuild-index"]])
def test_gc_and_rebuild_index_bars(config: Path, command: list[str]) -> None:
    rc, out_tty, err = _run([*command, "--config", str(config)], tty=True)
    assert rc == 0, err
    assert command[0] in err and "3/3" in err and "partition" in err, err
    rc, out_quiet, err = _run([*command, "--config", str(config), "--quiet"], tty=True)
    assert rc == 0 and err.strip() == "", err
    rc, out_piped, err = _run([*command, "--config", str(config)], tty=False)
    assert rc == 0 and err.strip() == "", err
    assert out_tty.replace("\r\n", "\n") == out_piped == out_quiet
    if command == ["rebuild-index"]:
        rebuilt = json.loads(out_piped)
        assert sorted(rebuilt) == ["progress.t-0", "progress.t-1", "progress.t-2"]
