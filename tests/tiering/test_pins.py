"""Pin on sight (issue #30 item 2; docs/architecture.md §5.1, docs/operations.md "Pins and
the broker's retention").

Every rolled, committed segment a pass sees is hard-linked with its companions (``.index``,
``.timeindex``, ``.txnindex``, producer snapshot, the leader-epoch checkpoint as it was) until it
is tiered, so the broker deleting it while the store is down — unlinked, renamed to ``.deleted``,
or renamed and then unlinked, with its leader-epoch checkpoint truncated from the start as Kafka
does — loses nothing: once the store is back it is tiered exactly as a copy made while the broker
still had it (manifests and objects compared with such a reference run). The bound
(``tiering.max_pinned_bytes``) stops new pins in base-offset order, is reported once, is never
exceeded on disk and survives a restart; GC drops the pins of partitions no longer tiered.

Real parts: logs written by rlm's LogWriter (transactions, Kafka-layout ``.txnindex`` and
``.snapshot`` files), the local backend switched off and on, ``rlm run --once`` and ``rlm status``
as subprocesses for the restart.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, BinaryIO, Literal

import pytest

from rlm.config import load_settings
from rlm.errors import PinRoomExhausted, StorageError, TransientStorageError
from rlm.formats import naming
from rlm.formats.checkpoint import (
    EpochEntry,
    format_leader_epoch_checkpoint,
    format_offset_checkpoint,
    parse_leader_epoch_checkpoint,
)
from rlm.formats.indexes.remote_index import iter_entries
from rlm.formats.records import RecordSpec
from rlm.logdir.discovery import LEADER_EPOCH_CHECKPOINT, list_segments
from rlm.logdir.writer import LogWriter
from rlm.storage.api import ListPage, ObjectInfo
from rlm.storage.local import LocalBackend
from rlm.testing.configs import faulty_local_options, write_config
from rlm.testing.daemon import rlm_cli
from rlm.testing.store_check import check_store
from rlm.tiering.copy.prepare import prepare_segment
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.manager import RemoteLogManager
from tests.tiering.txn_helpers import Oracle, write_broker_txn_indexes, write_snapshots, write_txn_log

TOPIC = "txn"
Deletion = Literal["unlink", "rename", "rename_then_unlink"]
SUFFIXES = (naming.LOG, naming.INDEX, naming.TIME_INDEX, naming.TXN_INDEX, naming.SNAPSHOT)


class SwitchableStore(LocalBackend):
    """The real local backend, switched off and on: while ``down`` every call fails as an
    unreachable store's do."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.down = False

    def _gate(self) -> None:
        if self.down:
            raise TransientStorageError("store down (test)")

    def _put(self, key: str, stream: BinaryIO, if_absent: bool) -> ObjectInfo:
        self._gate()
        return super()._put(key, stream, if_absent)

    def _read(self, key: str, start: int, end: int | None) -> bytes:
        self._gate()
        return super()._read(key, start, end)

    def _head(self, key: str) -> ObjectInfo:
        self._gate()
        return super()._head(key)

    def _list_page(self, prefix: str, start_after: str | None, limit: int) -> ListPage:
        self._gate()
        return super()._list_page(prefix, start_after, limit)

    def _delete(self, key: str) -> None:
        self._gate()
        super()._delete(key)


def _manager(cfg: Path, backend: LocalBackend) -> RemoteLogManager:
    return RemoteLogManager(load_settings(cfg), backend, metrics=TieringMetrics())


def _write_partition(logs: Path) -> tuple[Path, set[int]]:
    """A transactional partition with the broker's ``.txnindex`` and ``.snapshot`` files; its
    directory and the bases of the segments that have a ``.txnindex``."""
    write_txn_log(logs, TOPIC, 0, seed=5, leave_open=False)
    part = logs / f"{TOPIC}-0"
    with_txns = set(write_broker_txn_indexes(part, Oracle.of(part)))
    write_snapshots(part)
    return part, with_txns


