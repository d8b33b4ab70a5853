"""Steps of the cluster-mode suite (tests/live/test_cluster.py, docs/cluster.md): one sidecar per
broker of a live 3-node KRaft cluster, all on one local-folder store; what the store's chain serves
and what every sidecar answers, compared with what a consumer reads from the brokers."""

from __future__ import annotations

import base64
import json
import os
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from rlm.config import load_settings
from rlm.formats.records import Record as Decoded
from rlm.logdir.discovery import list_segments, partition_dir
from rlm.storage.local import LocalBackend
from rlm.testing.kafka_cluster import KafkaCluster, wait_until
from rlm.testing.sidecar import Record, Sidecar, consume, run_sidecar, segment_bases
from rlm.testing.store_check import local_batches
from rlm.tiering.local.journal import Journal, JournalEvent
from rlm.tiering.local.state import default_state_dir, state_dir_name
from rlm.tiering.read.readers import TieredReaders
from rlm.tiering.store.lineage import Chain
from rlm.tiering.store.remote_state import RemoteState
from tests.live.helpers import broker_end, partition_row

MiB = 1024 * 1024

#: Each sidecar's upload budget (bytes/s, a burst of one second's worth): a 1 MiB segment takes
#: about 3 s to upload, so a broker killed while segments are being tiered is killed mid-copy.
UPLOAD_BYTES_PER_SEC = 256 * 1024


@dataclass
class Fleet:
    """One ``rlm run`` per broker of ``cluster`` (leadership ``auto``: the node's own KRaft log),
    all tiering into the one store ``store``; ``work/node-N`` holds each one's config and log."""

    cluster: KafkaCluster
    store: Path
    work: Path
    sidecars: dict[int, Sidecar] = field(default_factory=dict)
    _stacks: dict[int, ExitStack] = field(default_factory=dict)

    def start(self, node_id: int) -> Sidecar:
        """``rlm run`` beside the node; the log of an earlier run of it is kept as ``.log.<n>``."""
        log = self.work / f"node-{node_id}" / f"rlm-{node_id}.log"
        if log.exists():
            log.rename(log.with_name(f"{log.name}.{len(list(log.parent.glob(log.name + '.*'))) + 1}"))
        stack = ExitStack()
        self._stacks[node_id] = stack
        self.sidecars[node_id] = stack.enter_context(
            run_sidecar(
                self.cluster.node(node_id),
                self.store,
                self.work / f"node-{node_id}",
                # a real grace: another sidecar may still be writing an attempt GC finds
                tiering={"upload_bytes_per_sec": UPLOAD_BYTES_PER_SEC, "gc_grace_ms": 60_000},
            )
        )
        return self.sidecars[node_id]

    def stop(self, node_id: int) -> None:
        """SIGTERM the sidecar (a clean stop) and forget it."""
        self.sidecars.pop(node_id)
        self._stacks.pop(node_id).close()

    def crash(self, node_id: int) -> None:
        """SIGKILL the broker and its sidecar together, as a host dies."""
        proc = self.sidecars[node_id].daemon.proc
        os.kill(proc.pid, signal.SIGKILL)
        self.cluster.node(node_id).kill()
        proc.wait(timeout=30)
        self.stop(node_id)

    def restart(self, node_id: int) -> None:
        """The broker, then its sidecar, on the same dirs."""
        self.cluster.start_node(node_id)
        self.start(node_id)

    def close(self) -> None:
        for node_id in list(self.sidecars):
            self.stop(node_id)

    def row(self, node_id: int, topic: str, partition: int) -> dict[str, Any]:
        self.sidecars[node_id].daemon.alive()
        return partition_row(self.sidecars[node_id].url, topic, partition)

    def log(self, node_id: int) -> str:
        """The log of the sidecar's current (or last) run."""
        return (self.work / f"node-{node_id}" / f"rlm-{node_id}.log").read_text(errors="replace")


def journal(cluster: KafkaCluster, node_id: int, topic: str, partition: int) -> Journal:
    """The copy journal of ``node_id``'s sidecar for the partition (its state dir beside the log dir)."""
    log_dir = cluster.node(node_id).log_dir
    part = partition_dir(log_dir, topic, partition)
    return Journal(default_state_dir(log_dir) / state_dir_name(part) / "journal.jsonl")


def open_copy(cluster: KafkaCluster, node_id: int, topic: str, partition: int) -> JournalEvent | None:
    """The copy ``node_id``'s sidecar has started and not finished for the partition, if any."""
    events = journal(cluster, node_id, topic, partition).open_attempts()
    opened = [e for e in events if e.type == "COPY_STARTED"]
    return opened[-1] if opened else None


