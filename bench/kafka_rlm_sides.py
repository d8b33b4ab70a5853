"""The two sides of bench/kafka_rlm_bench.py and what it asks of them.

* **rlm side** (A): a plain KRaft broker (rlm/testing/kafka_cluster.py) and an ``rlm run`` beside it
  (rlm/testing/sidecar.py: a ``local`` store, its Kafka listener, ``task_interval_ms`` = the bench's
  task interval, ``gc_grace_ms`` at its default: GC every 15 minutes, not on every pass as in tests).
* **Kafka side** (B): the same broker with Kafka's own tiered storage (KIP-405) on:
  :data:`KAFKA_TIERED` — ``LocalTieredStorage`` (the kafka-storage test-jar, ``make kafka-tiered``)
  writing into a folder, the topic-based remote log metadata manager on the broker's PLAINTEXT
  listener, ``remote.log.manager.task.interval.ms`` = the same task interval.

Both brokers get the same ``server.properties`` otherwise (the fixture's: 2 network and 2 I/O threads,
retention checked every second, a 384 MiB heap). Each side answers the same questions the same way:
``ListOffsets`` v9 with KIP-1005's ``-5`` (latest tiered: the broker's highest offset in remote
storage, rlm's highest tiered offset) at the side's read endpoint, the files under its remote folder,
and ``/proc/<pid>/stat`` of its processes.
"""

from __future__ import annotations

import hashlib
import random
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.benchlib import process_cpu_seconds
from rlm.config import TieringSettings
from rlm.testing.kafka_cluster import KAFKA_VERSION, KafkaCluster, kafka_libs, wait_until
from rlm.testing.sidecar import run_sidecar, segment_bases

MiB = 1024 * 1024
RECORD = 16 * 1024
LATEST_TIERED = -5
LOCAL_TIERED_STORAGE = "org.apache.kafka.server.log.remote.storage.LocalTieredStorage"
_REPO = Path(__file__).resolve().parent.parent
TIERED_JAR = (
    _REPO / ".cache" / f"kafka-tiered-{KAFKA_VERSION}" / "libs" / f"kafka-storage-{KAFKA_VERSION}-test.jar"
)


def kafka_tiered(folder: Path, task_interval_ms: int) -> dict[str, object]:
    """Broker B's tiered-storage keys. Everything not named here is Kafka's default, among them
    the ones that bound a copy or a remote read: ``remote.log.manager.copier.thread.pool.size`` 10,
    ``remote.log.reader.threads`` 10, ``remote.fetch.max.wait.ms`` 500,
    ``remote.log.index.file.cache.total.size.bytes`` 1 GiB, no copy or fetch quota. The metadata
    topic gets one partition (50 by default: the bench has one data partition, so the other 49
    would only cost the broker)."""
    return {
        "remote.log.storage.system.enable": "true",
        "remote.log.storage.manager.class.name": LOCAL_TIERED_STORAGE,
        "rsm.config.dir": folder,
        "remote.log.metadata.manager.listener.name": "PLAINTEXT",
        "rlmm.config.remote.log.metadata.topic.replication.factor": 1,
        "rlmm.config.remote.log.metadata.topic.num.partitions": 1,
        "remote.log.manager.task.interval.ms": task_interval_ms,
    }


def tiered_libs(work: Path) -> Path:
    """A folder of links to the pinned Kafka runtime plus the kafka-storage test-jar (broker B's
    classpath); the runtime folder itself is left as it is."""
    if not TIERED_JAR.is_file():
        raise RuntimeError(f"no {TIERED_JAR.name}: run `make kafka-tiered` (Maven fetches it once)")
    out = work / "libs-tiered"
    out.mkdir(parents=True)
    for jar in [*kafka_libs().glob("*.jar"), TIERED_JAR]:
        (out / jar.name).symlink_to(jar)
    return out


class Offsets:
    """One connection asking ListOffsets v9 of a Kafka endpoint (a broker or rlm's listener)."""

    def __init__(self, bootstrap: str) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.port = int(port)
        self.sock = socket.create_connection((host, self.port), timeout=10)

    def ask(self, topic: str, timestamp: int) -> int | None:
        """The offset answered for ``timestamp``; None on a partition error."""
        from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse

        from tests.kafka.helpers import call

        t = ListOffsetsRequest.ListOffsetsTopic
        part = t.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=timestamp)
        req = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[t(name=topic, partitions=[part])])
        got = call(self.port, req, 9, ListOffsetsResponse, sock=self.sock).topics[0].partitions[0]
        return None if got.error_code else int(got.offset)

    def close(self) -> None:
        self.sock.close()


