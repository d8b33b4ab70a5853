"""``rlm run`` stops on a SIGTERM whichever of its threads the kernel hands it to.

A process-directed signal goes to any thread that does not block it, and Python runs its handler
only when the main thread next executes bytecode: a main thread parked in one untimed wait never
saw a SIGTERM that landed on the HTTP or scheduler thread (a shutdown that hung until SIGKILL on a
busy host). Here the signal is aimed at one non-main thread with ``tgkill``, deterministically."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from pathlib import Path

import pytest

from rlm.cli.generate import generate_log_dir
from rlm.testing.configs import write_config
from rlm.testing.daemon import free_port, run_daemon

pytestmark = pytest.mark.integration

_SYS_TGKILL = 234  # x86_64; the test runs where the suite runs (Linux x86_64)


def _signal_a_worker_thread(pid: int, sig: int) -> int:
    """``tgkill`` the first live non-main thread of ``pid``; its thread id. A short-lived worker may
    end between the listing and the call (ESRCH): the next one is tried."""
    libc = ctypes.CDLL(None, use_errno=True)
    for tid in sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid):
        if libc.syscall(_SYS_TGKILL, pid, tid, sig) == 0:
            return tid
    raise AssertionError(f"no worker thread of {pid} took the signal")


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="tgkill's syscall number is x86_64's")
def test_sigterm_delivered_to_another_thread_stops_the_daemon(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    generate_log_dir(logs, [("sig", 1)], records=200)
    port = free_port()
    config = write_config(tmp_path / "rlm.toml", [logs], root=tmp_path / "store", server_port=port)
    with run_daemon(config, port, tmp_path / "rlm.log") as daemon:
        tid = _signal_a_worker_thread(daemon.proc.pid, signal.SIGTERM)
        try:
            # a handler that runs exits within a second; 20 s tolerates any busy host
            daemon.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"rlm run ignored a SIGTERM delivered to its thread {tid}")
        assert daemon.proc.returncode == 0
        assert "shutting down (SIGTERM)" in daemon.log_text()


def test_a_stop_before_the_daemon_runs_is_a_clean_stop(tmp_path: Path) -> None:
    """``rlm run`` takes SIGTERM before its API answers (``handle_signals``): a stop that lands while
    the API starts is remembered, and ``run_forever`` then returns at once, nothing scheduled —
    before, the default action killed the process (exit -15) when a supervisor stopped it the
    moment it answered on a busy host."""
    from rlm.cli.common import build_manager
    from rlm.config import load_settings
    from rlm.daemon.scheduler import TieringDaemon

    logs = tmp_path / "logs"
    generate_log_dir(logs, [("early", 1)], records=20)
    config = write_config(tmp_path / "rlm.toml", [logs], root=tmp_path / "store")
    daemon = TieringDaemon(build_manager(load_settings(config)))
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    try:
        daemon.handle_signals()
        assert signal.getsignal(signal.SIGTERM) == daemon.request_stop
        signal.raise_signal(signal.SIGTERM)  # the handler runs on this (the main) thread
        assert daemon.stopped.is_set()
        daemon.run_forever()  # returns: a test that hangs here fails by the suite's timeout
        assert not daemon.scheduler.running
        assert daemon.manager.shared.stop.is_set()
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