def store_state(store: Path, cluster: KafkaCluster, topic: str, partition: int) -> RemoteState:
    """The partition's root in the store (its topic id from a replica's ``partition.metadata``)."""
    held = [n.log_dir for n in cluster.nodes if (n.log_dir / f"{topic}-{partition}").is_dir()]
    part = partition_dir(held[0], topic, partition)
    return RemoteState(LocalBackend(root=str(store)), topic, partition, part.topic_id)


def chain_of(store: Path, cluster: KafkaCluster, topic: str, partition: int) -> Chain:
    """What the store serves of the partition: its manifests under its lineage markers."""
    return store_state(store, cluster, topic, partition).chain()


def leader_target(cluster: KafkaCluster, topic: str, partition: int) -> tuple[int, int]:
    """(leader, the last offset its sidecar can tier now): the offset before its active segment."""
    leader = cluster.leaders(topic)[partition]
    bases = segment_bases(cluster.node(leader).log_dir / f"{topic}-{partition}")
    return leader, bases[-1] - 1


def wait_settled(
    fleet: Fleet, topic: str, partition: int, nodes: tuple[int, ...] | None = None, timeout: float = 240
) -> int:
    """Until the store serves everything before the leader's active segment (its sidecar tiered
    it, or an earlier leader whose log rolled later did) and the local index of every sidecar in
    ``nodes`` (default: all; only replicas hold the partition) is the store's chain; returns the
    chain's highest offset."""

    def settled() -> int | None:
        leader, target = leader_target(fleet.cluster, topic, partition)
        if fleet.row(leader, topic, partition)["role"] != "leader":
            return None
        highest = chain_of(fleet.store, fleet.cluster, topic, partition).highest
        if highest < max(target, 0):
            return None
        for node_id in fleet.sidecars if nodes is None else nodes:
            row = fleet.row(node_id, topic, partition)
            if (row["store_highest_offset"], row["local_index_highest_offset"]) != (highest, highest):
                return None
        return highest

    got: int = wait_until(settled, timeout=timeout, what=f"{topic}-{partition} tiered and synced everywhere")
    return got


def wait_leadership_seen(fleet: Fleet, topic: str) -> None:
    """Until the status of every running sidecar beside a running replica names the leader and
    leader epoch the brokers report (the ``kraft`` source reads them from the node's own log)."""

    def seen() -> bool:
        with fleet.cluster.admin() as admin:
            (described,) = admin.describe_topics([topic])
        for p in described["partitions"]:
            for node_id in p["replica_nodes"]:
                if node_id not in fleet.sidecars or not fleet.cluster.node(node_id).running:
                    continue
                row = fleet.row(node_id, topic, p["partition_index"])
                if (row["leader"], row["leader_epoch"]) != (p["leader_id"], p["leader_epoch"]):
                    return False
        return True

    wait_until(seen, timeout=120, what=f"{topic}: every sidecar sees the brokers' leaders and epochs")


def broker_records(cluster: KafkaCluster, topic: str, partition: int) -> list[Record]:
    """Every record of the partition as a consumer reads it from the brokers (up to the HW)."""
    end = broker_end(cluster.bootstrap, topic, partition)
    return consume(cluster.bootstrap, topic, partition, 0, end)


def _as_record(r: Decoded) -> Record:
    return Record(r.offset, r.timestamp, r.key, r.value, tuple((h.key, h.value or b"") for h in r.headers))


@dataclass(frozen=True)
class ServedBatch:
    """One batch as a sidecar served it: its offsets, its bytes, the records a reader sees."""

    base_offset: int
    last_offset: int
    data: bytes
    records: list[Record]


def remote_batches(sidecar: Sidecar, topic: str, partition: int, last: int) -> Iterator[ServedBatch]:
    """The batches holding offsets ``0..last`` read through ``sidecar``'s own config, index and
    store, from the remote tier only (as for a compacted topic, docs/topic-policy.md)."""
    settings = load_settings(sidecar.config)
    readers = TieredReaders(settings, LocalBackend(**settings.remote.options))
    reader = readers.reader(topic, partition)
    reader.remote_first = True
    offset = 0
    while offset <= last:
        got = reader.fetch(offset, MiB)
        assert got.tier == "remote" and got.batches, f"node {sidecar.node.node_id}: {offset} not remote"
        for batch in got.batches:
            records = [_as_record(r) for r in got.records(batch, from_requested=True)]
            data = bytes(got.data[batch.position : batch.end_position])
            yield ServedBatch(batch.base_offset, batch.last_offset, data, records)
        offset = got.batches[-1].last_offset + 1


