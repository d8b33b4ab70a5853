"""One `rlm run` per state dir: real daemon subprocesses, a second one refused with one line while
the first keeps running; read-only commands work beside it; SIGKILL releases the lock."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from rlm.cli.generate import generate_log_dir
from rlm.daemon.lock import LOCK_NAME
from rlm.testing.configs import write_config
from rlm.testing.daemon import free_port, rlm_cli, run_daemon, wait_healthy
from rlm.tiering.local.state import default_state_dir
from tests.tiering.helpers import REPO


@pytest.mark.integration
def test_second_run_on_the_same_state_dir_exits_with_one_line(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    generate_log_dir(logs, [("lock.t", 1)], seed=2, records=200, segment_bytes=8 * 1024)
    store, port = tmp_path / "store", free_port()
    first_cfg = write_config(tmp_path / "a.toml", [logs], root=store, server_port=port, task_interval_ms=200)
    # Another config file naming the same state dir explicitly (and another port): still one owner.
    other_cfg = write_config(
        tmp_path / "b.toml",
        [logs],
        root=store,
        server_port=free_port(),
        state_dir=str(default_state_dir(logs)),
    )
    with run_daemon(first_cfg, port, tmp_path / "daemon.stderr", cwd=REPO) as running:
        daemon = running.proc
        lock_file = default_state_dir(logs) / LOCK_NAME
        assert json.loads(lock_file.read_text())["pid"] == daemon.pid
        for args in (
            ("run", "--config", first_cfg),
            ("run", "--config", other_cfg),
            ("run", "--config", first_cfg, "--once"),
        ):
            proc = rlm_cli(*args, timeout=60)
            assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
            lines = [line for line in proc.stderr.splitlines() if line.strip()]
            assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
            assert lines[0].startswith("rlm: error: ")
            assert f"another rlm run (pid {daemon.pid})" in lines[0]
            assert str(default_state_dir(logs)) in lines[0]
            assert proc.stdout == ""
        # The first daemon is untouched and still serving; read-only commands run beside it.
        assert daemon.poll() is None
        wait_healthy(running, timeout=5)
        status = rlm_cli("status", "--config", first_cfg)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)[0]["topic"] == "lock.t"
        # SIGKILL: no cleanup runs, yet the kernel drops the flock and a new run may start.
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(timeout=30)
        once = rlm_cli("run", "--config", other_cfg, "--once")
        assert once.returncode == 0, once.stderr
        assert json.loads(once.stdout)["partitions"] == 1


def test_lock_is_per_state_dir_in_process(tmp_path: Path) -> None:
    from rlm.daemon.lock import StateDirLock
    from rlm.errors import StateDirLockedError

    a, b = tmp_path / "a", tmp_path / "b"
    with StateDirLock([a, b]):
        with pytest.raises(StateDirLockedError, match=f"pid {os.getpid()}"):
            StateDirLock([b]).acquire()
        with StateDirLock([tmp_path / "c"]):  # another state dir is independent
            pass
    with StateDirLock([b]):  # released on exit
        pass
