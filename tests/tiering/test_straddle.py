"""Replicas that rolled at different offsets (docs/cluster-copy.md): a new leader's sidecar continues
from the highest tiered offset + 1, copying only the tail of a local segment that straddles it.

Every replica here is a real log dir written by ``LogWriter`` with the same batches (same records,
timestamps, producer fields and leader epochs: byte-identical, as Kafka's replication makes them)
and its own roll points. Replica A's sidecar tiers first; replica B's then takes over on the same
store.
"""

from __future__ import annotations

import itertools
import json
import logging
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rlm.config import Settings, load_settings
from rlm.errors import FormatError, StorageError
from rlm.formats.checkpoint import format_offset_checkpoint
from rlm.formats.indexes.remote_index import iter_entries
from rlm.formats.indexes.segment_index import rebuild_indexes
from rlm.formats.records import RecordSpec, iter_batches
from rlm.jobs.checks.verify_local import check_compaction
from rlm.logdir.discovery import SegmentFiles, discover_partitions, list_segments
from rlm.logdir.indexcheck import parse_checked
from rlm.logdir.writer import LogWriter
from rlm.storage.faults import FaultyBackend
from rlm.storage.local import LocalBackend
from rlm.storage.retry import RetryingBackend, RetryPolicy
from rlm.testing.configs import write_config
from rlm.testing.daemon import rlm_cli
from rlm.testing.store_check import assert_manifests_complete, check_store
from rlm.tiering.converge.recovery import recover
from rlm.tiering.copy.copier import copy_segment
from rlm.tiering.expire.policy import TopicPolicyResolver
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read.readers import TieredReaders
from rlm.tiering.store.manifest import SegmentManifest

TOPIC = "orders"
TS = 1_700_000_000_000
BATCHES = 60
PER_BATCH = 5
#: Leader epoch of each batch: two leader changes, the same on every replica.
EPOCH_FROM = {0: 0, 20: 1, 35: 2}
#: Replica A rolls every 10 batches; B at its own points. A's sidecar tiers through batch 29, so B's
#: segment of batches 25-43 straddles the highest tiered offset.
ROLLS_A = (10, 20, 30, 40, 50)
ROLLS_B = (7, 25, 44, 52)


def _epoch(batch: int) -> int:
    return max(e for start, e in EPOCH_FROM.items() if start <= batch)


def first_offset(batch: int) -> int:
    return batch * PER_BATCH


def last_offset(batch: int) -> int:
    return batch * PER_BATCH + PER_BATCH - 1


def write_replica(
    logs: Path,
    rolls: Sequence[int],
    *,
    batches: int = BATCHES,
    hw_batch: int | None = None,
    merge: int | None = None,
) -> Path:
    """One replica of ``orders-0``: ``batches`` batches of :data:`PER_BATCH` records, a roll before
    each batch index in ``rolls``, high watermark at the start of batch ``hw_batch`` (default: the
    log end). ``merge``: batches ``merge`` and ``merge + 1`` written as one batch (a replica whose
    batches are not the leader's)."""
    with LogWriter(logs, TOPIC, 0, index_interval_bytes=256) as w:
        i = 0
        while i < batches:
            if i in rolls:
                w.roll()
            w.leader_epoch = _epoch(i)
            count = 2 if merge == i else 1
            records = [
                RecordSpec(
                    TS + 10 * b + r, f"k{(b * PER_BATCH + r) % 7}".encode(), f"value-{b}-{r}-".encode() * 6
                )
                for b in range(i, i + count)
                for r in range(PER_BATCH)
            ]
            w.append(records, producer_id=4242, producer_epoch=3, base_sequence=i * PER_BATCH)
            i += count
        w.high_watermark = first_offset(hw_batch) if hw_batch is not None else w.log_end_offset
    return logs / f"{TOPIC}-0"


def batch_bytes(part: Path) -> dict[int, bytes]:
    """Every batch of the replica's log files: base offset → its bytes."""
    out: dict[int, bytes] = {}
    for seg in list_segments(part):
        data = seg.log.read_bytes()
        for b in iter_batches(data):
            out[b.base_offset] = data[b.position : b.end_position]
    return out


