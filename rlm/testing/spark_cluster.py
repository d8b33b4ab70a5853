"""A real Spark standalone cluster for tests and benches: one master and N workers as subprocesses.

They run from the pyspark distribution's own jars (``$SPARK_HOME/bin/spark-class``, ``SPARK_HOME`` =
the installed ``pyspark`` package), on loopback (``SPARK_LOCAL_IP=127.0.0.1``) with free ports, each
worker with its own ``SPARK_WORKER_DIR``: executors are other JVMs whose Python workers run in
their own working directories, as on a user's cluster (docs/spark-cluster.md). A session connects
with ``spark_session(cluster.master_url)``.

Ready means the master's JSON status page (``http://127.0.0.1:<webui>/json``) lists N ALIVE
workers. Processes are stopped by pid (SIGTERM, SIGKILL after a grace period); each one's output
is kept in ``<work_dir>/logs`` and quoted in failure messages.

The daemons get the caller's environment minus ``PYTHON*``/``PYSPARK*``/``SPARK*``/``AWS_*``
variables — executors must not see the driver's import path or credentials by accident — plus
``executor_env`` (e.g. the ``PYTHONPATH`` that stands for "rlm installed on the executors").
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Mapping
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import IO, Any

__all__ = ["SparkCluster", "free_ports", "spark_home"]

#: Environment variables a daemon does not inherit from the caller (see the module doc).
_WITHHELD = ("PYTHON", "PYSPARK", "SPARK", "AWS_")
_LOG_TAIL_BYTES = 4000


def spark_home() -> Path:
    """The installed pyspark package: its ``bin/spark-class`` and ``jars/`` are a Spark distribution."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports (the kernel's choice, all held open until chosen)."""
    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    return ports


def _signal_group(pgid: int, sig: int) -> None:
    with suppress(ProcessLookupError):  # the whole group has exited
        os.killpg(pgid, sig)


