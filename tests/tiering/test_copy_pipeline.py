"""Pipelined copies (docs/architecture.md §3 "Pipelined copies"): once a segment's objects are
stored, the next segment's attempt is journaled and uploads while the first commits, so two
attempts of a partition can be open. The next one is committed only after the one before it;
when that one's commit fails the next is discarded (objects deleted, journaled aborted), and a
crash with both open — the next one wholly uploaded — recovers to a store holding no orphan and
no gap. ``Journal.quiescent`` (what a restart trusts) sees either open attempt.

On S3 (SeaweedFS) the next attempt starts as soon as the last part of the one before it was
submitted, so its parts follow the tail of those in flight. Real local and S3 stores, real log
files; the crash is a real SIGKILL of a subprocess."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from rlm.config import load_settings
from rlm.errors import StorageError
from rlm.formats.records import RecordSpec
from rlm.logdir.discovery import SegmentFiles, list_segments
from rlm.logdir.writer import LogWriter
from rlm.storage.api import ObjectInfo, StorageBackend
from rlm.storage.local import LocalBackend
from rlm.storage.registry import create_backend, open_backend
from rlm.storage.wrapper import WrappingBackend
from rlm.testing.configs import write_config
from rlm.testing.daemon import rlm_cli
from rlm.testing.store_check import assert_manifests_complete, check_store
from rlm.tiering.local.journal import MAX_OPEN, TAIL_BYTES, EventType, Journal
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.manager import RemoteLogManager
from tests.s3servers import S3Target
from tests.tiering.test_broker_files import T0, TOPIC, _settings, _write

#: Bound on the ordering wait below: without pipelining it never ends, and the test fails.
WAIT_S = 30.0
#: Which manifest (1-based, in commit order) fails or crashes: segments before it commit.
FAILING = 2


class _HeldCommit(LocalBackend):
    """The real local store; the ``FAILING``-th manifest put waits until the next segment's
    ``.log`` is stored (it uploads while this one commits), then fails as a store refusing it."""

    def __init__(self, root: str) -> None:
        super().__init__(root=root)
        self.lock = threading.Lock()
        self.manifests = 0
        self.logs = 0
        self.next_stored = threading.Event()

    def _put(self, key: str, stream: BinaryIO, if_absent: bool) -> ObjectInfo:
        if "/manifests/" in key:
            with self.lock:
                self.manifests += 1
                held = self.manifests == FAILING
            if held:
                assert self.next_stored.wait(WAIT_S), "the next segment did not upload during the commit"
                self.fail()
        info = super()._put(key, stream, if_absent)
        if key.endswith("/segment.log"):
            with self.lock:
                self.logs += 1
                if self.logs == FAILING + 1:
                    self.next_stored.set()
        return info

    def fail(self) -> None:
        raise StorageError("manifest refused (test)")


def _journal(logs: Path) -> Journal:
    [path] = (logs.parent / f"{logs.name}.rlm-state").glob(f"{TOPIC}-0*/journal.jsonl")
    return Journal(path)


def _manifests(store: Path) -> int:
    return sum("/manifests/" in o.key for o in LocalBackend(root=str(store)).list(""))


def _attempt_keys(store: Path, attempt: str) -> list[str]:
    return [o.key for o in LocalBackend(root=str(store)).list(f"{TOPIC}-0/") if attempt in o.key]


def test_a_failed_commit_discards_the_next_segment_uploaded_meanwhile(tmp_path: Path) -> None:
    logs, store = tmp_path / "logs", tmp_path / "store"
    _write(logs, TOPIC, 0, seed=21)
    segments = list_segments(logs / f"{TOPIC}-0")[:-1]
    assert len(segments) > FAILING + 1
    backend = _HeldCommit(str(store))
    manager = RemoteLogManager(_settings(logs, store), backend, metrics=TieringMetrics())

    [result] = manager.run_once(gc=False)
    assert result.error is not None and "manifest refused" in result.error
    assert result.copied == [s.base_offset for s in segments[: FAILING - 1]]
    journal = _journal(logs)
    failed, discarded = (s.base_offset for s in segments[FAILING - 1 : FAILING + 1])
    open_ = journal.open_attempts()
    assert [(e.type, e.base_offset) for e in open_] == [("COPY_STARTED", failed)]  # for recovery
    [next_start] = [e for e in journal.events() if e.type == "COPY_STARTED" and e.base_offset == discarded]
    assert ("COPY_ABORTED", discarded, next_start.attempt_id) in [
        (e.type, e.base_offset, e.attempt_id) for e in journal.events()
    ]
    assert _attempt_keys(store, next_start.attempt_id) == []  # its stored objects were deleted
    assert not journal.quiescent()  # the failed one is open: a restart may not trust the state
    orphans = assert_manifests_complete(LocalBackend(root=str(store)))
    assert all(open_[0].attempt_id in k for k in orphans)
    assert _manifests(store) == FAILING - 1

    # The next pass recovers (the failed attempt aborted) and copies the rest, in order.
    backend.fail = lambda: None  # type: ignore[method-assign]
    [result] = manager.run_once(gc=False)
    assert result.error is None and result.copied == [s.base_offset for s in segments[FAILING - 1 :]]
    check = check_store([logs], LocalBackend(root=str(store)), deep=True)
    assert not check.unreferenced
    assert _journal(logs).quiescent() and not _journal(logs).open_attempts()


_CRASHER = """
import os, signal, sys
sys.path[:0] = {paths!r}
from rlm.config import load_settings
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.manager import RemoteLogManager
from tests.tiering.test_copy_pipeline import _HeldCommit

