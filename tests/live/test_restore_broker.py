"""A broker loads what ``rlm restore`` wrote (issue #29, "restore loaded by a broker").

The disaster (docs/restore.md, "After losing a broker's disk"): a single KRaft node keeps its
metadata log on its own disk (``metadata.log.dir``, as production brokers do) and its data in
``log.dirs``; rlm tiers the data; the data disk is lost (with rlm's state dir beside it). The
operator stops the broker, formats the new disk with the cluster's id (``kafka-storage format
--ignore-formatted``: the same cluster and node id, a new directory id), runs ``rlm restore`` with
the sidecar's own config into that log dir — rlm finds the topic's partitions and topic id in the
surviving metadata log — and starts the broker again.

The broker is the oracle: it serves every restored offset as a consumer read it from the original
broker (both isolation levels), it loads the files without recovering anything, and Kafka's
``DumpLogSegments`` finds nothing wrong in any restored segment, index, transaction index or
producer snapshot; each restored file is the lost disk's own, byte for byte.
"""

from __future__ import annotations

import itertools
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rlm.testing.daemon import rlm_cli
from rlm.testing.kafka_cluster import KafkaCluster, KafkaNode, run_kafka_tool, wait_until
from rlm.testing.sidecar import Record, consume, run_sidecar, segment_bases
from tests.kafkaservers import require_kafka
from tests.live.helpers import (
    broker_end,
    broker_log_start,
    checkpointed_high_watermark,
    produce,
    wait_tiered,
)
from tests.live.kafka_dump import dump_log_segments, parse_dump, problems
from tests.live.mixed_log import produce_mixed, roll

pytestmark = [pytest.mark.kafka_live, pytest.mark.integration]

MiB = 1024 * 1024
TOPIC = "restored"
ISOLATIONS = ("read_uncommitted", "read_committed")


@dataclass
class Restored:
    """The restored broker running, and what the test compares it with."""

    cluster: KafkaCluster
    node: KafkaNode
    end: int  # the restored log end: every offset below it was tiered
    before: dict[str, list[Record]]  # isolation level -> records read from the original broker
    lost: Path  # the original partition dir (the "lost disk", kept aside to compare with)
    files: Path  # the restored partition dir as rlm wrote it, before the broker opened it
    summary: dict[str, Any]  # rlm restore's JSON
    config: Path  # the sidecar's config, which the restore used too
    restart_log: str  # server.log of the restored broker's start


