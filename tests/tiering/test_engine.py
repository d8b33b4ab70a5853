"""In-process tests of the engine with the real local backend: the log store racing the copy,
`rlm status` beside a running copy, index rotation by size and time, torn-tail repair."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from rlm.cli.generate import generate_log_dir
from rlm.config import load_settings
from rlm.formats import naming
from rlm.formats.indexes.remote_index import iter_entries
from rlm.logdir.discovery import list_segments
from rlm.storage.api import ListPage, ObjectInfo
from rlm.storage.local import LocalBackend
from rlm.testing.configs import write_config
from rlm.testing.store_check import check_store
from rlm.tiering.copy import prepare
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.manager import RemoteLogManager
from tests.tiering.helpers import local_index_files

TOPIC = "eng"


class HookedLocal(LocalBackend):
    """The real local backend with a hook before each put (to act as the log store / an operator)."""

    def __init__(self, hook: Any = None, **options: Any) -> None:
        super().__init__(**options)
        self.hook = hook

    def _put(self, key: str, stream: BinaryIO, if_absent: bool) -> ObjectInfo:
        if self.hook is not None:
            self.hook(key)
        return super()._put(key, stream, if_absent)


def _setup(tmp_path: Path, *, records: int = 400, **tiering: Any) -> tuple[Path, Path]:
    logs = tmp_path / "logs"
    generate_log_dir(logs, [(TOPIC, 1)], seed=5, records=records, segment_bytes=8 * 1024)
    cfg = write_config(tmp_path / "c.toml", [logs], root=tmp_path / "store", **tiering)
    return logs, cfg


def _manager(cfg: Path, backend: Any, clock: Any = None) -> RemoteLogManager:
    return RemoteLogManager(load_settings(cfg), backend, metrics=TieringMetrics(), clock_ms=clock)


def _metric(manager: RemoteLogManager, name: str) -> float:
    value = manager.shared.metrics.registry.get_sample_value(name, {"topic": TOPIC, "partition": "0"})
    return value or 0.0


# --- the log store deletes/renames segments -------------------------------------------------------


def test_rename_to_deleted_right_after_pin_does_not_break_the_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs, cfg = _setup(tmp_path)
    part = logs / f"{TOPIC}-0"
    originals = {s.base_offset: s.log.read_bytes() for s in list_segments(part)}
    real_pin = prepare.pin
    renamed = []

    def pin_then_store_deletes(segment: Any, partition_dir: Path, pin_dir: Path) -> dict[str, Path]:
        pinned = real_pin(segment, partition_dir, pin_dir)
        if len(renamed) < 2:  # Kafka's retention: rename to .deleted, then unlink
            deleted = segment.log.with_name(segment.log.name + ".deleted")
            os.rename(segment.log, deleted)
            renamed.append(segment.base_offset)
            if len(renamed) == 2:
                deleted.unlink()
        return pinned

    monkeypatch.setattr(prepare, "pin", pin_then_store_deletes)
    backend = LocalBackend(root=str(tmp_path / "store"))
    manager = _manager(cfg, backend)
    results = manager.run_once()
    assert [r.error for r in results] == [None]
    assert results[0].copied[:2] == renamed
    for base in renamed:  # the right bytes were uploaded although the .log is gone
        key = f"{TOPIC}-0/manifests/{base:020d}.json"
        log_key = json.loads(backend.read(key))["objects"]["log"]["key"]
        assert backend.read(log_key) == originals[base]
    assert not (part / naming.segment_file_name(renamed[1], naming.LOG)).exists()
    assert _metric(manager, "rlm_segments_deleted_before_copy_total") == 0


def test_rename_during_upload_does_not_break_the_copy(tmp_path: Path) -> None:
    logs, cfg = _setup(tmp_path)
    part = logs / f"{TOPIC}-0"
    first = list_segments(part)[0]
    original = first.log.read_bytes()

    def hook(key: str) -> None:
        if key.endswith("segment.log") and first.log.exists():
            first.log.rename(first.log.with_name(first.log.name + ".deleted"))

    backend = HookedLocal(hook, root=str(tmp_path / "store"))
    manager = _manager(cfg, backend)
    assert [r.error for r in manager.run_once()] == [None]
    check = check_store([logs], backend, complete=False)
    doc = check.partitions[f"{TOPIC}-0"].manifests[0]
    assert doc["base_offset"] == first.base_offset
    assert backend.read(doc["objects"]["log"]["key"]) == original


def test_segment_deleted_before_pin_is_skipped_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs, cfg = _setup(tmp_path)
    part = logs / f"{TOPIC}-0"
    segments = list_segments(part)
    victim = segments[1]
    real_pin = prepare.pin

    def store_deletes_first(segment: Any, partition_dir: Path, pin_dir: Path) -> dict[str, Path]:
        if segment.base_offset == victim.base_offset and segment.log.exists():
            for path in (segment.log, segment.index, segment.time_index):
                if path is not None:
                    path.unlink()
        return real_pin(segment, partition_dir, pin_dir)

    monkeypatch.setattr(prepare, "pin", store_deletes_first)
    backend = LocalBackend(root=str(tmp_path / "store"))
    manager = _manager(cfg, backend)
    results = manager.run_once()
    assert results[0].error is None
    assert victim.base_offset not in results[0].copied
    assert results[0].copied[0] == segments[0].base_offset and len(results[0].copied) >= 3
    assert _metric(manager, "rlm_segments_deleted_before_copy_total") == 1
    monkeypatch.setattr(prepare, "pin", real_pin)
    # The daemon keeps going: the next pass neither fails nor re-reports the gap.
    assert [r.error for r in manager.run_once()] == [None]
    check = check_store([logs], backend)
    assert victim.base_offset not in check.remote_bases(f"{TOPIC}-0")


# --- status beside a running copy -----------------------------------------------------------------


def test_status_beside_a_running_copy_does_not_abort_it(tmp_path: Path) -> None:
    """`rlm status` (another process: another manager) while a copy is in flight must not touch
    the in-flight attempt, else the copy commits a manifest whose data was deleted."""
    logs, cfg = _setup(tmp_path)
    store = tmp_path / "store"
    observer = _manager(cfg, LocalBackend(root=str(store)))
    calls = []

    def hook(key: str) -> None:
        if key.endswith("segment.index") and not calls:  # segment.log is already uploaded
            calls.append(observer.status())

    backend = HookedLocal(hook, root=str(store))
    assert [r.error for r in _manager(cfg, backend).run_once(gc=False)] == [None]
    assert calls and calls[0][0]["remote_segments"] == 0
    check = check_store([logs], backend)
    assert not check.unreferenced


# --- rotation ---------------------------------------------------------------------------------------


def test_rotation_by_size(tmp_path: Path) -> None:
    logs, cfg = _setup(tmp_path, records=600, index_entry_bytes=1024, index_rotate_bytes=1200)
    part = logs / f"{TOPIC}-0"
    hw_file = logs / "replication-offset-checkpoint"
    full = hw_file.read_text()
    bases = [s.base_offset for s in list_segments(part)]
    # First pass: only the first half is committed.
    hw_file.write_text(f"0\n1\n{TOPIC} 0 {bases[len(bases) // 2]}\n")
    backend = LocalBackend(root=str(tmp_path / "store"))
    assert [r.error for r in _manager(cfg, backend).run_once()] == [None]
    first = check_store([logs], backend)
    sets_before = local_index_files([logs])
    assert len(first.partitions[f"{TOPIC}-0"].set_bases) >= 2
    hw_file.write_text(full)
    assert [r.error for r in _manager(cfg, backend).run_once()] == [None]
    check = check_store([logs], backend)
    pc = check.partitions[f"{TOPIC}-0"]
    assert len(pc.set_bases) > len(first.partitions[f"{TOPIC}-0"].set_bases)
    after = local_index_files([logs])
    # Sealed sets are never written again; only the then-active one may have grown.
    sealed = sorted(k for k in sets_before if k.endswith(".remotelogindex"))[:-1]
    for name in sealed:
        for suffix in (".remotelogindex", ".remoteoffsetindex", ".remotetimeindex"):
            key = name.replace(".remotelogindex", suffix)
            assert after[key] == sets_before[key], key
    paths = sorted(part.glob("*.remotelogindex"))
    for path in paths:
        entries = list(iter_entries(path.read_bytes()))
        assert entries[0].entry.first_offset == naming.parse_base_offset(path.name)
    # A set is sealed only once it reached the limit (rotation happens at a segment boundary).
    assert all(p.stat().st_size >= 1200 for p in paths[:-1])


def test_rotation_by_time_with_a_fake_clock(tmp_path: Path) -> None:
    logs, cfg = _setup(tmp_path, records=600, index_rotate_ms=3_600_000)
    part = logs / f"{TOPIC}-0"
    hw_file = logs / "replication-offset-checkpoint"
    bases = [s.base_offset for s in list_segments(part)]
    backend = LocalBackend(root=str(tmp_path / "store"))
    now = [1_900_000_000_000]
    expected_bases = []
    for step, upto in enumerate((2, 4, 5, 7)):
        hw_file.write_text(f"0\n1\n{TOPIC} 0 {bases[upto]}\n")
        manager = _manager(cfg, backend, clock=lambda: now[0])
        result = manager.run_once()[0]
        assert result.error is None and result.copied
        if step != 2:  # step 2 comes only 10 minutes later: no rotation
            expected_bases.append(result.copied[0])
        now[0] += 600_000 if step == 1 else 2 * 3_600_000
    check = check_store([logs], backend)
    assert check.partitions[f"{TOPIC}-0"].set_bases == expected_bases


# --- torn tail repair ---------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["truncate_mid_entry", "flip_byte_in_last_entry"])
def test_torn_tail_is_repaired_and_refilled_from_the_store(tmp_path: Path, damage: str) -> None:
    logs, cfg = _setup(tmp_path, index_entry_bytes=1024)
    backend = LocalBackend(root=str(tmp_path / "store"))
    assert [r.error for r in _manager(cfg, backend).run_once()] == [None]
    good = local_index_files([logs])
    active = sorted((logs / f"{TOPIC}-0").glob("*.remotelogindex"))[-1]
    data = bytearray(active.read_bytes())
    last = list(iter_entries(bytes(data)))[-1]
    if damage == "truncate_mid_entry":
        data = data[: last.position + last.size // 2]
    else:
        data[last.position + 20] ^= 0x40  # inside lastOffset: the CRC no longer matches
    active.write_bytes(bytes(data))

    manager = _manager(cfg, backend)
    ctx = manager.context(manager.discover()[0])
    report = ctx.family.open()
    assert report.truncated_bytes == len(data) - last.position
    assert report.rewrote_derived
    assert active.stat().st_size == last.position
    # The derived files now match the shortened log index (check_store would fail otherwise) ...
    check = check_store([logs], backend, complete=False, local_may_lag=True)
    assert len(check.partitions[f"{TOPIC}-0"].local_entries) < sum(
        m["index_entries"] for m in check.partitions[f"{TOPIC}-0"].manifests
    )
    # ... and the next pass re-appends the lost entry from the remote manifest.
    assert [r.error for r in _manager(cfg, backend).run_once()] == [None]
    assert local_index_files([logs]) == good
    check_store([logs], backend)


def test_an_unexpected_exception_mid_copy_is_recovered_on_the_next_pass(tmp_path: Path) -> None:
    """An error no layer translated (here a RuntimeError from the store's upload path, after
    COPY_STARTED is journaled) fails that pass with a named error; the next pass recovers (the
    open attempt is aborted, its objects deleted) and copies everything, exactly once."""
    logs, cfg = _setup(tmp_path)
    failures: list[str] = []

    def hook(key: str) -> None:
        if key.endswith("segment.log") and not failures:
            failures.append(key)
            raise RuntimeError("connection pool is closed")

    backend = HookedLocal(hook, root=str(tmp_path / "store"))
    manager = _manager(cfg, backend)
    first = manager.run_once()
    assert first[0].error == "unexpected RuntimeError: connection pool is closed", first
    status = {(r["topic"], r["partition"]): r for r in manager.status()}
    assert status[(TOPIC, 0)]["last_error"] == first[0].error
    second = manager.run_once()
    assert [r.error for r in second] == [None]
    check = check_store([logs], backend)
    assert check.partitions[f"{TOPIC}-0"].manifests and not check.unreferenced
    assert failures and not any(
        i.key.startswith(failures[0].rsplit("/", 1)[0]) for i in backend.list(f"{TOPIC}-0/")
    )


# --- maintenance beside passes ----------------------------------------------------------------------


class SlowListing(LocalBackend):
    """The real local backend whose listings take ``delay`` s once ``slow`` is set (GC lists)."""

    def __init__(self, delay: float, **options: Any) -> None:
        super().__init__(**options)
        self.delay, self.slow, self.listing = delay, threading.Event(), threading.Event()

    def _list_page(self, prefix: str, start_after: str | None, limit: int) -> ListPage:
        if self.slow.is_set():
            self.listing.set()
            time.sleep(self.delay)
        return super()._list_page(prefix, start_after, limit)


def test_a_pass_waits_for_gc_instead_of_being_skipped(tmp_path: Path) -> None:
    """GC holds a partition's lock while it lists the store. A pass that gave up at once on a held
    lock could be skipped on every run when GC's schedule stays in phase with the partition's (the
    store-outage test saw one partition never pass again): the pass waits for GC."""
    _, cfg = _setup(tmp_path)
    backend = SlowListing(0.5, root=str(tmp_path / "store"))
    manager = _manager(cfg, backend)
    part = manager.discover()[0]
    assert manager.run_partition(part).error is None  # recovered and tiered
    backend.slow.set()
    gc = threading.Thread(target=manager.collect_garbage)
    gc.start()
    assert backend.listing.wait(10)  # GC now holds the partition's lock, listing slowly
    result = manager.run_partition(part)
    gc.join(30)
    assert not result.skipped and result.error is None, result


@pytest.mark.parametrize("passed_before", [False, True])
def test_a_partition_directory_renamed_away_is_one_line_not_a_crash(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, passed_before: bool
) -> None:
    """Kafka renames a deleted topic's directory (``<name>.<id>-delete``) while a pass may be
    about to run on it: the pass says so in one line (issue #29, seen beside a live broker)."""
    logs, store = tmp_path / "logs", tmp_path / "store"
    generate_log_dir(logs, [(TOPIC, 1)], seed=3, records=300, segment_bytes=4096)
    config = write_config(tmp_path / "rlm.toml", [logs], root=store)
    manager = RemoteLogManager(load_settings(config), LocalBackend(root=str(store)))
    part = manager.discover()[0]
    if passed_before:
        assert manager.run_partition(part).error is None
    part.path.rename(logs / f"{TOPIC}-0.9f2c0d3e5b7a4c1d8e6f0a2b4c6d8e0f-delete")
    with caplog.at_level("INFO", logger="rlm.tiering.manager"):
        result = manager.run_partition(part)
    assert result.error is not None and "is gone" in result.error
    assert [r.levelname for r in caplog.records if r.name == "rlm.tiering.manager"] == ["WARNING"]
    assert all(r.exc_info is None for r in caplog.records)
