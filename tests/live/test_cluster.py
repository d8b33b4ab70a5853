"""Cluster mode on a live 3-node KRaft cluster (issue #29, docs/cluster.md, docs/cluster-copy.md).

One ``rlm run`` beside each broker, each on its own node's log dir and metadata log (leadership
``auto`` → ``kraft``), all tiering into one store. The broker is the oracle: whatever a consumer
reads from the cluster is what every sidecar serves, from either tier, byte for byte; the store
holds exactly one copy of every offset, whoever led when it was tiered; offsets an unclean
election threw away are never served again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from rlm.storage.local import LocalBackend
from rlm.testing.kafka_cluster import KafkaCluster, wait_until
from rlm.testing.sidecar import Record, consume
from rlm.testing.store_check import check_store
from tests.live.cluster_helpers import (
    Fleet,
    MiB,
    assert_one_copy,
    assert_served,
    broker_records,
    chain_of,
    http_values,
    journal,
    metric_sum,
    open_copy,
    quiet_requests,
    send,
    store_state,
    wait_isr,
    wait_leadership_seen,
    wait_quiet,
    wait_settled,
)
from tests.live.helpers import broker_end

pytestmark = [pytest.mark.kafka_live, pytest.mark.integration]

TOPIC = "replicated"
QUIET = "quiet"
PARTITIONS = 3
ALL = (1, 2, 3)


@pytest.fixture(scope="module")
def fleet(kafka_trio: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    home = tmp_path_factory.mktemp("fleet")
    sidecars = Fleet(kafka_trio, home / "store", home)
    try:
        for node in kafka_trio.nodes:
            sidecars.start(node.node_id)
        yield sidecars
    finally:
        sidecars.close()


def test_an_idle_partition_costs_its_followers_no_store_request(fleet: Fleet) -> None:
    """#35 item 4 (docs/cluster.md "Idle partitions"): once the log stops, the leader writes its
    idle note and the followers stop asking the store about the partition; records produced later
    wake them, and they list again until they hold the new commits. (The leader's passes are idle
    too; what it still asks is GC's, every ``gc_interval_s`` — 15 s with this fleet's grace.)"""
    cluster = fleet.cluster
    cluster.create_topic(QUIET, partitions=1, configs={"segment.bytes": MiB})
    send(cluster.bootstrap, QUIET, 0, 2500, tag="q")
    wait_leadership_seen(fleet, QUIET)
    first = wait_settled(fleet, QUIET, 0)
    leader = cluster.leaders(QUIET)[0]
    followers = [n for n in ALL if n != leader]
    for _ in range(2):
        counts = wait_quiet(fleet, QUIET, followers)
        time.sleep(10)  # ten passes of every sidecar
        assert quiet_requests(fleet, QUIET, followers) == counts, "a follower asked the store"
        send(cluster.bootstrap, QUIET, 0, 1500, tag="r")  # the log moves: followers must learn of it
        assert wait_settled(fleet, QUIET, 0) > first
    assert metric_sum(fleet.sidecars[leader].url, "rlm_idle_notes_written_total", QUIET) >= 2


@pytest.fixture(scope="module")
def crashed(fleet: Fleet) -> tuple[int, str]:
    """Scenario 1: a leader (broker and sidecar) SIGKILLed while its sidecar copies a segment,
    more written while leadership moves, then both restarted. Returns the victim and the attempt
    it was writing."""
    cluster = fleet.cluster
    cluster.create_topic(TOPIC, partitions=PARTITIONS, configs={"segment.bytes": MiB})
    for p in range(1, PARTITIONS):
        send(cluster.bootstrap, TOPIC, p, 2500, tag="a")
    victim = cluster.leaders(TOPIC)[0]
    with ThreadPoolExecutor(1) as pool:
        # partition 0 is written on while its leader copies, dies and is replaced
        writing = pool.submit(send, cluster.bootstrap, TOPIC, 0, 4000, tag="a")
        copying = wait_until(lambda: open_copy(cluster, victim, TOPIC, 0), timeout=180, what="a copy")
        fleet.crash(victim)
        wait_until(
            lambda: cluster.leaders(TOPIC).get(0, victim) != victim, timeout=120, what="a new leader of p0"
        )
        writing.result()
    for p in range(PARTITIONS):
        send(cluster.bootstrap, TOPIC, p, 1200, tag="c")
    fleet.restart(victim)
    wait_isr(cluster, TOPIC, 3)
    return victim, copying.attempt_id


def test_leader_killed_mid_copy(fleet: Fleet, crashed: tuple[int, str]) -> None:
    victim, attempt = crashed
    cluster = fleet.cluster
    wait_leadership_seen(fleet, TOPIC)
    for p in range(PARTITIONS):
        last = wait_settled(fleet, TOPIC, p)
        assert_one_copy(chain_of(fleet.store, cluster, TOPIC, p), last)
        assert_served(fleet, TOPIC, p, last, broker_records(cluster, TOPIC, p), ALL)
    # the attempt the crash interrupted was never committed, and the restart removed its objects
    listing = [i.key for i in store_state(fleet.store, cluster, TOPIC, 0).list_partition()]
    assert not [k for k in listing if attempt in k], attempt
    backend = LocalBackend(root=str(fleet.store))
    for node in cluster.nodes:
        found = check_store([node.log_dir], backend, complete=False, deep=True)
        assert not found.unreferenced, found.unreferenced
    # the restarted sidecar kept the local index it had of the partitions it followed
    assert "rewound" not in fleet.log(victim)


def test_preferred_election_moves_the_copy(fleet: Fleet, crashed: tuple[int, str]) -> None:
    victim, _attempt = crashed
    cluster = fleet.cluster
    with cluster.admin() as admin:
        (described,) = admin.describe_topics([TOPIC])
        preferred = {p["partition_index"]: p["replica_nodes"][0] for p in described["partitions"]}
        assert preferred[0] == victim and cluster.leaders(TOPIC)[0] != victim
        tiered = {
            p: {m.attempt_id for m in chain_of(fleet.store, cluster, TOPIC, p).manifests} for p in preferred
        }
        admin.elect_leaders(0, {TOPIC: list(preferred)})
    wait_until(lambda: cluster.leaders(TOPIC) == preferred, timeout=120, what="the preferred leaders")
    wait_leadership_seen(fleet, TOPIC)
    for p in range(PARTITIONS):
        send(cluster.bootstrap, TOPIC, p, 1500, tag="d")
    for p in range(PARTITIONS):
        last = wait_settled(fleet, TOPIC, p)
        chain = chain_of(fleet.store, cluster, TOPIC, p)
        assert_one_copy(chain, last)
        assert_served(fleet, TOPIC, p, last, broker_records(cluster, TOPIC, p), ALL)
        # what was tiered since the election was tiered by the preferred leader's sidecar
        new = {m.attempt_id for m in chain.manifests} - tiered[p]
        written = {e.attempt_id for e in journal(cluster, preferred[p], TOPIC, p).events()}
        assert new and new <= written, (p, new, written)


# -- scenario 3: an unclean election ------------------------------------------------------------

DIVERGING = "diverging"


@dataclass
class Unclean:
    """The replicas of the diverging topic's only partition: ``old`` led and took writes nobody
    replicated (``lost``), ``new`` was elected uncleanly; ``kept_end`` is where their logs part."""

    old: int
    new: int
    kept_end: int
    lost: list[Record]
    crashed_ms: int  # when the old leader and its sidecar died


def _elect_uncleanly(cluster: KafkaCluster, node_id: int) -> None:
    """Until ``node_id`` leads the partition (the controller may elect it by itself)."""

    def leads() -> bool:
        with cluster.admin() as admin:
            admin.elect_leaders(1, {DIVERGING: [0]}, raise_errors=False)
        return cluster.leaders(DIVERGING).get(0) == node_id

    wait_until(leads, timeout=180, what=f"node {node_id} elected uncleanly")


@pytest.fixture(scope="module")
def unclean(fleet: Fleet) -> Unclean:
    """Two replicas (with combined broker+controller nodes, a third node keeps the quorum while
    both are down): the follower stops, the leader takes acks=1 writes alone and tiers them, dies
    with its sidecar; the stale follower comes back and is elected uncleanly; more is written."""
    cluster = fleet.cluster
    old, new = 2, 3
    configs = {"segment.bytes": MiB, "unclean.leader.election.enable": "true", "min.insync.replicas": 1}
    spec = {"num_partitions": -1, "replication_factor": -1, "assignments": {0: [old, new]}}
    with cluster.admin() as admin:
        admin.create_topics({DIVERGING: {**spec, "configs": {k: str(v) for k, v in configs.items()}}})
    wait_until(lambda: cluster.leaders(DIVERGING).get(0) == old, timeout=60, what="the first leader")
    send(cluster.bootstrap, DIVERGING, 0, 1200, tag="kept")
    kept_end = broker_end(cluster.bootstrap, DIVERGING, 0)
    wait_settled(fleet, DIVERGING, 0, (old, new))
    cluster.node(new).stop()  # its sidecar goes on beside the stopped broker
    wait_isr(cluster, DIVERGING, 1)
    send(cluster.node(old).bootstrap, DIVERGING, 0, 2500, tag="lost", acks=1)
    lost_end = broker_end(cluster.node(old).bootstrap, DIVERGING, 0)
    lost = consume(cluster.node(old).bootstrap, DIVERGING, 0, kept_end, lost_end)
    assert wait_settled(fleet, DIVERGING, 0, (old,)) > kept_end  # the old leader tiered lost data
    fleet.crash(old)
    crashed_ms = int(time.time() * 1000)
    cluster.start_node(new)
    _elect_uncleanly(cluster, new)
    send(cluster.bootstrap, DIVERGING, 0, 2500, tag="after")
    return Unclean(old, new, kept_end, lost, crashed_ms)


def test_unclean_election_diverged_offsets_never_served(fleet: Fleet, unclean: Unclean) -> None:
    cluster, old, new, cut = fleet.cluster, unclean.old, unclean.new, unclean.kept_end
    # the new leader's sidecar records the divergence for every sidecar
    wait_until(
        lambda: fleet.row(new, DIVERGING, 0)["diverged_from_offset"] == cut, timeout=120, what="a marker"
    )
    # the old leader's host comes back: its sidecar first (beside a log that still holds the lost
    # records and a metadata log naming it leader), its broker after
    fleet.start(old)
    wait_until(
        lambda: fleet.row(old, DIVERGING, 0)["local_diverged_from_offset"] == cut,
        timeout=120,
        what="the old leader's sidecar finding its own log diverged",
    )
    assert_not_served(fleet, old, unclean)
    copies = journal(cluster, old, DIVERGING, 0).events()
    assert not [e for e in copies if e.type == "COPY_STARTED" and e.at_ms > unclean.crashed_ms], copies
    cluster.start_node(old)
    wait_isr(cluster, DIVERGING, 2)
    wait_leadership_seen(fleet, DIVERGING)
    last = wait_settled(fleet, DIVERGING, 0, (old, new))
    expected = broker_records(cluster, DIVERGING, 0)
    assert [r.offset for r in expected] == list(range(len(expected)))
    assert not {r.value for r in expected} & {r.value for r in unclean.lost}
    assert_one_copy(chain_of(fleet.store, cluster, DIVERGING, 0), last, cut=cut)
    assert_served(fleet, DIVERGING, 0, last, expected, (old, new))
    remote = store_state(fleet.store, cluster, DIVERGING, 0)
    markers = [epoch for epoch, _key in remote.lineage_marker_keys(remote.list_manifests_prefix())]
    assert markers, "no lineage marker in the store"
    for node_id in (old, new):
        row = fleet.row(node_id, DIVERGING, 0)
        assert (row["diverged_from_offset"], row["lineage_markers"]) == (cut, markers), row
        assert row["local_diverged_from_offset"] is None, row  # the old leader truncated and rejoined


def assert_not_served(fleet: Fleet, node_id: int, unclean: Unclean) -> None:
    """No record the unclean election threw away comes out of ``node_id``'s sidecar (HTTP and its
    Kafka listener), from the offset where the logs parted to its visible end."""
    sidecar = fleet.sidecars[node_id]
    served = http_values(sidecar.url, DIVERGING, 0, unclean.kept_end)
    visible_end = fleet.row(node_id, DIVERGING, 0)["visible_end_offset"]
    served |= {r.value for r in consume(sidecar.kafka_bootstrap, DIVERGING, 0, unclean.kept_end, visible_end)}
    lost = {r.value for r in unclean.lost}
    assert not served & lost, f"node {node_id} serves {len(served & lost)} records the election threw away"
