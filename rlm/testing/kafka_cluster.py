"""A live Apache Kafka for tests, benches and demos: real KRaft brokers as subprocesses.

The runtime is the pinned jar set ``make kafka`` copies from Maven Central into
``<repo>/.cache/kafka-<version>/libs`` (``tools/kafka/pom.xml``); ``$RLM_KAFKA_LIBS`` names another
folder. Nothing is downloaded here: a missing runtime is one line saying what to run
(:func:`kafka_runtime_problem`).

Each node is a combined ``broker,controller`` JVM (``kafka.Kafka server.properties``) with its own
log dir, listening on loopback only; its metadata log ``__cluster_metadata-0`` lives in that log dir
(as ``metadata.log.dir`` defaults), which is where rlm looks for it. A node can be stopped
(SIGTERM: Kafka's controlled shutdown), killed (SIGKILL), frozen (SIGSTOP) and started again on
the same dir and ports, so leadership really moves and an unclean election can be forced.
A node is ready when its log says ``Kafka Server started``; every wait is bounded by a condition
and a generous deadline, never a guess of how fast the machine is.

Settings are Kafka's defaults except where a test needs a short clock (retention checks every
second, deleted files unlinked after one second, brokers fenced after a few seconds) or a small
footprint on 2 cores (two network and I/O threads, a 2 MiB cleaner buffer, a 384 MiB heap).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rlm.testing.daemon import free_port

__all__ = [
    "KAFKA_VERSION",
    "KafkaCluster",
    "KafkaNode",
    "kafka_libs",
    "kafka_runtime_problem",
    "kafka_tool_command",
    "run_kafka_tool",
    "wait_until",
]

#: The pinned Kafka version (tools/kafka/pom.xml's ``kafka.version``).
KAFKA_VERSION = "4.1.1"

_REPO = Path(__file__).resolve().parents[2]

READY_LINE = b"Kafka Server started"


def _libs_dir() -> Path:
    env = os.environ.get("RLM_KAFKA_LIBS")
    return Path(env) if env else _REPO / ".cache" / f"kafka-{KAFKA_VERSION}" / "libs"


def kafka_runtime_problem() -> str | None:
    """Why a Kafka node cannot run here (one line naming what to install), or None."""
    libs = _libs_dir()
    if shutil.which("java") is None:
        return "no java on PATH: Kafka needs Java 17 or later"
    if not (libs / ".complete").is_file() and not any(libs.glob("kafka_2.13-*.jar")):
        return f"no Kafka runtime in {libs}: run `make kafka` (Maven fetches it once)"
    return None


def kafka_libs() -> Path:
    """The folder of Kafka's runtime jars: ``$RLM_KAFKA_LIBS`` or the one ``make kafka`` fills;
    RuntimeError with :func:`kafka_runtime_problem`'s line when it cannot run."""
    problem = kafka_runtime_problem()
    if problem is not None:
        raise RuntimeError(problem)
    return _libs_dir()


def _java(libs: Path, main: str, *args: str, heap: str, log4j: Path | None) -> list[str]:
    cmd = ["java", f"-Xmx{heap}", "-XX:+UseSerialGC", "-Djava.awt.headless=true"]
    if log4j is not None:
        cmd.append(f"-Dlog4j2.configurationFile={log4j}")
    return [*cmd, "-cp", f"{libs}/*", main, *args]


def kafka_tool_command(main: str, *args: str) -> list[str]:
    """The command line of one of Kafka's tools on the pinned runtime (for a caller that runs it
    itself, e.g. to kill it midway)."""
    return _java(kafka_libs(), main, *args, heap="256m", log4j=None)