def file_hashes(part: Path) -> dict[str, bytes]:
    """The broker's own files of the partition (rlm's index family and dir marker left out)."""
    rlm_files = (".remotelogindex", ".remoteoffsetindex", ".remotetimeindex")
    return {
        p.name: p.read_bytes()
        for p in sorted(part.iterdir())
        if p.is_file() and not p.name.startswith(".") and not p.name.endswith(rlm_files)
    }


@dataclass
class Cluster:
    tmp: Path
    store: Path
    backend: LocalBackend

    def config(self, name: str, logs: Path, **tiering: Any) -> Path:
        return write_config(self.tmp / f"{name}.toml", [logs], root=self.store, **tiering)

    def manager(self, cfg: Path) -> RemoteLogManager:
        return RemoteLogManager(load_settings(cfg), self.backend, metrics=TieringMetrics())

    def manifests(self) -> list[SegmentManifest]:
        return [
            SegmentManifest.from_json(self.backend.read(i.key), key=i.key)
            for i in self.backend.list(f"{TOPIC}-0/manifests/")
        ]


def _cluster(tmp_path: Path) -> Cluster:
    store = tmp_path / "store"
    return Cluster(tmp_path, store, LocalBackend(root=str(store)))


def tier_replica_a(cluster: Cluster, *, batches: int = 40) -> Path:
    """Replica A with ``batches`` batches, tiered by its own sidecar through batch 29."""
    logs = cluster.tmp / "a"
    write_replica(logs, ROLLS_A, batches=batches, hw_batch=30)
    result = cluster.manager(cluster.config("a", logs)).run_once()[0]
    assert result.error is None and result.copied == [first_offset(0), first_offset(10), first_offset(20)]
    return logs


def remote_fetch_all(
    settings: Settings, backend: LocalBackend, manager: RemoteLogManager, end_offset: int
) -> dict[int, bytes]:
    """Fetch every offset below ``end_offset`` from the remote tier (one batch each): offset → the
    batch bytes returned. The reader answers from the remote tier even where a local copy exists."""
    readers = TieredReaders(settings, backend, progress=manager.live_progress)
    reader = readers.reader(TOPIC, 0)
    reader.remote_first = True
    out = {}
    for offset in range(end_offset):
        fetched = reader.fetch(offset, 1)
        assert fetched.tier == "remote", offset
        assert len(fetched.batches) == 1, offset
        out[offset] = fetched.data
    return out


def _assert_only_the_tail_was_uploaded(
    cluster: Cluster, partial: SegmentManifest, reference: dict[int, bytes], part_b: Path, position: int
) -> None:
    """Only the tail was uploaded: the straddling segment's bytes from `position` on (the replica's
    batches 30-43, nothing before), with indexes and remote-index entries rebuilt for that tail."""
    highest = last_offset(29)
    tail = b"".join(reference[first_offset(b)] for b in range(30, 44))
    assert cluster.backend.read(partial.log.key) == tail
    assert tail == (part_b / f"{first_offset(25):020d}.log").read_bytes()[position:]
    # Its indexes are rebuilt for the tail (the broker's describe the whole file) and pass Kafka's checks.
    tail_batches = list(iter_batches(tail))
    index, time_index = rebuild_indexes(highest + 1, tail_batches, 4096)
    assert cluster.backend.read(partial.objects["index"].key) == index
    assert cluster.backend.read(partial.objects["timeindex"].key) == time_index
    parse_checked("index", highest + 1, index, tail_batches)
    parse_checked("timeindex", highest + 1, time_index, tail_batches)
    # Its entries address the uploaded object from byte 0.
    blob = cluster.backend.read(partial.objects["segment.remotelogindex"].key)
    entries = [d.entry for d in iter_entries(blob)]
    assert entries[0].rdi.position == 0 and entries[0].first_offset == highest + 1