def _normalized(doc: dict[str, Any]) -> dict[str, Any]:
    """A manifest without what differs between two copies of the same bytes: the attempt, the
    time, the keys (named by the attempt) and the entries object's size and CRC (each entry's rdi
    names the object's URL)."""
    out = {k: v for k, v in doc.items() if k not in ("attempt_id", "created_ms")}
    out["objects"] = {
        role: {k: v for k, v in o.items() if k in ("size", "crc32c") and not _entries(role)}
        for role, o in doc["objects"].items()
    }
    return out


def _entries(role: str) -> bool:
    return role == "segment.remotelogindex"


def _tiered(store: LocalBackend) -> dict[int, tuple[dict[str, Any], dict[str, Any]]]:
    """Base offset → (normalized manifest, role → object bytes; the entries as their fields with
    the rdi's byte position instead of the whole rdi)."""
    out = {}
    for info in store.list(f"{TOPIC}-0/manifests/"):
        doc = json.loads(store.read(info.key))
        objects: dict[str, Any] = {}
        for role, o in doc["objects"].items():
            data = store.read(o["key"])
            objects[role] = (
                [dataclasses.replace(e.entry, rdi=e.entry.rdi.position) for e in iter_entries(data)]
                if _entries(role)
                else data
            )
        out[doc["base_offset"]] = (_normalized(doc), objects)
    return out


def _broker_deletes(part: Path, bases: list[int], how: Deletion) -> None:
    """Kafka's retention on ``bases``: every file of the segment renamed to ``.deleted`` and/or
    unlinked (``file.delete.delay.ms`` later), then the leader-epoch cache truncated from the new
    log start (``LeaderEpochFileCache.truncateFromStart``)."""
    for base in bases:
        for suffix in SUFFIXES:
            path = part / naming.segment_file_name(base, suffix)
            if not path.exists():
                continue
            if how == "unlink":
                path.unlink()
                continue
            deleted = path.with_name(path.name + ".deleted")
            path.rename(deleted)
            if how == "rename_then_unlink":
                deleted.unlink()
    start = list_segments(part)[0].base_offset
    epochs = parse_leader_epoch_checkpoint((part / LEADER_EPOCH_CHECKPOINT).read_text()).entries
    kept = [e for e in epochs if e.start_offset > start]
    older = [e for e in epochs if e.start_offset <= start][-1:]
    truncated = [EpochEntry(e.epoch, start) for e in older] + kept
    tmp = part / (LEADER_EPOCH_CHECKPOINT + ".tmp")  # Kafka's CheckpointFile: a new file renamed over
    tmp.write_text(format_leader_epoch_checkpoint(truncated))
    tmp.replace(part / LEADER_EPOCH_CHECKPOINT)


def _pinned(state_root: Path) -> list[int]:
    return sorted(int(p.parent.name) for p in state_root.glob("*/pins/*/segment.log"))


def _bytes_on_disk(state_root: Path) -> int:
    """What rlm's pins hold: distinct inodes of every file under a pins or staging dir but rlm's
    own JSON."""
    seen: dict[tuple[int, int], int] = {}
    for d in [*state_root.glob("*/pins"), *state_root.glob("*/staging")]:
        for path in d.rglob("*"):
            if path.is_file() and not path.name.endswith(".json"):
                st = path.stat()
                seen[(st.st_dev, st.st_ino)] = st.st_size
    return sum(seen.values())