class Crash(_HeldCommit):
    def fail(self):
        os.kill(os.getpid(), signal.SIGKILL)  # a power cut: the next segment stored, this one not committed

settings = load_settings({cfg!r})
RemoteLogManager(settings, Crash({store!r}), metrics=TieringMetrics()).run_once(gc=False)
"""


def test_a_crash_with_the_next_segment_stored_and_this_one_uncommitted_recovers(tmp_path: Path) -> None:
    logs, store = tmp_path / "logs", tmp_path / "store"
    _write(logs, TOPIC, 0, seed=22)
    segments = list_segments(logs / f"{TOPIC}-0")[:-1]
    cfg = write_config(tmp_path / "c.toml", [logs], root=store)
    script = textwrap.dedent(_CRASHER).format(
        paths=[p for p in sys.path if p], cfg=str(cfg), store=str(store)
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]

    # Both attempts open, neither published; the next one's .log wholly stored.
    journal = _journal(logs)
    open_ = journal.open_attempts()
    assert [(e.type, e.base_offset) for e in open_] == [
        ("COPY_STARTED", s.base_offset) for s in segments[FAILING - 1 : FAILING + 1]
    ]
    assert not journal.quiescent()
    backend = LocalBackend(root=str(store))
    orphans = assert_manifests_complete(backend)
    assert any(open_[1].attempt_id in k and k.endswith("/segment.log") for k in orphans)
    assert _manifests(store) == FAILING - 1

    # A restart aborts both (objects deleted) and copies everything, oldest first.
    proc2 = rlm_cli("run", "--config", cfg, "--once")
    assert proc2.returncode == 0, proc2.stderr
    assert json.loads(proc2.stdout)["segments_copied"] == len(segments) - (FAILING - 1)
    check = check_store([logs], backend, deep=True)
    assert not check.unreferenced
    events = [(e.type, e.attempt_id) for e in _journal(logs).events()]
    assert ("COPY_ABORTED", open_[0].attempt_id) in events and ("COPY_ABORTED", open_[1].attempt_id) in events
    assert not _journal(logs).open_attempts()


def _append(path: Path, type_: EventType, base: int, attempt: str) -> None:
    with path.open("a") as fh:
        fh.write(json.dumps({"type": type_, "base": base, "attempt": attempt, "at": 1}) + "\n")


@pytest.mark.parametrize(
    ("events", "quiet"),
    [
        ([], True),
        ([("COPY_STARTED", 0)], False),
        ([("COPY_STARTED", 0), ("COPY_FINISHED", 0)], True),
        # The pipelined window: the next one started, then the first finished (the last event is
        # an end, yet an attempt is open: the one-open-attempt reading of the tail said quiescent).
        ([("COPY_STARTED", 0), ("COPY_STARTED", 1), ("COPY_FINISHED", 0)], False),
        ([("COPY_STARTED", 0), ("COPY_STARTED", 1), ("COPY_ABORTED", 1)], False),
        ([("COPY_STARTED", 0), ("COPY_STARTED", 1), ("COPY_FINISHED", 0), ("COPY_FINISHED", 1)], True),
        ([("COPY_STARTED", 0), ("COPY_STARTED", 1), ("COPY_ABORTED", 1), ("COPY_ABORTED", 0)], True),
    ],
)
def test_quiescent_sees_either_open_attempt(
    tmp_path: Path, events: list[tuple[EventType, int]], quiet: bool
) -> None:
    for filler in (0, TAIL_BYTES // 40):  # a short journal, and one whose tail is cut
        path = tmp_path / f"journal-{filler}.jsonl"
        path.touch()
        for i in range(filler):
            _append(path, "COPY_STARTED", 1000 + i, f"old{i}")
            _append(path, "COPY_FINISHED", 1000 + i, f"old{i}")
        for type_, base in events:
            _append(path, type_, base, f"a{base}")
        assert Journal(path).quiescent() is quiet, (filler, events)


def test_quiescent_agrees_with_the_whole_journal_over_pipelined_histories(tmp_path: Path) -> None:
    """Random histories a partition can write — a copy started only when every attempt but the
    last started has ended (so at most ``MAX_OPEN`` are open), ends in any order, crashes followed
    by recovery's ends, deletes between passes — checked after every event against the whole
    journal's open attempts."""
    rnd = random.Random(35)
    for history in range(40):
        path = tmp_path / f"j{history}.jsonl"
        path.touch()
        journal, base = Journal(path), 0
        open_: list[int] = []
        for _ in range(rnd.randint(1, 150)):
            move = rnd.random()
            if move < 0.45 and open_ in ([], [base]):  # nothing open but the last started
                base += 1
                _append(path, "COPY_STARTED", base, f"c{base}")
                open_.append(base)
            elif move < 0.85 and open_:
                done = open_.pop(rnd.randrange(len(open_)) if len(open_) > 1 else 0)
                _append(path, rnd.choice(["COPY_FINISHED", "COPY_ABORTED"]), done, f"c{done}")
            elif move < 0.95 and open_:  # a crash, then recovery ends every open attempt, oldest first
                for done in open_:
                    _append(path, "COPY_ABORTED", done, f"c{done}")
                open_ = []
            elif not open_:  # retention between passes
                _append(path, "DELETE_STARTED", base, f"d{base}")
                _append(path, "DELETE_FINISHED", base, f"d{base}")
            assert len(open_) <= MAX_OPEN
            assert journal.quiescent() is (not journal.open_attempts()) is (not open_), history


