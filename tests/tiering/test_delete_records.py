"""rlm's DeleteRecords (rlm/tiering/delete_records.py, docs/visibility.md "DeleteRecords through
rlm"): Kafka's semantics on the history rlm holds, a store marker every sidecar honours, leader-only
in a cluster. Generated partitions (LogWriter), the real engine and the local store."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from rlm.config import settings_from_mapping
from rlm.errors import NotLeaderError, OffsetOutOfRangeError
from rlm.logdir.discovery import list_segments
from rlm.storage.local import LocalBackend
from rlm.tiering.delete_records import delete_records
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read.readers import TieredReaders
from rlm.tiering.store import object_keys
from tests.lookup.helpers import BruteLog, delete_local_segments, settings_for, write_generated


def _setup(tmp_path: Path, **settings: Any) -> tuple[Path, Path, RemoteLogManager, TieredReaders]:
    logs, store = tmp_path / "logs", tmp_path / "store"
    if not logs.exists():
        write_generated(logs, "t", 0, batches=120, seed=5, segment_bytes=8_000)
    config = settings_for([logs], options={"root": str(store)}, **settings)
    manager = RemoteLogManager(config, LocalBackend(root=str(store)))
    readers = TieredReaders(config, LocalBackend(root=str(store)), progress=manager.live_progress)
    return logs, store, manager, readers


def _manifests(store: Path) -> list[str]:
    return sorted(i.key for i in LocalBackend(root=str(store)).list(object_keys.manifests_prefix("t", 0)))


def _assert_hidden_below(readers: TieredReaders, point: int, brute: BruteLog) -> None:
    reader = readers.reader("t", 0)
    assert reader.lookup_timestamp(-2).offset == point
    for offset in (0, point - 1):
        assert not reader.lookup_offset(offset).found
        with pytest.raises(OffsetOutOfRangeError):
            reader.fetch(offset, 1 << 20)
    assert reader.lookup_offset(point).offset == point
    first = reader.fetch(point, 1 << 20).batches[0]
    assert first.base_offset <= point <= first.last_offset  # the batch holding it, as Kafka returns
    assert any(r.offset == point for r in brute.records)


def test_delete_records_raises_the_log_start_below_the_local_log(tmp_path: Path) -> None:
    logs, store, manager, readers = _setup(tmp_path)
    brute = BruteLog.scan(logs / "t-0")
    assert all(r.error is None for r in manager.run_once())
    bases = [s.base_offset for s in list_segments(logs / "t-0")]
    delete_local_segments(logs / "t-0", keep_last=2)  # the broker's local retention: remote-only now
    segments_before = [k for k in _manifests(store) if not k.rsplit("/", 1)[1].startswith("log-start-")]
    point = bases[2] + 3  # inside the third segment: the first two go, the third straddles

    done = delete_records(manager, "t", 0, point)

    assert (done.low_watermark, done.previous_log_start, done.deleted_segments) == (point, 0, 2)
    names = [k.rsplit("/", 1)[1] for k in _manifests(store)]
    assert f"log-start-{point:020d}.json" in names
    assert len([n for n in names if not n.startswith("log-start-")]) == len(segments_before) - 2
    _assert_hidden_below(readers, point, brute)
    row = manager.status()[0]
    assert (row["log_start_offset"], row["delete_records_offset"]) == (point, point)

    # never backwards; an offset at or below the log start changes nothing
    assert delete_records(manager, "t", 0, 1).low_watermark == point
    end = row["visible_end_offset"]
    with pytest.raises(OffsetOutOfRangeError):
        delete_records(manager, "t", 0, end + 1)
    with pytest.raises(OffsetOutOfRangeError):
        delete_records(manager, "t", 0, -2)
    assert delete_records(manager, "t", 0, -1).low_watermark == end  # -1: the high watermark
    assert not readers.reader("t", 0).lookup_offset(end - 1).found


def test_the_store_keeps_the_point_when_the_state_dir_is_lost(tmp_path: Path) -> None:
    logs, _store, manager, _ = _setup(tmp_path)
    brute = BruteLog.scan(logs / "t-0")
    assert all(r.error is None for r in manager.run_once())
    bases = [s.base_offset for s in list_segments(logs / "t-0")]
    point = bases[1] + 5
    delete_records(manager, "t", 0, point)
    shutil.rmtree(tmp_path / "logs.rlm-state")

    _, _, fresh, readers = _setup(tmp_path)
    assert all(r.error is None for r in fresh.run_once())
    assert fresh.status()[0]["delete_records_offset"] == point
    _assert_hidden_below(readers, point, brute)


def _cluster(tmp_path: Path, logs: Path, node: int) -> tuple[RemoteLogManager, TieredReaders]:
    store = tmp_path / "store"
    raw = {
        "log": {"dirs": [str(logs)], "eligibility": "rolled"},
        "remote": {"backend": "local", "options": {"root": str(store)}},
        "tiering": {"gc_grace_ms": 0},
        "cluster": {"leadership": "static", "node_id": node, "leaders": {"t-0": 1}},
    }
    config = settings_from_mapping(raw)
    manager = RemoteLogManager(config, LocalBackend(root=str(store)))
    return manager, TieredReaders(config, LocalBackend(root=str(store)), progress=manager.live_progress)


def test_only_the_leader_deletes_and_every_sidecar_honours_the_point(tmp_path: Path) -> None:
    first = tmp_path / "n1" / "logs"
    write_generated(first, "t", 0, batches=120, seed=5, segment_bytes=8_000)
    second = tmp_path / "n2" / "logs"
    shutil.copytree(first, second)  # the follower's replica: the same batches
    brute = BruteLog.scan(first / "t-0")
    leader, _ = _cluster(tmp_path, first, 1)
    follower, follower_readers = _cluster(tmp_path, second, 2)
    assert all(r.error is None for r in leader.run_once())
    assert all(r.error is None for r in follower.run_once())
    point = [s.base_offset for s in list_segments(first / "t-0")][1] + 2

    with pytest.raises(NotLeaderError) as refused:
        delete_records(follower, "t", 0, point)
    assert refused.value.leader == 1 and "node 1 does" in str(refused.value)
    assert follower_readers.reader("t", 0).lookup_offset(0).found

    assert delete_records(leader, "t", 0, point).low_watermark == point
    assert all(r.error is None for r in follower.run_once())  # its pass syncs from the store
    assert follower.status()[0]["delete_records_offset"] == point
    _assert_hidden_below(follower_readers, point, brute)
