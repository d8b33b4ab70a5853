"""Idle partitions in cluster mode (docs/cluster.md "Idle partitions"): a leader whose partition
did not change skips its pass and asks the store nothing — its store changes only by its own hand
while its leader epoch stands — until a new leader epoch or the hourly re-listing
(``roles.RESYNC_MS``). Idle a whole pass interval, it writes an idle note; a follower whose listing
shows a note of its leader and epoch that covers its own replica idles too, and lists again when
its replica moves — within one pass of the leader's next commit."""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from pathlib import Path

import pytest

from rlm.cli.generate import generate_log_dir
from rlm.cluster.leadership import Leadership
from rlm.config import load_settings
from rlm.formats.records import RecordSpec
from rlm.logdir.discovery import PartitionDir
from rlm.logdir.writer import LogWriter
from rlm.storage.local import LocalBackend
from rlm.testing.configs import write_config
from rlm.testing.counting import CountingBackend
from rlm.tiering.idle import IDLE_GC_MS
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.pass_result import PassResult
from rlm.tiering.roles import RESYNC_MS
from rlm.tiering.store import IdleNote, object_keys

TOPIC = "calm"


class _Clock:
    def __init__(self) -> None:
        self.ms = int(time.time() * 1000)

    def __call__(self) -> int:
        return self.ms


class _EpochSource:
    """A KRaft-like source: this node (1) leads in ``epoch``, which a test moves."""

    name = "kraft"
    node_id: int | None = 1

    def __init__(self, *, sole: bool = False) -> None:
        self.epoch = 5
        self.sole = sole

    def refresh(self) -> None:
        return None

    def leadership(self, topic: str, partition: int) -> Leadership:
        return Leadership("leader", 1, self.epoch, self.name, sole=self.sole)

    def describe(self) -> dict[str, object]:
        return {"source": self.name, "node_id": 1, "error": None}


def _manager(tmp_path: Path, *, node: int, leader: int) -> tuple[RemoteLogManager, CountingBackend, _Clock]:
    log_dir, store = tmp_path / "logs", tmp_path / "store"
    if not log_dir.exists():
        generate_log_dir(log_dir, [(TOPIC, 1)], seed=5, records=400, segment_bytes=8 * 1024)
    cfg = write_config(  # each node its own state dir, as on two brokers
        tmp_path / f"node-{node}.toml",
        [log_dir],
        root=store,
        gc_grace_ms=3_600_000,
        state_dir=str(tmp_path / f"state-{node}"),
    )
    with cfg.open("a") as fh:
        fh.write(
            f'[cluster]\nnode_id = {node}\nleadership = "static"\n[cluster.leaders]\n"{TOPIC}-0" = {leader}\n'
        )
    counting, clock = CountingBackend(LocalBackend(root=str(store))), _Clock()
    mgr = RemoteLogManager(load_settings(cfg), counting, metrics=TieringMetrics(), clock_ms=clock)
    return mgr, counting, clock


def _pass(mgr: RemoteLogManager, counting: CountingBackend) -> tuple[bool, int]:
    """One pass (no GC): whether it was idle, and the store requests it made."""
    time.sleep(0.15)  # past the settle time of what the previous pass left (idle.py)
    before = counting.total
    (result,) = mgr.run_once(gc=False)
    assert result.error is None, result.error
    return result.idle, counting.total - before


def _settle(mgr: RemoteLogManager, counting: CountingBackend) -> None:
    for _ in range(4):
        if _pass(mgr, counting)[0]:
            return
    pytest.fail("the partition never went idle")


def test_an_idle_leader_asks_the_store_nothing_until_the_hourly_listing(tmp_path: Path) -> None:
    mgr, counting, clock = _manager(tmp_path, node=1, leader=1)
    _settle(mgr, counting)
    assert [_pass(mgr, counting) for _ in range(3)] == [(True, 0)] * 3

    clock.ms += RESYNC_MS  # an hour on: the leader lists its store again, once
    idle, requests = _pass(mgr, counting)
    assert not idle and counting.calls["list"] >= 1 and requests >= 1
    assert _pass(mgr, counting) == (True, 0)


def test_a_new_leader_epoch_is_not_the_pass_that_was_marked(tmp_path: Path) -> None:
    mgr, counting, _clock = _manager(tmp_path, node=1, leader=1)
    source = _EpochSource()
    mgr.roles.source = source
    _settle(mgr, counting)
    assert _pass(mgr, counting) == (True, 0)

    source.epoch += 1  # another replica led in between: what it committed is learned from the store
    lists = counting.calls["list"]
    idle, _ = _pass(mgr, counting)
    assert not idle and counting.calls["list"] > lists
    puts = counting.calls["put"]
    idle, _ = _pass(mgr, counting)  # idle a whole interval in the new epoch: the note says so
    assert not idle and counting.calls["put"] == puts + 1
    assert _note(tmp_path).epoch == source.epoch
    assert _pass(mgr, counting) == (True, 0)