def _multipart_segments(
    tmp_path: Path, s3_target: S3Target
) -> tuple[Path, list[SegmentFiles], dict[str, Any], Path]:
    """Three rolled segments of 11 MiB (three 5 MiB parts each, two sent at once) and an active
    one; (log dir, the rolled segments, the s3 options, a config tiering them to the s3 store)."""
    logs = tmp_path / "logs"
    with LogWriter(logs, TOPIC, 0, segment_bytes=11 << 20, clock=lambda: T0) as w:
        for i in range(3 * 176 + 1):
            w.append([RecordSpec(T0 + i, b"k", random.Random(i).randbytes(64 << 10))])
    segments = list_segments(logs / f"{TOPIC}-0")[:-1]
    assert len(segments) == 3
    options = s3_target.options(part_size="5MiB", max_concurrency=2)
    return logs, segments, options, write_config(tmp_path / "c.toml", [logs], backend="s3", options=options)


class _HeldLog(WrappingBackend):
    """The s3 store; the ``.log`` put of the second segment (the first one copied pipelined)
    returns only once the third segment's ``.log`` put has begun: its attempt must start while
    the second's parts are still in flight (once the last was submitted), not after they are
    stored."""

    def __init__(self, inner: StorageBackend) -> None:
        self.inner = inner
        self.lock = threading.Lock()
        self.logs: list[str] = []
        self.third_started = threading.Event()

    def _put(self, key: str, stream: BinaryIO, if_absent: bool) -> ObjectInfo:
        if not key.endswith("/segment.log"):
            return super()._put(key, stream, if_absent)
        with self.lock:
            self.logs.append(key)
            nth = len(self.logs)
        if nth == 3:
            self.third_started.set()
        info = super()._put(key, stream, if_absent)
        if nth == 2:
            assert self.third_started.wait(WAIT_S), "the next segment did not start during the upload"
        return info