def test_new_leader_copies_only_the_tail_of_a_straddling_segment(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    logs_a = tier_replica_a(cluster)
    part_b = write_replica(tmp_path / "b", ROLLS_B)
    reference = batch_bytes(part_b)
    a_batches = batch_bytes(logs_a / f"{TOPIC}-0")
    assert a_batches == {k: v for k, v in reference.items() if k in a_batches}  # byte-identical replicas
    broker_files = file_hashes(part_b)
    highest = last_offset(29)
    position = next(
        b.position
        for b in iter_batches((part_b / f"{first_offset(25):020d}.log").read_bytes())
        if b.base_offset == highest + 1
    )

    cfg_b = cluster.config("b", tmp_path / "b")
    mgr_b = cluster.manager(cfg_b)
    result = mgr_b.run_once()[0]
    assert result.error is None
    assert result.copied == [first_offset(30), first_offset(44)]  # the tail of 25-43, then 44-51 whole

    manifests = cluster.manifests()
    batch_ranges = ((0, 9), (10, 19), (20, 29), (30, 43), (44, 51))
    assert [(m.base_offset, m.last_offset) for m in manifests] == [
        (first_offset(a), last_offset(b)) for a, b in batch_ranges
    ]
    for prev, nxt in itertools.pairwise(manifests):
        assert nxt.base_offset == prev.last_offset + 1  # no gap, no overlap
    partial = manifests[3]
    assert (partial.source_base_offset, partial.source_position) == (first_offset(25), position)
    assert partial.partial and not any(m.partial for i, m in enumerate(manifests) if i != 3)
    doc = json.loads(cluster.backend.read(f"{TOPIC}-0/manifests/{first_offset(44):020d}.json"))
    assert "source_base_offset" not in doc and "source_position" not in doc
    # Leader epochs of the slice's offsets only: epoch 1 in force at batch 30, epoch 2 from batch 35.
    assert partial.leader_epochs == ((1, first_offset(20)), (2, first_offset(35)))

    _assert_only_the_tail_was_uploaded(cluster, partial, reference, part_b, position)
    assert file_hashes(part_b) == broker_files  # the broker's files were only read

    # Every offset fetched from the remote tier through B's local index: the replicas' batch bytes.
    settings = load_settings(cfg_b)
    fetched = remote_fetch_all(settings, cluster.backend, mgr_b, first_offset(52))
    for offset, data in fetched.items():
        assert data == reference[offset - offset % PER_BATCH], offset
        if offset < first_offset(40):
            assert data == a_batches[offset - offset % PER_BATCH], offset

    check = check_store([tmp_path / "b"], cluster.backend, complete=False, deep=True)
    assert not check.unreferenced
    row = mgr_b.status()[0]
    assert row["copy_lag_segments"] == 0 and row["last_error"] is None
    assert row["highest_tiered_offset"] == last_offset(51)
    again = cluster.manager(cfg_b).run_once()[0]  # a restarted sidecar: nothing more to copy
    assert again.error is None and again.copied == []


def test_a_batch_across_the_highest_tiered_offset_is_refused(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    tier_replica_a(cluster)
    # Replica C wrote batches 29 and 30 as one batch: offsets 145-154 straddle the tiered 149.
    part_c = write_replica(tmp_path / "c", ROLLS_B, merge=29)
    before = {i.key for i in cluster.backend.list("")}
    mgr = cluster.manager(cluster.config("c", tmp_path / "c"))
    result = mgr.run_once()[0]
    assert result.error is not None
    assert str(part_c / f"{first_offset(25):020d}.log") in result.error
    assert f"batch {first_offset(29)}-{last_offset(30)}" in result.error
    assert f"highest tiered offset {last_offset(29)}" in result.error
    assert {i.key for i in cluster.backend.list("")} == before  # nothing uploaded
    row = mgr.status()[0]
    assert row["last_error"] == result.error and row["copy_lag_segments"] == 2
    assert (tmp_path / "c.rlm-state").is_dir()
    assert not list((tmp_path / "c.rlm-state").glob("*/staging/*/*.log*"))  # the copy's pin is dropped
    pinned = sorted(p.parent.name for p in (tmp_path / "c.rlm-state").glob("*/pins/*/segment.log"))
    assert pinned == [f"{s.base_offset:020d}" for s in list_segments(part_c)[-3:-1]]  # held on sight


def test_a_corrupt_tail_is_quarantined_as_the_brokers_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = _cluster(tmp_path)
    tier_replica_a(cluster)
    part_b = write_replica(tmp_path / "b", ROLLS_B)
    seg = part_b / f"{first_offset(25):020d}.log"
    data = bytearray(seg.read_bytes())
    bad = next(b for b in iter_batches(bytes(data)) if b.base_offset == first_offset(36))
    data[bad.end_position - 3] ^= 0xFF  # a record byte: the batch CRC no longer matches
    seg.write_bytes(bytes(data))
    before = {i.key for i in cluster.backend.list("")}
    cfg = cluster.config("b", tmp_path / "b")
    for n in range(2):  # the quarantine holds (is not lifted) while the broker's file is unchanged
        mgr = cluster.manager(cfg)
        result = mgr.run_once()[0]
        assert result.copied == []
        if n == 0:
            assert result.error is not None and result.error.startswith("quarantined:")
        q = mgr.status()[0]["quarantine"]
        assert [(x["base_offset"], x["file"], x["position"], x["cause"]) for x in q] == [
            (first_offset(25), str(seg), bad.position, "corrupt")
        ]
    assert not [r for r in caplog.records if "lifting its quarantine" in r.getMessage()]
    assert {i.key for i in cluster.backend.list("")} == before


def _segment(part: Path, base: int) -> SegmentFiles:
    return next(s for s in list_segments(part) if s.base_offset == base)


def test_a_different_segment_at_the_same_base_names_what_differs(tmp_path: Path) -> None:
    """Two sidecars race: A copies its segment 150-199 after B committed 150-219 (the manifest's
    conditional create decides; the loser's message says what differs)."""
    cluster = _cluster(tmp_path)
    logs_a = tier_replica_a(cluster, batches=BATCHES)
    write_replica(tmp_path / "b", ROLLS_B)
    assert cluster.manager(cluster.config("b", tmp_path / "b")).run_once()[0].error is None
    mgr_a = cluster.manager(cluster.config("a", logs_a))
    ctx = mgr_a.context(mgr_a.discover()[0])
    recover(ctx)
    before = {i.key for i in cluster.backend.list("")}
    with pytest.raises(StorageError) as raised:
        copy_segment(ctx, _segment(logs_a / f"{TOPIC}-0", first_offset(30)))
    msg = str(raised.value)
    assert f"different segment at base offset {first_offset(30)}" in msg
    remote = next(m for m in cluster.manifests() if m.base_offset == first_offset(30))
    assert f"remote: offsets {first_offset(30)}-{last_offset(43)}, {remote.size_bytes} bytes" in msg
    assert f"log CRC-32C {remote.log.crc32c:#010x}" in msg
    assert f"leader epochs [1@{first_offset(20)}, 2@{first_offset(35)}]" in msg
    assert f"local: offsets {first_offset(30)}-{last_offset(39)}" in msg
    # The loser's objects stay until recovery or GC collects the open attempt.
    recover(ctx)
    assert {i.key for i in cluster.backend.list("")} == before


def test_a_duplicate_upload_is_dropped_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Identical replicas, both sidecars copying the same segments: the second keeps the first's, says so."""
    cluster = _cluster(tmp_path)
    logs = [tmp_path / "r1", tmp_path / "r2"]
    for d in logs:
        write_replica(d, ROLLS_A, batches=40)
    first = cluster.manager(cluster.config("r1", logs[0])).run_once()[0]
    assert first.error is None and first.copied == [0, 50, 100]
    late = cluster.manager(cluster.config("r2", logs[1]))
    ctx = late.context(late.discover()[0])
    ctx.family.open()  # what recovery does first; recovery itself would learn the store's state
    with caplog.at_level(logging.INFO, logger="rlm.tiering.copy.copier"):
        results = [copy_segment(ctx, seg) for seg in list_segments(logs[1] / f"{TOPIC}-0")[:-1]]
    assert all(r is not None and r.already_committed for r in results)
    kept = [r.getMessage() for r in caplog.records if "already tiered by another sidecar" in r.getMessage()]
    assert len(kept) == 3 and f"segment {first_offset(10)}-{last_offset(19)}" in kept[1]
    assert "dropped this node's duplicate upload" in kept[0]
    assert assert_manifests_complete(cluster.backend) == set()
    for d in logs:
        check_store([d], cluster.backend, deep=True)


def _compaction_findings(cfg: Path, manifests: list[SegmentManifest]) -> list[tuple[str, int | None]]:
    settings = load_settings(cfg)
    part = discover_partitions(settings.log.dirs)[0]
    policy = TopicPolicyResolver(settings).policy(TOPIC)
    return [(p.severity, p.base_offset) for p in check_compaction(part, manifests, policy)]


def test_verify_tells_a_replica_rolled_elsewhere_from_a_rewrite(tmp_path: Path) -> None:
    """``rlm verify``'s compaction check: other roll points (and a partial copy, and local
    retention cutting a tiered segment) are no rewrite; batches missing locally are one."""
    cluster = _cluster(tmp_path)
    tier_replica_a(cluster)
    part_b = write_replica(tmp_path / "b", ROLLS_B)
    cfg_b = cluster.config("b", tmp_path / "b")
    assert cluster.manager(cfg_b).run_once()[0].error is None
    manifests = cluster.manifests()
    assert _compaction_findings(cfg_b, manifests) == []
    # Local retention removed B's first two segments: A's tiered 100-149 now begins before B's log.
    for seg in list_segments(part_b)[:2]:
        for path in (seg.log, seg.index, seg.time_index):
            assert path is not None
            path.unlink()
    assert _compaction_findings(cfg_b, manifests) == []

    # The cleaner drops a batch of the segment holding 125-219: the tiers now disagree there.
    seg = _segment(part_b, first_offset(25))
    data = seg.log.read_bytes()
    dropped = next(b for b in iter_batches(data) if b.base_offset == first_offset(33))
    seg.log.write_bytes(data[: dropped.position] + data[dropped.end_position :])
    assert seg.index is not None and seg.time_index is not None
    seg.index.unlink()
    seg.time_index.unlink()
    assert _compaction_findings(cfg_b, manifests) == [("error", first_offset(25))]


# --- crash safety of a partial copy (a real `rlm run --once`, SIGKILLed at each crash point) -------


@pytest.mark.integration
@pytest.mark.parametrize(
    "point", ["after_pin", "mid_upload", "after_data", "after_manifest", "mid_local_append"]
)
def test_a_partial_copy_killed_at_a_crash_point_converges(tmp_path: Path, point: str) -> None:
    cluster = _cluster(tmp_path)
    tier_replica_a(cluster)
    # B's sidecar first learns the store's state (its index family catches up with A's segments)
    # while nothing of B's is committed yet; then the high watermark moves and the copy is killed.
    part_b = write_replica(tmp_path / "b", ROLLS_B, hw_batch=30)
    cfg = cluster.config("b", tmp_path / "b", index_entry_bytes=512)
    assert rlm_cli("run", "--config", cfg, "--once").returncode == 0
    (tmp_path / "b" / "replication-offset-checkpoint").write_text(
        format_offset_checkpoint({(TOPIC, 0): first_offset(BATCHES)})
    )
    proc = rlm_cli("run", "--config", cfg, "--once", env={"RLM_CRASH_AT": f"{point}:1"})
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-2000:])
    orphans = assert_manifests_complete(cluster.backend)  # no visible segment without its data
    bases = [m.base_offset for m in cluster.manifests()]
    committed = point in ("after_manifest", "mid_local_append")  # killed in the partial copy, committed
    assert bases == [0, 50, 100] + ([first_offset(30)] if committed else [])
    if point == "after_data":  # the killed attempt's, and the next segment's (pipelined) started meanwhile
        crashed, pipelined = (f"/data/{first_offset(n):020d}-" for n in (30, 44))
        assert any(crashed in k for k in orphans) and all(crashed in k or pipelined in k for k in orphans)

    proc = rlm_cli("run", "--config", cfg, "--once")
    assert proc.returncode == 0, proc.stderr
    assert [(m.base_offset, m.source_base_offset) for m in cluster.manifests()] == [
        (0, None),
        (50, None),
        (100, None),
        (first_offset(30), first_offset(25)),
        (first_offset(44), None),
    ]
    check = check_store([tmp_path / "b"], cluster.backend, complete=False, deep=True)
    assert not check.unreferenced
    assert rlm_cli("gc", "--config", cfg).returncode == 0
    mgr = cluster.manager(cfg)
    fetched = remote_fetch_all(load_settings(cfg), cluster.backend, mgr, first_offset(52))
    reference = batch_bytes(part_b)
    assert all(data == reference[o - o % PER_BATCH] for o, data in fetched.items())
    assert not any(p.name.endswith(".tail") for p in tmp_path.rglob("*"))