@pytest.mark.parametrize("how", ["unlink", "rename", "rename_then_unlink"])
def test_a_segment_pinned_on_sight_and_deleted_by_the_broker_is_tiered_byte_identical(
    tmp_path: Path, how: Deletion, caplog: pytest.LogCaptureFixture
) -> None:
    logs = tmp_path / "logs"
    part, with_txns = _write_partition(logs)
    shutil.copytree(logs, tmp_path / "ref")
    reference = LocalBackend(root=str(tmp_path / "ref-store"))
    ref_cfg = write_config(tmp_path / "ref.toml", [tmp_path / "ref"], root=tmp_path / "ref-store")
    assert [r.error for r in _manager(ref_cfg, reference).run_once()] == [None]
    expected = _tiered(reference)

    store = SwitchableStore(root=str(tmp_path / "store"))
    manager = _manager(write_config(tmp_path / "c.toml", [logs], root=tmp_path / "store"), store)
    store.down = True  # the first pass cannot even recover: it only sees the segments
    results = manager.run_once(gc=False)
    assert results[0].error is not None and "store down" in results[0].error
    rolled = [s.base_offset for s in list_segments(part)][:-1]
    assert sorted(expected) == rolled  # everything rolled is committed (HW at the log end)
    assert _pinned(tmp_path / "logs.rlm-state") == rolled

    gone = rolled[:-2]
    _broker_deletes(part, gone, how)
    store.down = False
    assert [r.error for r in manager.run_once(gc=False)] == [None]

    tiered = _tiered(store)
    assert sorted(tiered) == rolled
    for base, (manifest, objects) in expected.items():  # as if the broker had still had them
        got, got_objects = tiered[base]
        assert got.pop("objects") == manifest.pop("objects"), base  # sizes and CRCs
        assert got == manifest, base  # offsets, timestamps, leader epochs, transactions
        for role, data in objects.items():
            assert got_objects.pop(role) == data, (base, role)
        assert got_objects == {}, base
    # The broker's .txnindex of a deleted segment was uploaded (from its pin), not rebuilt.
    assert with_txns & set(gone)
    assert all(tiered[b][0]["txn_index"]["source"] == "broker" for b in with_txns & set(rolled))
    assert _pinned(tmp_path / "logs.rlm-state") == []  # tiered: the pins are gone
    skipped = manager.shared.metrics.registry.get_sample_value(
        "rlm_segments_deleted_before_copy_total", {"topic": TOPIC, "partition": "0"}
    )
    assert not skipped
    assert not check_store([logs], store, complete=False, deep=True).unreferenced
    # Pinned offsets were waiting to be tiered, never lost: no gap was ever recorded for them.
    assert not [r for r in caplog.records if "gap:" in r.getMessage()]


def _produce(writer: LogWriter, segments: int, ts: list[int]) -> None:
    """``segments`` rolled segments of 5 batches (4 records of 200 bytes each), HW at the end."""
    for _ in range(segments):
        for _ in range(5):
            ts[0] += 10
            writer.append([RecordSpec(ts[0], f"k{i}".encode(), os.urandom(200)) for i in range(4)])
        writer.roll()
    writer.high_watermark = writer.log_end_offset
    writer.write_checkpoints()


def _segment_bytes(part: Path, base: int) -> int:
    """What a pin of segment ``base`` links: its files and the partition's epoch checkpoint."""
    files = [part / naming.segment_file_name(base, s) for s in SUFFIXES] + [part / LEADER_EPOCH_CHECKPOINT]
    return sum(p.stat().st_size for p in files if p.exists())