def run_kafka_tool(main: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """One of Kafka's command-line tools (``kafka.tools.DumpLogSegments``,
    ``kafka.tools.StorageTool``, ...) on the pinned runtime; output captured, never raises on exit."""
    cmd = kafka_tool_command(main, *args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def wait_until(condition: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll ``condition`` until it returns something truthy (returned); ``TimeoutError`` naming
    ``what`` after ``timeout`` seconds. Exceptions from ``condition`` count as "not yet"."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            got = condition()
            if got:
                return got
        except Exception as err:  # a broker still starting answers with errors
            last = err
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s (last error: {last!r})")
        time.sleep(interval)


_LOG4J = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
logger.request.name = kafka.request.logger
logger.request.level = warn
"""


@dataclass
class KafkaNode:
    """One combined broker+controller. ``log_dir`` is its only log dir (and metadata log dir)."""

    node_id: int
    home: Path
    broker_port: int
    controller_port: int
    proc: subprocess.Popen[bytes] | None = None
    _out: IO[bytes] | None = None

    @property
    def log_dir(self) -> Path:
        return self.home / "kafka-logs"

    @property
    def server_log(self) -> Path:
        return self.home / "server.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.broker_port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _signal(self, sig: signal.Signals) -> None:
        if self.running:
            assert self.proc is not None
            os.killpg(self.proc.pid, sig)

    def start(self, libs: Path, heap: str) -> None:
        """Start the JVM (on the same dir and ports as before); returns at once, see :meth:`wait_ready`."""
        assert not self.running, f"node {self.node_id} is running"
        self._ready_from = self.server_log.stat().st_size if self.server_log.exists() else 0
        self._out = open(self.home / "stdout.log", "ab")  # noqa: SIM115 - closed in _reap
        cmd = _java(
            libs,
            "kafka.Kafka",
            str(self.home / "server.properties"),
            heap=heap,
            log4j=self.home / "log4j2.properties",
        )
        self.proc = subprocess.Popen(
            cmd, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.home
        )

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until this start's part of ``server.log`` says ``Kafka Server started``."""

        def ready() -> bool:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise RuntimeError(f"Kafka node {self.node_id} exited with {code}; see {self.server_log}")
            with open(self.server_log, "rb") as f:
                f.seek(self._ready_from)
                return READY_LINE in f.read()

        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"Kafka node {self.node_id} not started within {timeout:.0f} s")
            time.sleep(0.2)

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM (controlled shutdown: leadership moves first) and wait; SIGKILL past ``timeout``."""
        if self.running:
            assert self.proc is not None
            self._signal(signal.SIGCONT)
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait(timeout=30)
        self._reap()

    def kill(self) -> None:
        """SIGKILL: a crash, nothing flushed, leadership moves after the broker session times out."""
        if self.running:
            assert self.proc is not None
            self._signal(signal.SIGCONT)
            self._signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
        self._reap()

    def freeze(self) -> None:
        """SIGSTOP: the kernel still accepts connections, nothing answers."""
        self._signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self._signal(signal.SIGCONT)

    def port_taken(self) -> bool:
        """Whether this node's last start failed to bind a port (another process holds it)."""
        logs = [self.server_log, self.home / "stdout.log"]
        return any(p.exists() and b"Address already in use" in p.read_bytes() for p in logs)

    def _reap(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None


def _properties(node: KafkaNode, voters: str, replication: int, extra: Mapping[str, object]) -> str:
    min_isr = min(2, replication)
    settings: dict[str, object] = {
        "process.roles": "broker,controller",
        "node.id": node.node_id,
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://127.0.0.1:{node.broker_port},CONTROLLER://127.0.0.1:{node.controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.broker_port}",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": node.log_dir,
        "num.partitions": 1,
        "default.replication.factor": replication,
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": replication,
        "offsets.topic.num.partitions": 4,
        "transaction.state.log.replication.factor": replication,
        "transaction.state.log.min.isr": min_isr,
        "transaction.state.log.num.partitions": 4,
        "share.coordinator.state.topic.replication.factor": replication,
        "share.coordinator.state.topic.min.isr": min_isr,
        "auto.create.topics.enable": "false",
        "num.network.threads": 2,
        "num.io.threads": 2,
        "num.recovery.threads.per.data.dir": 1,
        "background.threads": 2,
        "log.cleaner.threads": 1,
        "log.cleaner.dedupe.buffer.size": 2 * 1024 * 1024,
        "group.initial.rebalance.delay.ms": 0,
        "log.retention.check.interval.ms": 1000,
        "file.delete.delay.ms": 1000,
        "broker.heartbeat.interval.ms": 500,
        "broker.session.timeout.ms": 4000,
        "controlled.shutdown.enable": "true",
        **extra,
    }
    return "".join(f"{k}={v}\n" for k, v in settings.items())


@dataclass
class KafkaCluster:
    """``size`` combined nodes (ids 1..size) under ``home``; every topic defaults to RF ``size``.

    ``broker_config`` adds or overrides ``server.properties`` keys on every node (e.g.
    ``{"log.segment.bytes": 1048576}``). Use as a context manager or call :meth:`start` /
    :meth:`close`; :meth:`close` kills whatever still runs.
    """

    home: Path
    size: int = 1
    broker_config: Mapping[str, object] = field(default_factory=dict)
    heap: str = "384m"
    cluster_id: str = ""
    #: more ``StorageTool format`` arguments, e.g. ``("--add-scram", "SCRAM-SHA-256=[name=u,password=p]")``
    format_args: tuple[str, ...] = ()
    nodes: list[KafkaNode] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.home = Path(self.home)
        self.libs = kafka_libs()
        if not self.nodes:
            self.nodes = [
                KafkaNode(i, self.home / f"node-{i}", free_port(), free_port())
                for i in range(1, self.size + 1)
            ]

    @property
    def bootstrap(self) -> str:
        """Every node's listener, comma-separated (clients pick one that answers)."""
        return ",".join(n.bootstrap for n in self.nodes)

    def node(self, node_id: int) -> KafkaNode:
        return next(n for n in self.nodes if n.node_id == node_id)

    def format(self) -> None:
        """Write each node's config and format its log dir (``kafka.tools.StorageTool format``)."""
        self.cluster_id = self.cluster_id or _random_cluster_id()
        self._write_configs()
        procs = [
            subprocess.Popen(
                _java(
                    self.libs,
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    self.cluster_id,
                    "-c",
                    str(n.home / "server.properties"),
                    *self.format_args,
                    heap="256m",
                    log4j=n.home / "log4j2.properties",
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            for n in self.nodes
        ]
        for n, p in zip(self.nodes, procs, strict=True):
            out, _ = p.communicate(timeout=180)
            if p.returncode != 0:
                raise RuntimeError(f"formatting node {n.node_id} failed: {out.decode()[-500:]}")

    def _write_configs(self) -> None:
        """Each node's ``server.properties`` (static voters: formatting does not record them, so
        ports may change before the first start) and log4j2 config."""
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        for n in self.nodes:
            n.home.mkdir(parents=True, exist_ok=True)
            props = _properties(n, voters, self.size, self.broker_config)
            (n.home / "server.properties").write_text(props)
            (n.home / "log4j2.properties").write_text(_LOG4J.format(log=n.server_log))

    def start(self, timeout: float = 180.0) -> KafkaCluster:
        """Format (first time only), start every node, wait until each is ready and the cluster
        answers metadata with all brokers registered. On the first start, a port another process
        took between choosing it and the JVM binding it (a busy host running other suites) is
        chosen anew, up to three times."""
        first = not self.cluster_id
        if first:
            self.format()
        for attempt in range(3):
            try:
                for n in self.nodes:
                    if not n.running:
                        n.start(self.libs, self.heap)
                for n in self.nodes:
                    n.wait_ready(timeout)
                break
            except RuntimeError:
                if not first or attempt == 2 or not any(n.port_taken() for n in self.nodes):
                    raise
                self.close()
                for n in self.nodes:
                    n.broker_port, n.controller_port = free_port(), free_port()
                self._write_configs()
        self.wait_brokers(len(self.nodes), timeout)
        return self

    def start_node(self, node_id: int, timeout: float = 120.0) -> None:
        node = self.node(node_id)
        node.start(self.libs, self.heap)
        node.wait_ready(timeout)

    def wait_brokers(self, count: int, timeout: float = 60.0) -> None:
        """Until the cluster's metadata lists ``count`` live brokers."""

        def registered() -> bool:
            with self.admin() as admin:
                return len(admin.describe_cluster()["brokers"]) >= count

        wait_until(registered, timeout=timeout, what=f"{count} brokers registered")

    def close(self) -> None:
        for n in self.nodes:
            n.kill()

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- clients (kafka-python) ------------------------------------------------------------------

    @contextmanager
    def admin(self) -> Iterator[Any]:
        """A kafka-python ``KafkaAdminClient`` on the running nodes, closed on exit."""
        from kafka.admin import KafkaAdminClient

        running = ",".join(n.bootstrap for n in self.nodes if n.running) or self.bootstrap
        client = KafkaAdminClient(bootstrap_servers=running, request_timeout_ms=15000)
        try:
            yield client
        finally:
            client.close()

    def create_topic(
        self,
        name: str,
        *,
        partitions: int = 1,
        replication: int | None = None,
        configs: Mapping[str, object] | None = None,
        timeout: float = 60.0,
    ) -> None:
        """Create a topic and wait until every partition has a leader."""
        spec = {
            "num_partitions": partitions,
            "replication_factor": replication or self.size,
            "configs": {k: str(v) for k, v in (configs or {}).items()},
        }
        with self.admin() as admin:
            admin.create_topics({name: spec})
        wait_until(lambda: len(self.leaders(name)) == partitions, timeout=timeout, what=f"leaders of {name}")

    def leaders(self, topic: str) -> dict[int, int]:
        """partition → leader node id, for partitions that have a leader now."""
        with self.admin() as admin:
            (described,) = admin.describe_topics([topic])
        return {
            p["partition_index"]: p["leader_id"]
            for p in described.get("partitions", [])
            if p["leader_id"] >= 0
        }

    def alter_topic(self, name: str, configs: Mapping[str, object | None]) -> None:
        """Set topic configs incrementally (IncrementalAlterConfigs); ``None`` deletes a key."""
        from kafka.admin import AlterConfigOp, ConfigResource, ConfigResourceType

        ops = {
            k: (AlterConfigOp.DELETE, None) if v is None else (AlterConfigOp.SET, str(v))
            for k, v in configs.items()
        }
        with self.admin() as admin:
            admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, name, configs=ops)])


def _random_cluster_id() -> str:
    """A cluster id as ``StorageTool random-uuid`` prints it: 16 random bytes, URL-safe base64,
    never starting with ``-`` (Kafka's ``Uuid.randomUuid`` skips those too: ``format -t -x…``
    reads the id as an option and fails, one start in 64)."""
    import base64

    while True:
        found = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not found.startswith("-"):
            return found