def send(bootstrap: str, topic: str, partition: int, count: int, *, tag: str, acks: object = "all") -> None:
    """``count`` records of ~1000 bytes whose keys and values name ``tag`` (so data written in one
    phase can never pass for another's), each acknowledged (``acks``) or the call fails."""
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks=acks, enable_idempotence=acks == "all", linger_ms=5
    )
    try:
        futures = [
            producer.send(
                topic,
                key=f"{tag}-{i}".encode(),
                value=f"{tag}-{i:08d}-".encode() + os.urandom(496).hex().encode(),
                headers=[("phase", tag.encode())],
                partition=partition,
            )
            for i in range(count)
        ]
        producer.flush(timeout=180)
        for f in futures:
            f.get(timeout=1)
    finally:
        producer.close(timeout=30)


def wait_isr(cluster: KafkaCluster, topic: str, size: int) -> None:
    """Until every partition of ``topic`` has ``size`` in-sync replicas and a leader."""

    def full() -> bool:
        with cluster.admin() as admin:
            (described,) = admin.describe_topics([topic])
        return all(len(p["isr_nodes"]) == size and p["leader_id"] >= 0 for p in described["partitions"])

    wait_until(full, timeout=180, what=f"{topic}: {size} in-sync replicas everywhere")


def assert_one_copy(chain: Chain, last: int, *, cut: int | None = None) -> None:
    """Every offset ``0..last`` served from exactly one committed manifest: nothing superseded or
    diverged left committed, no two links share an offset, no gap. ``cut``: the one offset where
    a link may stop before its manifest ends (an unclean election cut the rest)."""
    assert not chain.superseded and not chain.diverged, chain
    expected_first = 0
    for link in chain.links:
        assert link.first_offset == link.manifest.base_offset, f"{link}: partly covered by another"
        assert link.first_offset == expected_first, f"gap or overlap before {link}"
        if link.last_offset != link.manifest.last_offset:
            assert link.last_offset + 1 == cut, f"{link}: cut elsewhere than at {cut}"
        expected_first = link.last_offset + 1
    assert expected_first == last + 1, f"the chain ends at {expected_first - 1}, not {last}"


def assert_served(
    fleet: Fleet, topic: str, partition: int, last: int, expected: list[Record], nodes: tuple[int, ...]
) -> None:
    """The Kafka listener of each sidecar in ``nodes`` serves what the brokers serve; its remote
    tier serves ``0..last`` as the brokers' records, each batch byte for byte as in its broker's log."""
    for node_id in nodes:
        sidecar = fleet.sidecars[node_id]
        assert consume(sidecar.kafka_bootstrap, topic, partition, 0, len(expected)) == expected, node_id
        segments = list_segments(partition_dir(sidecar.node.log_dir, topic, partition))
        served = list(remote_batches(sidecar, topic, partition, last))
        records = [r for b in served for r in b.records if r.offset <= last]
        assert records == expected[: last + 1], f"node {node_id}: remote tier differs from the brokers"
        for b in served:
            local = local_batches(segments, b.base_offset, b.last_offset)
            assert local == b.data, f"node {node_id}: remote batch {b.base_offset}-{b.last_offset} differs"


def http_values(url: str, topic: str, partition: int, start: int) -> set[bytes]:
    """The values of every record ``GET .../records`` serves from ``start`` to the visible end
    (either tier; nothing when ``start`` is not visible)."""
    values: set[bytes] = set()
    offset = start
    while True:
        query = f"{url}/v1/topics/{topic}/partitions/{partition}/records?offset={offset}&format=json"
        try:
            with urllib.request.urlopen(query, timeout=30) as resp:
                doc = json.load(resp)
        except urllib.error.HTTPError as err:
            assert err.code == 416, f"{query}: {err.code} {err.read()!r}"
            return values
        records = [r for b in doc["batches"] for r in b["records"]]
        if not records:
            return values
        values |= {base64.b64decode(r["value"]) for r in records if r["value"] is not None}
        offset = doc["next_offset"]


def metric_sum(url: str, name: str, topic: str) -> float:
    """The sum of the samples of ``name`` labelled with ``topic`` in the daemon's /metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and s.labels.get("topic") == topic
    )


def quiet_requests(fleet: Fleet, topic: str, nodes: list[int]) -> dict[int, float]:
    """Store requests the sidecars of ``nodes`` made for ``topic``'s partitions so far."""
    return {n: metric_sum(fleet.sidecars[n].url, "rlm_store_requests_total", topic) for n in nodes}


def wait_quiet(fleet: Fleet, topic: str, nodes: list[int], passes: int = 5) -> dict[int, float]:
    """Until the sidecars of ``nodes`` asked the store nothing about ``topic`` for ``passes``
    seconds (a pass a second); returns their counts then."""
    seen: list[dict[int, float]] = []

    def still() -> dict[int, float] | None:
        seen.append(quiet_requests(fleet, topic, nodes))
        return seen[-1] if len(seen) > passes and seen[-1] == seen[-1 - passes] else None

    got: dict[int, float] = wait_until(
        still, timeout=180, interval=1.0, what=f"{topic}: no sidecar asks the store"
    )
    return got