def test_a_sole_replica_writes_no_note(tmp_path: Path) -> None:
    """A partition whose only replica is this node has no follower to tell."""
    mgr, counting, _clock = _manager(tmp_path, node=1, leader=1)
    mgr.roles.source = _EpochSource(sole=True)
    _settle(mgr, counting)
    assert _pass(mgr, counting) == (True, 0)
    assert not (tmp_path / "store" / "manifests").exists() or _note_key(tmp_path) not in _keys(tmp_path)


def test_a_follower_lists_every_pass_until_its_leader_writes_the_note(tmp_path: Path) -> None:
    leader, leader_store, _ = _manager(tmp_path, node=1, leader=1)
    assert _pass(leader, leader_store)[0] is False  # copies
    assert _pass(leader, leader_store)[0] is False  # idle once: marked, not announced yet
    follower, counting, _ = _manager(tmp_path, node=2, leader=1)
    for _ in range(3):
        lists = counting.calls["list"]
        idle, requests = _pass(follower, counting)
        assert not idle and requests >= 1 and counting.calls["list"] == lists + 1

    puts = leader_store.calls["put"]
    assert _pass(leader, leader_store)[0] is False  # idle a whole interval: writes the note
    assert leader_store.calls["put"] == puts + 1
    assert _pass(leader, leader_store) == (True, 0)
    assert _pass(follower, counting)[0] is False  # lists, reads the note: covered
    assert [_pass(follower, counting) for _ in range(3)] == [(True, 0)] * 3


def test_a_note_of_another_epoch_or_a_malformed_one_keeps_the_follower_listing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    leader, leader_store, _ = _manager(tmp_path, node=1, leader=1)
    _settle(leader, leader_store)
    good = _note(tmp_path)
    follower, counting, _ = _manager(tmp_path, node=2, leader=1)
    _settle(follower, counting)
    assert _pass(follower, counting) == (True, 0)

    key = _note_key(tmp_path)
    store = LocalBackend(root=str(tmp_path / "store"))
    for body in (
        dataclasses.replace(good, epoch=4).to_json(),
        dataclasses.replace(good, node_id=3).to_json(),
    ):
        store.put(key, body)  # not this leader, or not this epoch: proves nothing
        (tmp_path / "logs" / f"{TOPIC}-0" / "moved").write_bytes(body)  # the replica moved
        assert [_pass(follower, counting)[0] for _ in range(2)] == [False, False]

    store.put(key, b'{"epoch": null, "node_id": "1"}')  # a hostile bucket
    with caplog.at_level(logging.WARNING):
        assert [_pass(follower, counting)[0] for _ in range(2)] == [False, False]
    assert sum("malformed idle note" in r.getMessage() and key in r.getMessage() for r in caplog.records) == 1

    store.put(key, good.to_json())
    assert _pass(follower, counting)[0] is False
    assert _pass(follower, counting) == (True, 0)


def test_a_follower_lists_again_when_its_replica_moves_and_sees_the_next_commit_within_one_pass(
    tmp_path: Path,
) -> None:
    writer = LogWriter(tmp_path / "logs", TOPIC, 0, segment_bytes=4096)
    try:
        _produce(writer)
        leader, leader_store, _ = _manager(tmp_path, node=1, leader=1)
        follower, counting, _ = _manager(tmp_path, node=2, leader=1)
        _settle(leader, leader_store)
        _settle(follower, counting)
        assert _pass(follower, counting) == (True, 0)
        tiered = _highest(leader)

        _produce(writer)  # new records rolled and committed by the broker; the leader has not passed
        for _ in range(2):  # the note no longer covers the replica: the follower lists every pass
            lists = counting.calls["list"]
            assert _pass(follower, counting)[0] is False and counting.calls["list"] == lists + 1
        assert _highest(follower) == tiered

        assert _pass(leader, leader_store)[0] is False  # the leader copies
        assert _highest(leader) > tiered
        assert _pass(follower, counting)[0] is False
        assert _highest(follower) == _highest(leader)  # learnt within one pass of the commit

        _settle(leader, leader_store)  # idle a whole interval again: a new note
        _settle(follower, counting)
        assert _pass(follower, counting) == (True, 0)
    finally:
        writer.close()


