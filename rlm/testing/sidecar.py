"""rlm beside a live Kafka node, and a consumer's view of a partition, for tests, benches and demos.

:func:`run_sidecar` writes the config of an ``rlm run`` on one node's log dir (its metadata log is
found there, so topic ids, configs and leadership come from the broker's own KRaft log) with the
HTTP API and the read-only Kafka listener on free loopback ports, and runs it as a subprocess
(:func:`rlm.testing.daemon.run_daemon`). :func:`consume` reads a partition the way a consumer
does (kafka-python), so the broker's answers and rlm's can be compared record for record.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlm.testing.configs import write_config
from rlm.testing.daemon import Daemon, free_port, run_daemon, wait_healthy
from rlm.testing.kafka_cluster import KafkaNode, wait_until

__all__ = ["Record", "Sidecar", "consume", "run_sidecar", "segment_bases", "sidecar_config"]


@dataclass(frozen=True, slots=True)
class Record:
    """One record as a consumer sees it: everything a producer set, plus where it landed."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


@dataclass
class Sidecar:
    """A running ``rlm run`` beside ``node``: its daemon, HTTP URL and Kafka listener address."""

    node: KafkaNode
    daemon: Daemon
    kafka_bootstrap: str
    config: Path

    @property
    def url(self) -> str:
        return self.daemon.url


def sidecar_config(
    path: Path,
    node: KafkaNode,
    store: Path,
    *,
    http_port: int,
    kafka_port: int,
    tiering: Mapping[str, Any] | None = None,
    **extra: Any,
) -> Path:
    """A config tiering ``node``'s log dir into the local-folder store ``store``: leadership and
    topic policy from the node's metadata log (``auto``), a pass every second unless ``tiering``
    says otherwise. ``extra`` goes to :func:`rlm.testing.configs.write_config`."""
    settings = {"task_interval_ms": 1000, **(tiering or {})}
    sections = dict(extra.pop("sections", {}))
    # ``sections["kafka"]`` adds to the listener's keys (SASL, TLS): the port stays this one
    sections["kafka"] = {"listen": f"127.0.0.1:{kafka_port}", **sections.get("kafka", {})}
    return write_config(
        path,
        [node.log_dir],
        root=store,
        server_port=http_port,
        sections=sections,
        **extra,
        **settings,
    )


@contextmanager
def run_sidecar(
    node: KafkaNode,
    store: Path,
    work: Path,
    *,
    tiering: Mapping[str, Any] | None = None,
    **extra: Any,
) -> Iterator[Sidecar]:
    """``rlm run`` beside ``node`` until the block ends (SIGTERM, then SIGKILL). ``work`` holds its
    config and log (``rlm-<node id>.log``)."""
    work.mkdir(parents=True, exist_ok=True)
    http_port, kafka_port = free_port(), free_port()
    config = sidecar_config(
        work / f"rlm-{node.node_id}.toml",
        node,
        store,
        http_port=http_port,
        kafka_port=kafka_port,
        tiering=tiering,
        **extra,
    )
    with run_daemon(config, http_port, work / f"rlm-{node.node_id}.log", wait=False) as daemon:
        wait_healthy(daemon, timeout=120)
        yield Sidecar(node, daemon, f"127.0.0.1:{kafka_port}", config)


def consume(
    bootstrap: str,
    topic: str,
    partition: int,
    start: int,
    end: int,
    *,
    isolation: str = "read_uncommitted",
    timeout: float = 60.0,
    **config: Any,
) -> list[Record]:
    """Every record of ``[start, end)`` a kafka-python consumer reads from ``bootstrap`` (a broker
    or rlm's listener) with ``isolation``; fails if the offsets up to ``end`` do not all arrive
    within ``timeout`` seconds (with read_committed, aborted offsets never arrive: pass the LSO-
    bounded range you expect and compare offsets, not counts). ``config``: more KafkaConsumer
    settings (SASL for a listener that requires it)."""
    from kafka import KafkaConsumer, TopicPartition

    tp = TopicPartition(topic, partition)
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level=isolation,
        consumer_timeout_ms=1000,
        fetch_max_wait_ms=200,
        request_timeout_ms=20000,
        **config,
    )
    out: list[Record] = []
    try:
        consumer.assign([tp])
        consumer.seek(tp, start)

        def caught_up() -> bool:
            for msg in consumer:
                if msg.offset >= end:
                    return True
                out.append(_record(msg))
                if msg.offset == end - 1:
                    return True
            return int(consumer.position(tp)) >= end

        wait_until(caught_up, timeout=timeout, what=f"{topic}-{partition} [{start}, {end}) from {bootstrap}")
    finally:
        consumer.close()
    return out


def _record(msg: Any) -> Record:
    headers = tuple((k, bytes(v)) for k, v in (msg.headers or []))
    return Record(msg.offset, msg.timestamp, msg.key, msg.value, headers)


_SEGMENT = re.compile(r"^(\d{20})\.log$")


def segment_bases(partition_dir: Path) -> list[int]:
    """Base offsets of the ``.log`` segments in a partition directory now, ascending."""
    found = (_SEGMENT.match(p.name) for p in partition_dir.iterdir())
    return sorted(int(m.group(1)) for m in found if m)