# --- the manifest fields ----------------------------------------------------------------------------


def _manifest_doc(**extra: Any) -> dict[str, Any]:
    obj = {"key": "orders-0/data/x/segment.log", "size": 10, "crc32c": 1}
    return {
        "format_version": 1,
        "topic": TOPIC,
        "partition": 0,
        "base_offset": 150,
        "last_offset": 219,
        "first_timestamp": 1,
        "max_timestamp": 2,
        "size_bytes": 10,
        "record_batches": 1,
        "index_entries": 1,
        "attempt_id": "a",
        "created_ms": 0,
        "objects": {"log": obj},
        "leader_epochs": [[1, 100]],
        **extra,
    }


def test_manifest_source_fields_are_optional_and_checked() -> None:
    old = SegmentManifest.from_json(json.dumps(_manifest_doc()).encode())
    assert (old.source_base_offset, old.source_position, old.partial) == (None, None, False)
    assert b"source_" not in old.to_json()
    part = SegmentManifest.from_json(
        json.dumps(_manifest_doc(source_base_offset=125, source_position=9000)).encode()
    )
    assert (part.source_base_offset, part.source_position, part.partial) == (125, 9000, True)
    assert SegmentManifest.from_json(part.to_json()) == part
    assert part.same_segment_as(old)  # where the bytes were cut from is not what they are
    for bad in (
        {"source_position": -1},
        {"source_base_offset": "125"},
        {"source_position": None},
        {"source_base_offset": True},
    ):
        with pytest.raises(FormatError, match=f"m.json: manifest field {next(iter(bad))}"):
            SegmentManifest.from_json(json.dumps(_manifest_doc(**bad)).encode(), key="m.json")


