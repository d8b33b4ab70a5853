"""A live HDFS for tests and benches: Hadoop's MiniDFSCluster (a NameNode and DataNodes in one
JVM) on loopback, started and stopped by pid.

The runtime is the pinned jar set ``make hdfs`` copies from Maven Central into
``<repo>/.cache/hadoop-<version>/libs`` (``tools/hdfs/pom.xml``: the unshaded
``hadoop-minicluster``; the shaded one's WebHDFS is broken); ``$RLM_HDFS_LIBS`` names another
folder. Nothing is downloaded here: a missing runtime is one line saying what to run
(:func:`hdfs_runtime_problem`).

``tools/hdfs/MiniHdfs.java`` runs as a single-file source program on those jars (Hadoop ships no
main for MiniDFSCluster that can stop one DataNode or restart the NameNode). It prints ``ready``
once the NameNode is active and every DataNode reported, then takes one command per line on
stdin (:meth:`HdfsCluster.stop_datanode`, :meth:`~HdfsCluster.start_datanode`,
:meth:`~HdfsCluster.restart_namenode`) and answers ``ok`` or ``error``. Hadoop's own log goes to
``<home>/hdfs.log``, never to that channel. WebHDFS (``url``) and RPC (``rpc_url``) listen on
127.0.0.1 only; a DataNode's HTTP port is its own, and WebHDFS redirects reads and writes there.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from rlm.testing.daemon import free_port

__all__ = ["HADOOP_VERSION", "HdfsCluster", "hdfs_libs", "hdfs_runtime_problem"]

#: The pinned Hadoop version (tools/hdfs/pom.xml's ``hadoop.version``).
HADOOP_VERSION = "3.4.2"

_REPO = Path(__file__).resolve().parents[2]
_LAUNCHER = _REPO / "tools" / "hdfs" / "MiniHdfs.java"

_LOG4J = """\
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File={log}
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=%d %p %c: %m%n
"""


def _libs_dir() -> Path:
    env = os.environ.get("RLM_HDFS_LIBS")
    return Path(env) if env else _REPO / ".cache" / f"hadoop-{HADOOP_VERSION}" / "libs"


def hdfs_runtime_problem() -> str | None:
    """Why a MiniDFSCluster cannot run here (one line naming what to install), or None."""
    libs = _libs_dir()
    if shutil.which("java") is None:
        return "no java on PATH: HDFS needs Java 11 or later"
    if not (libs / ".complete").is_file() and not any(libs.glob("hadoop-hdfs-*-tests.jar")):
        return f"no HDFS runtime in {libs}: run `make hdfs` (Maven fetches it once)"
    return None


def hdfs_libs() -> Path:
    """The folder of Hadoop's runtime jars; RuntimeError with :func:`hdfs_runtime_problem`'s
    line when it cannot run."""
    problem = hdfs_runtime_problem()
    if problem is not None:
        raise RuntimeError(problem)
    return _libs_dir()


@dataclass
class HdfsCluster:
    """One NameNode and ``datanodes`` DataNodes under ``home`` (formatted on the first start; a
    later start on the same ``home`` keeps the data). Use as a context manager or call
    :meth:`start` / :meth:`close`; :meth:`close` kills whatever still runs."""

    home: Path
    datanodes: int = 1
    heap: str = "512m"
    rpc_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    _proc: subprocess.Popen[str] | None = field(default=None, init=False, repr=False)
    _lines: queue.Queue[str | None] = field(default_factory=queue.Queue, init=False, repr=False)
    _stderr: IO[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        """WebHDFS, as the ``hdfs`` backend's ``url`` option takes it."""
        return f"webhdfs://127.0.0.1:{self.http_port}"

    @property
    def rpc_url(self) -> str:
        """The NameNode's RPC address (``hdfs://``, for Hadoop's own clients: Spark, libhdfs)."""
        return f"hdfs://127.0.0.1:{self.rpc_port}"

    @property
    def log(self) -> Path:
        return self.home / "hdfs.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def start(self, timeout: float = 180.0) -> HdfsCluster:
        """Start the JVM and wait for ``ready`` (RuntimeError naming the log when it exits or
        does not get there within ``timeout`` seconds)."""
        libs = hdfs_libs()
        self.home.mkdir(parents=True, exist_ok=True)
        log4j = self.home / "log4j.properties"
        log4j.write_text(_LOG4J.format(log=self.log))
        cmd = [
            "java",
            f"-Xmx{self.heap}",
            "-XX:+UseSerialGC",
            "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{log4j}",
            f"-Dhadoop.log.dir={self.home}",
            "-cp",
            f"{libs}/*",
            str(_LAUNCHER),
            str(self.home / "cluster"),
            str(self.rpc_port),
            str(self.http_port),
            str(self.datanodes),
        ]
        self._lines = queue.Queue()
        self._stderr = open(self.home / "hdfs.stderr", "ab")  # noqa: SIM115 - closed by close()
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._pump, args=(self._proc.stdout,), daemon=True).start()
        self._answer("ready", timeout)
        return self

    def _pump(self, out: IO[str] | None) -> None:
        assert out is not None
        for line in out:
            self._lines.put(line.strip())
        self._lines.put(None)

    def _answer(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"HDFS: no {prefix!r} within {timeout:.0f} s; see {self.log}")
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                code = self._proc.wait() if self._proc is not None else None
                raise RuntimeError(f"HDFS exited with {code} before {prefix!r}; see {self.log}, hdfs.stderr")
            if line.startswith("error "):
                raise RuntimeError(f"HDFS: {line[6:]}")
            if line.startswith(prefix):
                return line

    def command(self, line: str, timeout: float = 120.0) -> None:
        """Send one launcher command and wait for its ``ok`` (RuntimeError on ``error``)."""
        if self._proc is None or self._proc.stdin is None or self._proc.poll() is not None:
            raise RuntimeError("HDFS is not running")
        self._proc.stdin.write(line + "\n")
        self._proc.stdin.flush()
        self._answer(f"ok {line}", timeout)

    def stop_datanode(self, index: int = 0) -> None:
        """Stop DataNode ``index`` (its blocks stay on disk)."""
        self.command(f"stop-datanode {index}")

    def start_datanode(self, index: int = 0) -> None:
        """Start a DataNode :meth:`stop_datanode` stopped, on its ports and storage."""
        self.command(f"start-datanode {index}")

    def restart_namenode(self) -> None:
        """Stop the NameNode and start it on the same ports and metadata (clients see refused
        connections, then safe mode until the DataNodes report)."""
        self.command("restart-namenode")

    def close(self, timeout: float = 30.0) -> None:
        """Shut down cleanly (``stop``), else SIGKILL the JVM by pid."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None and proc.stdin is not None:
            try:
                proc.stdin.write("stop\n")
                proc.stdin.flush()
                proc.wait(timeout)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        for pipe in (proc.stdin, proc.stdout, self._stderr):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()
        self._stderr = None

    def __enter__(self) -> HdfsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