@pytest.mark.s3
def test_on_s3_the_next_segment_starts_while_the_last_parts_upload(
    tmp_path: Path, s3_target: S3Target
) -> None:
    logs, segments, options, cfg = _multipart_segments(tmp_path, s3_target)
    backend = _HeldLog(open_backend("s3", options))
    manager = RemoteLogManager(load_settings(cfg), backend, metrics=TieringMetrics())

    [result] = manager.run_once(gc=False)
    assert result.error is None and result.copied == [s.base_offset for s in segments]
    events = [(e.type, e.base_offset) for e in _journal(logs).events()]
    # The third started before the second was stored, so before it committed; committed in order.
    assert events.index(("COPY_STARTED", segments[2].base_offset)) < events.index(
        ("COPY_FINISHED", segments[1].base_offset)
    )
    check = check_store([logs], create_backend("s3", options), deep=True)
    assert not check.unreferenced
    [pc] = check.partitions.values()
    assert [m["base_offset"] for m in pc.manifests] == [s.base_offset for s in segments]
    backend.close()


@pytest.mark.s3
def test_on_s3_a_crash_once_the_next_segment_started_behind_the_last_parts_converges(
    tmp_path: Path, s3_target: S3Target
) -> None:
    """A real SIGKILL of ``rlm run`` at the second pipelined start: the second segment's last
    part was submitted (its parts may still be in flight: a multipart upload cut short) and the
    third segment's attempt was journaled and began uploading; the first committed (a probe of 4
    such kills found the second's multipart upload still open in 3; an open one is left to the
    bucket's lifecycle rule, docs/storage.md). A restart aborts both open attempts, leaves no
    object unreferenced and copies the rest, in order."""
    logs, segments, options, cfg = _multipart_segments(tmp_path, s3_target)
    proc = rlm_cli("run", "--config", cfg, "--once", env={"RLM_CRASH_AT": "after_next_start:2"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]

    backend = create_backend("s3", options)
    journal = _journal(logs)
    open_ = journal.open_attempts()
    assert [(e.type, e.base_offset) for e in open_] == [("COPY_STARTED", s.base_offset) for s in segments[1:]]
    assert not journal.quiescent()
    assert_manifests_complete(backend)  # the first segment only, whole
    assert sum("/manifests/" in o.key for o in backend.list("")) == 1

    proc2 = rlm_cli("run", "--config", cfg, "--once")
    assert proc2.returncode == 0, proc2.stderr
    assert json.loads(proc2.stdout)["segments_copied"] == 2
    check = check_store([logs], backend, deep=True)
    assert not check.unreferenced
    [pc] = check.partitions.values()
    assert [m["base_offset"] for m in pc.manifests] == [s.base_offset for s in segments]
    events = [(e.type, e.attempt_id) for e in _journal(logs).events()]
    assert all(("COPY_ABORTED", e.attempt_id) in events for e in open_)
    assert not _journal(logs).open_attempts()
    backend.close()