def test_a_copy_finding_its_segment_committed_drops_its_duplicate_through_the_retry_layer(
    tmp_path: Path,
) -> None:
    """The duplicate upload's delete (once a call no retry covered) goes through the one retry
    layer of the store like every other call: a transient failure of it is retried, the copy
    keeps the committed manifest, nothing of the duplicate stays; the manager's meter counts both attempts."""
    cluster = _cluster(tmp_path)
    logs = [tmp_path / "r1", tmp_path / "r2"]
    for d in logs:
        write_replica(d, ROLLS_A, batches=40)
    assert cluster.manager(cluster.config("r1", logs[0])).run_once()[0].error is None
    committed = {i.key for i in cluster.backend.list("")}
    flaky = FaultyBackend.wrap(cluster.backend, error_rate=1.0, max_faults=1, operations=["delete"])
    store = RetryingBackend(flaky, RetryPolicy(max_attempts=2, sleep=lambda s: None))
    late = RemoteLogManager(load_settings(cluster.config("r2", logs[1])), store, metrics=TieringMetrics())
    ctx = late.context(late.discover()[0])
    ctx.family.open()  # what recovery does first; recovery itself would learn the store's state
    result = copy_segment(ctx, list_segments(logs[1] / f"{TOPIC}-0")[0])
    assert result is not None and result.already_committed
    assert flaky.injected["error"] == 1  # the first delete failed ...
    assert {i.key for i in cluster.backend.list("")} == committed  # ... and was retried: all gone
    deleted = late.shared.metrics.requests.totals()["delete"]
    uploaded = late.shared.metrics.requests.totals()["put"] - 1  # the manifest create lost
    assert deleted == uploaded + 1  # every duplicate object once, plus the failed attempt