@dataclass
class Side:
    """One side: the broker to produce to, the endpoint consumers read from, the processes whose
    CPU counts, the folder its remote tier lives in."""

    name: str
    kafka: KafkaCluster
    read_bootstrap: str
    pids: list[int]
    remote: Path
    rlm: bool

    @property
    def bootstrap(self) -> str:
        return self.kafka.bootstrap

    @property
    def log_dir(self) -> Path:
        return self.kafka.nodes[0].log_dir

    def cpu(self) -> float:
        return sum(self.cpu_each())

    def cpu_each(self) -> list[float]:
        """CPU seconds of each of :attr:`pids` (the broker first)."""
        return [process_cpu_seconds(p) for p in self.pids]

    def create(self, topic: str, *, tiered: bool, segment: int) -> None:
        """A one-partition topic of ``segment``-byte segments; ``tiered`` False: its tiering off
        until :meth:`enable` (``remote.storage.enable=false``, which rlm follows too,
        docs/topic-policy.md). On B, local retention is one segment from the start: Kafka deletes
        local segments only once they are in remote storage."""
        configs: dict[str, object] = {"segment.bytes": segment}
        if not self.rlm:
            configs |= {"local.retention.bytes": segment, "remote.storage.enable": str(tiered).lower()}
        elif not tiered:
            configs["remote.storage.enable"] = "false"
        self.kafka.create_topic(topic, configs=configs)

    def enable(self, topic: str) -> None:
        """Start tiering ``topic``: B sets ``remote.storage.enable=true``; A deletes the ``false``."""
        self.kafka.alter_topic(topic, {"remote.storage.enable": None if self.rlm else "true"})

    def cut_local(self, topic: str, segment: int) -> None:
        """A: the broker's retention to one segment (after rlm tiered it; B's local retention was
        set at creation). Returns once the broker's log dir holds at most two segments."""
        if self.rlm:
            self.kafka.alter_topic(topic, {"retention.bytes": segment})
        part = self.log_dir / f"{topic}-0"
        wait_until(lambda: len(segment_bases(part)) <= 2, timeout=120, what=f"{self.name}: {topic} cut")

    def stored(self, topic: str) -> int:
        """Bytes of every file under the remote folder's ``<topic>-0…`` directories."""
        total = 0
        for d in self.remote.rglob(f"{topic}-0*"):
            if d.is_dir():
                total += sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
        return total


@contextmanager
def sides(
    work: Path, task_interval_ms: int, broker: dict[str, object], *, store_fsync: bool = True
) -> Iterator[tuple[Side, Side]]:
    """Both sides started (B's broker on :func:`tiered_libs`); stopped at the end. ``store_fsync``:
    rlm's ``local`` store option ``fsync`` (False: no more durable than LocalTieredStorage, whose
    ``Files.copy`` never forces a file or directory)."""
    libs = tiered_libs(work)
    with ExitStack() as stack:
        plain = KafkaCluster(work / "a", broker_config=broker)
        stack.callback(plain.close)
        native = KafkaCluster(
            work / "b", broker_config={**broker, **kafka_tiered(work / "b-remote", task_interval_ms)}
        )
        native.libs = libs  # the test-jar beside the runtime, for B only
        stack.callback(native.close)
        plain.start()
        native.start()
        # gc_grace_ms at rlm's default (1 h: GC every 15 min), as Kafka's RLM runs at its defaults;
        # the tests' config writer sets 0, which runs GC of abandoned attempts on every pass
        tiering = {"task_interval_ms": task_interval_ms, "gc_grace_ms": TieringSettings().gc_grace_ms}
        # bootstrap_servers: a leader asks the broker's high watermark when the checkpoint's holds a
        # rolled segment back (docs/operations.md "The high watermark"), as Kafka's RLM reads it in memory
        # log_start_max_age_ms = -1: the readers' check of the broker's log start (one ListOffsets per
        # read, docs/visibility.md) stays off, as in the runs before bootstrap_servers was set here
        cluster = {"bootstrap_servers": [plain.bootstrap], "log_start_max_age_ms": -1}
        rlm = stack.enter_context(
            run_sidecar(
                plain.nodes[0],
                work / "a-remote",
                work / "a-rlm",
                tiering=tiering,
                cluster=cluster,
                options={"root": str(work / "a-remote"), "fsync": store_fsync},
            )
        )
        a_pids = [plain.nodes[0].proc.pid, rlm.daemon.proc.pid]  # type: ignore[union-attr]
        b_pids = [native.nodes[0].proc.pid]  # type: ignore[union-attr]
        yield (
            Side("rlm", plain, rlm.kafka_bootstrap, a_pids, work / "a-remote", True),
            Side("kafka", native, native.bootstrap, b_pids, work / "b-remote", False),
        )