def test_the_bound_stops_new_pins_reports_once_and_is_never_exceeded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    logs = tmp_path / "logs"
    writer = LogWriter(logs, TOPIC, 0, segment_bytes=1 << 20)
    _produce(writer, 8, [1_700_000_000_000])
    part = logs / f"{TOPIC}-0"
    rolled = [s.base_offset for s in list_segments(part)][:-1]
    bound = sum(_segment_bytes(part, b) for b in rolled[:3]) + _segment_bytes(part, rolled[3]) // 2
    cfg = write_config(tmp_path / "c.toml", [logs], root=tmp_path / "store", max_pinned_bytes=bound)
    store = SwitchableStore(root=str(tmp_path / "store"))
    store.down = True
    manager = _manager(cfg, store)
    registry = manager.shared.metrics.registry
    label = {"log_dir": str(logs)}
    with caplog.at_level(logging.INFO, logger="rlm.tiering.local.pin_ledger"):
        for _ in range(3):  # the same refusal, pass after pass
            assert manager.run_once(gc=False)[0].error is not None
            assert _pinned(tmp_path / "logs.rlm-state") == rolled[:3]  # in base-offset order
            assert _bytes_on_disk(tmp_path / "logs.rlm-state") <= bound
    reached = [r for r in caplog.records if "reached tiering.max_pinned_bytes" in r.getMessage()]
    assert len(reached) == 1 and reached[0].levelno == logging.WARNING
    assert registry.get_sample_value("rlm_pin_bound_reached", label) == 1
    assert registry.get_sample_value("rlm_pin_refused_total", label) == 1
    assert registry.get_sample_value("rlm_pinned_segments", label) == 3
    held = registry.get_sample_value("rlm_pinned_bytes", label)
    assert held == _bytes_on_disk(tmp_path / "logs.rlm-state") and held is not None and held <= bound
    (summary,) = manager.shared.pins.summary()
    assert (
        summary["bound_reached"] and summary["pinned_segments"] == 3 and summary["max_pinned_bytes"] == bound
    )
    row = manager.status(observe=False)[0]
    assert (row["pinned_segments"], row["pinned_bytes"], row["pin_refused_offset"]) == (3, held, rolled[3])

    # The store is back: everything is tiered, the pins go and the crossing ends (one line).
    store.down = False
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="rlm.tiering.local.pin_ledger"):
        for _ in range(2):
            assert [r.error for r in manager.run_once(gc=False)] == [None]
    assert sorted(check_store([logs], store).remote_bases(f"{TOPIC}-0")) == rolled
    assert _pinned(tmp_path / "logs.rlm-state") == [] and _bytes_on_disk(tmp_path / "logs.rlm-state") == 0
    assert [r.getMessage() for r in caplog.records if "back under" in r.getMessage()] != []
    assert registry.get_sample_value("rlm_pin_bound_reached", label) == 0
    assert registry.get_sample_value("rlm_pinned_bytes", label) == 0
    assert registry.get_sample_value("rlm_pinned_segments", label) == 0  # counted down as released
    assert manager.shared.pins.summary()[0]["pinned_segments"] == 0
    writer.close()


def test_pins_survive_a_restart_and_the_restarted_daemon_tiers_from_them(tmp_path: Path) -> None:
    """``rlm run --once`` with the store failing every call pins what rolled, the oldest first,
    up to a bound that holds four of five segments; the broker deletes those four (its retention
    deletes the oldest); ``rlm status`` (another process) shows the pins and the bound; a
    restarted ``rlm run --once`` with the store back tiers all five byte-identical — four from
    their pins — and drops the pins."""
    logs = tmp_path / "logs"
    writer = LogWriter(logs, TOPIC, 0, segment_bytes=1 << 20)
    _produce(writer, 5, [1_700_000_000_000])
    part = logs / f"{TOPIC}-0"
    originals = {s.base_offset: s.log.read_bytes() for s in list_segments(part)[:-1]}
    bases = sorted(originals)
    bound = sum(_segment_bytes(part, b) for b in bases[:4])
    failing = faulty_local_options(tmp_path / "store", {"error_rate": 1.0})
    down = write_config(
        tmp_path / "down.toml", [logs], backend="faulty", options=failing, max_pinned_bytes=bound
    )
    up = write_config(tmp_path / "up.toml", [logs], root=tmp_path / "store", max_pinned_bytes=bound)

    run = rlm_cli("run", "--once", "--config", down)
    assert run.returncode == 1 and "injected" in run.stderr, run.stderr[-2000:]
    assert "reached tiering.max_pinned_bytes" in run.stderr
    assert _pinned(tmp_path / "logs.rlm-state") == bases[:4]
    _broker_deletes(part, bases[:4], "unlink")
    assert [s.base_offset for s in list_segments(part)] == [bases[4], writer.log_end_offset]

    status = rlm_cli("status", "--config", up)
    (row,) = json.loads(status.stdout)
    assert (row["pinned_segments"], row["copy_lag_segments"], row["pin_refused_offset"]) == (4, 5, bases[4])
    # Waiting, not lost: the status page draws [pending_start, local start) as waiting to copy.
    assert (row["pending_start_offset"], row["local_log_start_offset"]) == (bases[0], bases[4])
    assert sum(len(originals[b]) for b in bases[:4]) < row["pinned_bytes"] <= bound
    assert f"rlm: warning: {logs}: pinned segment files reached tiering.max_pinned_bytes" in status.stderr

    run = rlm_cli("run", "--once", "--config", up)
    assert run.returncode == 0, run.stderr[-2000:]
    store = LocalBackend(root=str(tmp_path / "store"))
    for base, data in originals.items():
        doc = json.loads(store.read(f"{TOPIC}-0/manifests/{base:020d}.json"))
        assert store.read(doc["objects"]["log"]["key"]) == data
    assert _pinned(tmp_path / "logs.rlm-state") == []
    status = rlm_cli("status", "--config", up)
    (row,) = json.loads(status.stdout)
    assert (row["pinned_segments"], row["pinned_bytes"], row["pin_refused_offset"]) == (0, 0, None)
    assert "max_pinned_bytes" not in status.stderr
    writer.close()