def test_gc_passes_over_a_partition_idle_since_a_gc_found_nothing_in_it(tmp_path: Path) -> None:
    """#35 items 4-5: GC (3 LISTs, a HEAD and a GET per partition, every 15 minutes by default)
    was what an idle leader still asked the store; now once a day (idle.IDLE_GC_MS)."""
    mgr, counting, clock = _manager(tmp_path, node=1, leader=1)
    _settle(mgr, counting)

    def gc() -> int:
        before = counting.total
        assert mgr.collect_garbage() == []
        return counting.total - before

    gc()  # the first reads the manifests' stamps too
    baseline = gc()  # the mark is younger than the grace: an attempt begun before it may be young
    assert baseline >= 2 and gc() == baseline
    clock.ms += 3_600_000  # the grace (gc_grace_ms) since the mark: this GC judges everything
    assert gc() == baseline
    skipped = gc()
    assert skipped < baseline and [gc() for _ in range(2)] == [skipped] * 2
    assert mgr.collect_garbage(dry_run=True) == [] and counting.total > 0  # a report looks anyway
    clock.ms += RESYNC_MS  # the hourly listing finds the same: the partition stayed idle all along
    assert _pass(mgr, counting)[0] is False
    assert gc() == skipped

    clock.ms += IDLE_GC_MS  # a day on: once more, then passed over again
    assert gc() == baseline and gc() == skipped
    (tmp_path / "logs" / f"{TOPIC}-0" / "moved").write_bytes(b"")
    assert _pass(mgr, counting)[0] is False  # the partition moved: a new mark, GC looks again
    assert gc() == baseline


def _produce(writer: LogWriter) -> None:
    """Records enough for a few rolled segments, all committed (HW = log end)."""
    for b in range(30):
        writer.append([RecordSpec(1_700_000_000_000 + b, b"k", bytes(200)) for _ in range(3)])
    writer.roll()
    writer.high_watermark = writer.log_end_offset
    writer.write_checkpoints()


def _highest(mgr: RemoteLogManager) -> int:
    (ctx,) = mgr.contexts()
    return ctx.store.chain.highest


def _keys(tmp_path: Path) -> set[str]:
    return {i.key for i in LocalBackend(root=str(tmp_path / "store")).list("")}


def _note_key(tmp_path: Path) -> str:
    (key,) = [k for k in _keys(tmp_path) if k.endswith("/manifests/" + object_keys.IDLE_NOTE)]
    return key


def _note(tmp_path: Path) -> IdleNote:
    store = LocalBackend(root=str(tmp_path / "store"))
    return IdleNote.from_json(store.read(_note_key(tmp_path)), key="note")


def test_the_daemon_sweep_hands_only_partitions_that_are_not_idle_to_its_pass_threads(tmp_path: Path) -> None:
    """At 10 000 partitions, handing each idle one to a pass thread every sweep cost more than its
    idle check: the sweep checks on its own thread and submits only the others."""
    from rlm.daemon.scheduler import TieringDaemon

    mgr, counting, _clock = _manager(tmp_path, node=1, leader=1)
    _settle(mgr, counting)
    passes: list[str] = []
    run = mgr.run_partition

    def counted(part: PartitionDir, **kw: bool) -> PassResult:
        passes.append(part.name)
        return run(part, **kw)

    mgr.run_partition = counted  # type: ignore[method-assign]
    daemon = TieringDaemon(mgr)
    try:
        idle_before = mgr.shared.metrics.registry.get_sample_value("rlm_partition_passes_idle_total") or 0
        daemon.discover()  # a new partition to the daemon, idle to the manager: checked, not passed
        daemon.sweep()
        assert passes == [] and daemon._submitted == {}
        idle_after = mgr.shared.metrics.registry.get_sample_value("rlm_partition_passes_idle_total") or 0
        assert idle_after == idle_before + 2

        (tmp_path / "logs" / f"{TOPIC}-0" / "new.file").write_bytes(b"")  # the directory changed
        daemon.sweep()
        daemon._submitted[f"{TOPIC}-0"].result(timeout=60)
        assert passes == [f"{TOPIC}-0"]
    finally:
        daemon.passes.shutdown()


def test_a_leader_does_not_read_back_the_manifests_it_committed(tmp_path: Path) -> None:
    """The next pass's listing shows the leader's own manifests under the stamp the store's put
    answered (``local``: size and mtime, as its listing): nothing of them is read back."""
    writer = LogWriter(tmp_path / "logs", TOPIC, 0, segment_bytes=4096)
    try:
        _produce(writer)
        leader, counting, _ = _manager(tmp_path, node=1, leader=1)
        assert _pass(leader, counting)[0] is False
        committed = {k for k in _keys(tmp_path) if k.endswith(".json") and "/manifests/0" in k}
        assert committed
        _produce(writer)  # more rolled segments: the next pass lists the store and copies them
        reads = collections.Counter(counting.ranges)
        assert _pass(leader, counting)[0] is False
        read_back = {key for (key, _s, _e), n in counting.ranges.items() if n > reads[(key, _s, _e)]}
        assert not read_back & committed
        assert {k for k in _keys(tmp_path) if "/manifests/0" in k} > committed  # it did copy
    finally:
        writer.close()