class SparkCluster:
    """A standalone master and ``workers`` workers on ``127.0.0.1`` (``cores`` each, ``memory``
    offered to executors, e.g. ``"1g"``); daemon JVM heaps are ``daemon_memory``."""

    def __init__(
        self,
        work_dir: Path,
        workers: int = 2,
        *,
        cores: int = 1,
        memory: str = "1g",
        daemon_memory: str = "256m",
        executor_env: Mapping[str, str] | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"a cluster needs at least one worker, got {workers}")
        self.work_dir = Path(work_dir).absolute()
        self.workers, self.cores, self.memory = workers, cores, memory
        self.home = spark_home()
        self.log_dir = self.work_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.conf_dir = self.work_dir / "conf"  # empty: no spark-defaults.conf of the host applies
        self.conf_dir.mkdir(exist_ok=True)
        ports = free_ports(2 + 2 * workers)
        self.master_port, self.webui_port = ports[0], ports[1]
        self._worker_ports = [(ports[2 + 2 * i], ports[3 + 2 * i]) for i in range(workers)]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(_WITHHELD)}
        self.env.update(
            {
                "SPARK_HOME": str(self.home),
                "SPARK_LOCAL_IP": "127.0.0.1",
                "SPARK_CONF_DIR": str(self.conf_dir),
                "SPARK_LOG_DIR": str(self.log_dir),
                "SPARK_DAEMON_MEMORY": daemon_memory,
                "SPARK_NO_DAEMONIZE": "1",
            }
        )
        self.env.update(executor_env or {})
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: dict[str, IO[bytes]] = {}

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.webui_port}"

    def worker_dir(self, i: int) -> Path:
        """Worker ``i``'s ``SPARK_WORKER_DIR``: executors run in ``<it>/<app id>/<executor id>``."""
        return self.work_dir / f"worker-{i}"

    def _spawn(self, name: str, args: list[str], cwd: Path, env: Mapping[str, str]) -> None:
        cwd.mkdir(parents=True, exist_ok=True)
        log = self._logs[name] = open(self.log_dir / f"{name}.out", "ab")  # noqa: SIM115 - closed in stop()
        self.procs[name] = subprocess.Popen(
            [str(self.home / "bin" / "spark-class"), *args],
            cwd=cwd,
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def start(self, timeout: float = 180.0) -> SparkCluster:
        """Start the master, then the workers; wait until the master lists them all ALIVE."""
        assert not self.procs, "already started"
        try:
            self._spawn(
                "master",
                [
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.master_port),
                    "--webui-port",
                    str(self.webui_port),
                ],
                self.work_dir / "master",
                self.env,
            )
            # Workers that find no master retry only after 5-15 s: start them once it answers.
            self._wait(timeout, "answer", lambda: self.state() is not None)
            for i, (port, webui) in enumerate(self._worker_ports):
                env = {**self.env, "SPARK_WORKER_DIR": str(self.worker_dir(i))}
                self._spawn(
                    f"worker-{i}",
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                        "--webui-port",
                        str(webui),
                        "--cores",
                        str(self.cores),
                        "--memory",
                        self.memory,
                        "--work-dir",
                        str(self.worker_dir(i)),
                        self.master_url,
                    ],
                    self.worker_dir(i),
                    env,
                )
            self._wait(
                timeout,
                f"list {self.workers} ALIVE workers",
                lambda: len(self.alive_workers()) >= self.workers,
            )
        except BaseException:
            self.stop()
            raise
        return self

    def _wait(self, timeout: float, what: str, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"spark {name} exited with {proc.returncode}\n{self.log_tail()}")
            try:
                if ready():
                    return
            except OSError:  # the master's UI is not up yet
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the spark master did not {what} within {timeout} s\n{self.log_tail()}")
            time.sleep(0.25)

    def state(self) -> dict[str, Any]:
        """The master's JSON status (workers, active/completed applications and their executors)."""
        with urllib.request.urlopen(self.ui_url + "/json", timeout=5) as resp:
            doc: dict[str, Any] = json.load(resp)
        return doc

    def alive_workers(self) -> list[dict[str, Any]]:
        return [w for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]

    def app_id(self, name: str) -> str:
        """The id of the most recently started application named ``name`` (active or completed)."""
        doc = self.state()
        apps = [a for a in doc.get("activeapps", []) + doc.get("completedapps", []) if a.get("name") == name]
        if not apps:
            raise LookupError(f"no application {name!r} on {self.master_url}")
        return str(max(apps, key=lambda a: a.get("starttime", 0))["id"])

    def executor_logs(self, app_id: str) -> dict[str, str]:
        """``{"worker-<i>/<executor id>": its stderr}`` for every executor of ``app_id``: where its
        tasks ran (executors log ``Finished task ...`` lines at INFO)."""
        out = {}
        for i in range(self.workers):
            for d in sorted((self.worker_dir(i) / app_id).glob("*")):
                stderr = d / "stderr"
                if stderr.is_file():
                    out[f"worker-{i}/{d.name}"] = stderr.read_text(errors="replace")
        return out

    def log_tail(self) -> str:
        """The end of every daemon's output (for failure messages)."""
        parts = []
        for path in sorted(self.log_dir.glob("*.out")):
            with open(path, "rb") as f:
                f.seek(max(0, path.stat().st_size - _LOG_TAIL_BYTES))
                parts.append(f"--- {path.name} ---\n{f.read().decode(errors='replace')}")
        return "\n".join(parts)

    def stop(self, grace: float = 15.0) -> None:
        """Workers first (their executors with them), then the master: SIGTERM, SIGKILL after
        ``grace`` seconds. Each process group is signalled (the JVM replaced spark-class)."""
        for name in sorted(self.procs, key=lambda n: n == "master"):
            proc = self.procs[name]
            # The group even when the daemon is gone: executors it launched may still run in it.
            _signal_group(proc.pid, signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace)
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        self.procs.clear()
        for log in self._logs.values():
            log.close()
        self._logs.clear()

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