def test_a_copy_pin_makes_room_from_pins_the_broker_still_has_and_passes_the_bound_one_at_a_time(
    tmp_path: Path,
) -> None:
    """The copy of a segment the bound kept unpinned drops the newest sight pin whose broker file
    still exists; when only pins of segments the broker deleted hold the room, one copy pin at a
    time goes past the bound (tiering never stops) and a second waits (PinRoomExhausted)."""
    logs = tmp_path / "logs"
    writer = LogWriter(logs, TOPIC, 0, segment_bytes=1 << 20)
    _produce(writer, 6, [1_700_000_000_000])
    part = logs / f"{TOPIC}-0"
    segments = list_segments(part)[:-1]
    bound = sum(_segment_bytes(part, s.base_offset) for s in segments[:3]) + 64
    cfg = write_config(tmp_path / "c.toml", [logs], root=tmp_path / "store", max_pinned_bytes=bound)
    store = SwitchableStore(root=str(tmp_path / "store"))
    store.down = True
    manager = _manager(cfg, store)
    assert manager.run_once(gc=False)[0].error is not None
    state_root = tmp_path / "logs.rlm-state"
    bases = [s.base_offset for s in segments]
    assert _pinned(state_root) == bases[:3]
    ctx = manager.context(manager.discover()[0])

    def held() -> float | None:
        return manager.shared.metrics.registry.get_sample_value("rlm_pinned_bytes", {"log_dir": str(logs)})

    fifth = prepare_segment(ctx, segments[4])  # not pinned on sight: room from the newest pin
    assert _pinned(state_root) == bases[:2]
    assert held() == _bytes_on_disk(state_root) <= bound

    _broker_deletes(part, bases[:2], "unlink")  # the two pins left hold the only copy now
    sixth = prepare_segment(ctx, segments[5])  # nothing to drop: past the bound, alone
    assert _pinned(state_root) == bases[:2] and held() == _bytes_on_disk(state_root) > bound
    with pytest.raises(PinRoomExhausted, match=r"tiering\.max_pinned_bytes"):
        prepare_segment(ctx, segments[3])  # a second copy past the bound waits
    assert not list(ctx.staging_dir.glob(f"{bases[3]:020d}-*"))
    sixth.discard()
    fourth = prepare_segment(ctx, segments[3])  # the first one is done: this one may go
    for prepared in (fourth, fifth):
        prepared.discard()
    assert _pinned(state_root) == bases[:2] and held() == _bytes_on_disk(state_root) <= bound
    writer.close()


def test_gc_drops_the_pins_of_a_topic_no_longer_tiered_and_of_a_partition_gone(tmp_path: Path) -> None:
    """Pins are local files: GC drops them even while the store is down, for a topic the policy
    no longer tiers and for a partition whose directory is gone; the others stay."""
    logs = tmp_path / "logs"
    writers = [LogWriter(logs, topic, 0, segment_bytes=1 << 20) for topic in ("keep", "drop", "gone")]
    for w in writers:
        _produce(w, 2, [1_700_000_000_000])
        w.close()
    store = SwitchableStore(root=str(tmp_path / "store"))
    store.down = True
    manager = _manager(write_config(tmp_path / "c.toml", [logs], root=tmp_path / "store"), store)
    assert all(r.error is not None for r in manager.run_once(gc=False))
    state_root = tmp_path / "logs.rlm-state"

    def pinned_topics() -> list[str]:
        return sorted({p.parent.parent.parent.name for p in state_root.glob("*/pins/*/segment.log")})

    assert pinned_topics() == ["drop-0", "gone-0", "keep-0"]
    shutil.rmtree(logs / "gone-0")  # deleted by the broker (its -delete dir removed)
    excluding = write_config(
        tmp_path / "x.toml", [logs], root=tmp_path / "store", topics={"exclude": ["drop"]}
    )
    gc = _manager(excluding, store)  # `rlm gc` beside it: another process, the same state dirs
    with pytest.raises(StorageError):  # orphans need the store; pins do not
        gc.collect_garbage()
    assert pinned_topics() == ["keep-0"]
    assert _bytes_on_disk(state_root) == gc.shared.pins.summary()[0]["pinned_bytes"] > 0


