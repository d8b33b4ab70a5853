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

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from rlm.testing.daemon import free_port
from rlm.testing.line_jvm import LineJvm

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
    _jvm: LineJvm = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._jvm = LineJvm("HDFS", self.log)

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
        return self._jvm.pid

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
        self._jvm.start(cmd, self.home / "hdfs.stderr")
        self._jvm.answer("ready", timeout)
        return self

    def command(self, line: str, timeout: float = 120.0) -> None:
        """Send one launcher command and wait for its ``ok`` (RuntimeError on ``error``)."""
        self._jvm.command(line, f"ok {line}", timeout)

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
        self._jvm.close(timeout)

    def __enter__(self) -> HdfsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