def _lose_the_disk(cluster: KafkaCluster, node: KafkaNode, home: Path) -> Path:
    """Stop the broker, move its data log dir and rlm's state dir away, format a new empty one."""
    node.stop()
    lost = home / "lost-disk"
    lost.mkdir()
    node.log_dir.rename(lost / node.log_dir.name)
    state = node.log_dir.with_name(node.log_dir.name + ".rlm-state")
    if state.exists():
        state.rename(lost / state.name)
    node.log_dir.mkdir()
    done = run_kafka_tool(
        "kafka.tools.StorageTool",
        "format",
        "--ignore-formatted",
        "-t",
        cluster.cluster_id,
        "-c",
        str(node.home / "server.properties"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (node.log_dir / "meta.properties").is_file()
    return lost / node.log_dir.name / f"{TOPIC}-0"


def _elect_uncleanly(cluster: KafkaCluster, node: KafkaNode) -> None:
    """Step 5 of the procedure (docs/restore.md): the partition came back without a leader — the
    broker registered after an unclean shutdown, so it is no eligible leader replica (KIP-966), and
    the lost active segment's records are gone. An unclean election says so and brings it back."""
    done = run_kafka_tool(
        "org.apache.kafka.tools.LeaderElectionCommand",
        "--bootstrap-server",
        cluster.bootstrap,
        "--election-type",
        "unclean",
        "--topic",
        TOPIC,
        "--partition",
        "0",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    wait_until(lambda: cluster.leaders(TOPIC).get(0) == node.node_id, timeout=60, what=f"{TOPIC}-0 led again")


def _produce_and_tier(cluster: KafkaCluster, node: KafkaNode, home: Path) -> tuple[int, Path]:
    """Mixed data over several segments, tiered up to the last rolled one; (its end, config)."""
    metadata = node.home / "metadata" / "__cluster_metadata-0"
    cluster.create_topic(TOPIC, configs={"segment.bytes": MiB})
    with run_sidecar(node, home / "store", home / "work", topics={"metadata_log_dir": str(metadata)}) as rlm:
        produce_mixed(cluster.bootstrap, TOPIC, 700)
        cluster.alter_topic(TOPIC, {"segment.ms": 1000})
        end = roll(cluster.bootstrap, TOPIC, node.log_dir / f"{TOPIC}-0")
        wait_tiered(rlm.url, TOPIC, 0, end - 1)
        cluster.alter_topic(TOPIC, {"segment.ms": None})  # the restored broker rolls as brokers do
        return end, rlm.config


@pytest.fixture(scope="module")
def restored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Restored]:
    require_kafka()
    home = tmp_path_factory.mktemp("restore-broker")
    cluster = KafkaCluster(home, size=1, broker_config={"metadata.log.dir": home / "node-1" / "metadata"})
    node = cluster.nodes[0]
    try:
        cluster.start()
        end, config = _produce_and_tier(cluster, node, home)
        assert len([b for b in segment_bases(node.log_dir / f"{TOPIC}-0") if b < end]) >= 3
        before = {iso: consume(cluster.bootstrap, TOPIC, 0, 0, end, isolation=iso) for iso in ISOLATIONS}
        lost = _lose_the_disk(cluster, node, home)
        done = rlm_cli("restore", "--config", config, "--topic", TOPIC, "--out", node.log_dir, timeout=300)
        assert done.returncode == 0, done.stderr
        files = shutil.copytree(node.log_dir / f"{TOPIC}-0", home / "restored-files")
        start_at = node.server_log.stat().st_size
        cluster.start_node(node.node_id)
        with node.server_log.open(encoding="utf-8", errors="replace") as log:
            log.seek(start_at)
            restart_log = log.read()
        _elect_uncleanly(cluster, node)
        yield Restored(cluster, node, end, before, lost, files, json.loads(done.stdout), config, restart_log)
    finally:
        cluster.close()


def test_restore_found_the_partition_in_the_metadata_log(restored: Restored) -> None:
    (part,) = restored.summary["partitions"]
    topic_id = (restored.lost / "partition.metadata").read_text().split("topic_id: ")[1].strip()
    assert part["topic_id"] == topic_id and part["skipped"] is None
    assert (part["log_start_offset"], part["log_end_offset"]) == (0, restored.end)
    assert part["segments"] == len([b for b in segment_bases(restored.lost) if b < restored.end])


def test_restored_files_are_the_lost_disks(restored: Restored) -> None:
    """Every file rlm wrote is the broker's own (segments, indexes, transaction index, producer
    snapshots, leader epochs, topic id); the broker's active segment was never tiered."""
    names = sorted(p.name for p in restored.files.iterdir())
    assert any(n.endswith(".txnindex") for n in names) and any(n.endswith(".snapshot") for n in names)
    for name in names:
        assert (restored.files / name).read_bytes() == (restored.lost / name).read_bytes(), name
    bases = [b for b in segment_bases(restored.lost) if b < restored.end]
    assert segment_bases(restored.files) == bases


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_restored_broker_serves_every_offset(restored: Restored, isolation: str) -> None:
    bootstrap = restored.cluster.bootstrap
    assert broker_log_start(bootstrap, TOPIC, 0) == 0
    assert broker_end(bootstrap, TOPIC, 0) == restored.end
    got = consume(bootstrap, TOPIC, 0, 0, restored.end, isolation=isolation)
    assert got == restored.before[isolation]
    if isolation == "read_committed":  # the aborted transaction really is skipped
        assert len(got) < len(restored.before["read_uncommitted"])


def test_broker_loaded_the_restored_log_as_committed(restored: Restored) -> None:
    """The broker trusted the checkpoints rlm wrote: high watermark = restored end, no warning or
    error about the partition, nothing truncated. Without a ``.kafka_cleanshutdown`` marker Kafka
    re-checks the segments from the one holding the recovery point (``LogLoader.recoverLog``):
    with the recovery point at the restored end that is the last restored segment, and only it
    (docs/restore.md, "Loading the result into a broker")."""
    lines = [ln for ln in restored.restart_log.splitlines() if f"{TOPIC}-0" in ln]
    assert any(f"initial high watermark {restored.end}" in ln for ln in lines), lines
    assert [ln for ln in lines if " WARN " in ln or " ERROR " in ln or "runcat" in ln] == []
    recovered = [ln.split("unflushed segment ")[1].split(".")[0] for ln in lines if "unflushed segment" in ln]
    last = max(b for b in segment_bases(restored.files))
    assert recovered == [str(last)]


def test_dump_log_segments_finds_nothing_wrong(restored: Restored) -> None:
    logs = sorted(restored.files.glob("*.log"))
    text = dump_log_segments(logs, "--deep-iteration")
    assert problems(text) == []
    dumped = parse_dump(text)
    assert all(f.notes == [] for f in dumped.values())
    ranges = [
        (int(b.fields["baseOffset"]), int(b.fields["lastOffset"])) for f in dumped.values() for b in f.batches
    ]
    assert ranges[0][0] == 0 and ranges[-1][1] == restored.end - 1
    assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(ranges))  # no gap, no overlap

    indexes = sorted(p for p in restored.files.iterdir() if p.suffix in (".index", ".timeindex"))
    sanity = dump_log_segments(indexes, "--index-sanity-check")
    assert sanity.count("passed sanity check") == len(indexes), sanity
    assert problems(dump_log_segments(indexes)) == []  # every entry checked against the log


def test_dump_log_segments_reads_txn_indexes_and_snapshots_as_the_brokers(restored: Restored) -> None:
    names = sorted(p.name for p in restored.files.iterdir() if p.suffix in (".txnindex", ".snapshot"))
    ours = dump_log_segments([restored.files / n for n in names])
    theirs = dump_log_segments([restored.lost / n for n in names])
    assert "producerId" in ours and problems(ours) == []
    assert ours.replace(str(restored.files), "") == theirs.replace(str(restored.lost), "")


def test_restored_broker_takes_new_writes(restored: Restored) -> None:
    produce(restored.cluster.bootstrap, TOPIC, 10, value_bytes=50)
    got = consume(restored.cluster.bootstrap, TOPIC, 0, restored.end, restored.end + 10)
    assert [r.offset for r in got] == list(range(restored.end, restored.end + 10))


def test_rlm_resumes_tiering_on_the_restored_broker(restored: Restored) -> None:
    """The sidecar's next pass on the restored log dir (its state dir lost with the disk): the
    restored segments are recognised as tiered, the one the broker appended to after the restore
    is copied from where the store ends (docs/cluster-copy.md), nothing fails."""
    # Records into the restored active segment first, while the topic rolls as brokers do: with
    # segment.ms already low, the broker would roll that old segment before appending to it, and
    # nothing new would be rolled (this test then relied on the one before it having produced).
    produce(restored.cluster.bootstrap, TOPIC, 5, value_bytes=50)
    restored.cluster.alter_topic(TOPIC, {"segment.ms": 1000})
    new_end = roll(restored.cluster.bootstrap, TOPIC, restored.node.log_dir / f"{TOPIC}-0")
    wait_until(
        lambda: checkpointed_high_watermark(restored.node.log_dir, TOPIC, 0) >= new_end,
        timeout=60,
        what="the broker's HW checkpoint covering the rolled segment",
    )
    done = rlm_cli("run", "--config", restored.config, "--once", timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["errors"] == {} and summary["segments_copied"] >= 1
    status = rlm_cli("status", "--config", restored.config)
    assert status.returncode == 0, status.stderr
    row = next(r for r in json.loads(status.stdout) if r["topic"] == TOPIC)
    assert row["highest_tiered_offset"] == new_end - 1
    # nothing restored was copied again
    assert row["remote_segments"] == restored.summary["segments"] + summary["segments_copied"]