def test_pins_inside_the_local_log_are_dropped_not_tiered(tmp_path: Path) -> None:
    """Only pins below the broker's first local segment hold what retention took. After an unclean
    leader election truncated the log into segment 3 (segments 4-6 deleted, 3 active again, the
    high watermark inside it), the pins of 3-5 are dropped and nothing past 2 is tiered."""
    logs = tmp_path / "logs"
    writer = LogWriter(logs, TOPIC, 0, segment_bytes=1 << 20)
    _produce(writer, 6, [1_700_000_000_000])
    writer.close()
    part = logs / f"{TOPIC}-0"
    bases = [s.base_offset for s in list_segments(part)]
    store = SwitchableStore(root=str(tmp_path / "store"))
    store.down = True
    manager = _manager(write_config(tmp_path / "c.toml", [logs], root=tmp_path / "store"), store)
    assert manager.run_once(gc=False)[0].error is not None
    assert _pinned(tmp_path / "logs.rlm-state") == bases[:-1]
    for base in bases[4:]:
        for suffix in SUFFIXES:
            (part / naming.segment_file_name(base, suffix)).unlink(missing_ok=True)
    hw = bases[3] + 3
    (logs / "replication-offset-checkpoint").write_text(format_offset_checkpoint({(TOPIC, 0): hw}))
    store.down = False
    assert [r.error for r in manager.run_once(gc=False)] == [None]
    assert sorted(check_store([logs], store, complete=False).remote_bases(f"{TOPIC}-0")) == bases[:3]
    assert _pinned(tmp_path / "logs.rlm-state") == []


def test_offsets_a_pin_holds_after_the_broker_deleted_them_are_never_recorded_as_a_gap(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Tiered up to segment 2; segments 3-5 roll while the store is down and are pinned; the
    broker deletes them; with the store back the next pass must see them as waiting to be tiered
    (docs/visibility.md "Gaps"), not as a gap, and tier them from their pins."""
    logs = tmp_path / "logs"
    writer = LogWriter(logs, TOPIC, 0, segment_bytes=1 << 20)
    ts = [1_700_000_000_000]
    _produce(writer, 3, ts)
    part = logs / f"{TOPIC}-0"
    store = SwitchableStore(root=str(tmp_path / "store"))
    manager = _manager(write_config(tmp_path / "c.toml", [logs], root=tmp_path / "store"), store)
    assert [r.error for r in manager.run_once(gc=False)] == [None]
    first = [s.base_offset for s in list_segments(part)][:-1]
    store.down = True
    _produce(writer, 3, ts)
    assert manager.run_once(gc=False)[0].error is not None
    pinned = _pinned(tmp_path / "logs.rlm-state")
    assert pinned and min(pinned) > max(first)
    _broker_deletes(part, [s.base_offset for s in list_segments(part)][:-1], "unlink")
    store.down = False
    with caplog.at_level(logging.WARNING):
        assert [r.error for r in manager.run_once(gc=False)] == [None]
    assert not [r.getMessage() for r in caplog.records if "gap:" in r.getMessage()]
    assert manager.status(observe=False)[0]["gaps"] == []
    assert set(pinned) <= set(check_store([logs], store, complete=False).remote_bases(f"{TOPIC}-0"))
    writer.close()