def payloads(seed: int = 35) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(RECORD - 8) for _ in range(64)]


def produce(bootstrap: str, topic: str, records: int, values: list[bytes]) -> float:
    """``records`` records of 16 KiB (``%08d`` of the index + one of ``values``), acks=all, as fast
    as the broker takes them; returns the monotonic time ``flush`` saw the last ack."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 1 << 20})
    for i in range(records):
        value = b"%08d" % i + values[i % 64]
        while True:
            try:
                p.produce(topic, value, partition=0)
                break
            except BufferError:
                p.poll(0.01)
        if i % 500 == 0:
            p.poll(0)
    assert p.flush(300) == 0, "records not acknowledged"
    return time.monotonic()


@dataclass
class Read:
    seconds: float  # assignment to the last record
    count: int
    digest: str  # sha256 of every value, in offset order


def read_confluent(bootstrap: str, topic: str, end: int, fetch_bytes: int) -> Read:
    """librdkafka (confluent-kafka) from offset 0 to ``end``, assigned (no group)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "max.partition.fetch.bytes": fetch_bytes,
        }
    )
    digest, count = hashlib.sha256(), 0
    start = time.monotonic()
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        while count < end:
            for m in c.consume(num_messages=min(1000, end - count), timeout=1.0):
                err = m.error()
                if err is not None:
                    # rlm's listener serves no groups: librdkafka's coordinator lookup for the
                    # group.id it insists on is refused (the read itself is assigned)
                    assert err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, err
                    continue
                digest.update(m.value() or b"")
                count += 1
    finally:
        took = time.monotonic() - start
        c.close()
    return Read(took, count, digest.hexdigest())


def read_kafka_python(bootstrap: str, topic: str, end: int, fetch_bytes: int) -> Read:
    """kafka-python's ``KafkaConsumer`` from offset 0 to ``end``, assigned (no group)."""
    from kafka import KafkaConsumer, TopicPartition

    tp = TopicPartition(topic, 0)
    c: Any = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, max_partition_fetch_bytes=fetch_bytes
    )
    digest, count = hashlib.sha256(), 0
    start = time.monotonic()
    try:
        c.assign([tp])
        c.seek(tp, 0)
        while count < end:
            for msgs in c.poll(timeout_ms=1000, max_records=min(1000, end - count)).values():
                for m in msgs:
                    digest.update(m.value or b"")
                    count += 1
    finally:
        took = time.monotonic() - start
        c.close()
    return Read(took, count, digest.hexdigest())


def read_raw_fetch(bootstrap: str, topic: str, end: int, fetch_bytes: int) -> Read:
    """Fetch v12 requests one after the other on one connection, each from the offset after the
    last batch answered, ``fetch_bytes`` per partition, records not decoded (batch headers walked
    for the next offset): the server's time per request plus one round trip, without a client's
    record decoding. No digest (the bytes are not decoded); ``count`` = offsets covered."""
    from kafka.protocol.consumer import FetchResponse

    from rlm.testing.kafka_wire import fetch_request
    from tests.kafka.helpers import call

    port = int(bootstrap.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    offset = 0
    start = time.monotonic()
    try:
        while offset < end:
            req = fetch_request([(topic, 0, offset)], max_wait_ms=500, partition_max_bytes=fetch_bytes)
            answer = call(port, req, 12, FetchResponse, sock=sock).responses[0].partitions[0]
            assert answer.error_code == 0, answer
            offset = _after_last_batch(memoryview(answer.records or b""), offset)
    finally:
        took = time.monotonic() - start
        sock.close()
    return Read(took, offset, "")


def _after_last_batch(records: memoryview, offset: int) -> int:
    """The offset after the last whole batch of ``records`` (``offset`` when there is none)."""
    pos = 0
    while pos + 61 <= len(records):  # a v2 batch header is 61 bytes
        length = int.from_bytes(records[pos + 8 : pos + 12], "big")
        if pos + 12 + length > len(records):
            break
        base = int.from_bytes(records[pos : pos + 8], "big")
        offset = base + int.from_bytes(records[pos + 23 : pos + 27], "big") + 1
        pos += 12 + length
    return offset


READERS = {"confluent-kafka": read_confluent, "kafka-python": read_kafka_python, "raw Fetch": read_raw_fetch}
