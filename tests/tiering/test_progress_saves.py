"""How often a copy run saves the partition's progress (``copy_pass.PROGRESS_SAVE_INTERVAL_S``):
at most once per interval while it commits, and always when it ends — after its last commit, and
after a failure, for what it committed before it. ``progress.json`` and the manifest snapshot are
what a restart trusts to skip the store; a restart that finds them behind the local index (a crash
before the save: ``after_journal_finish`` in tests/tiering/test_crash.py) recovers from the store.
Real log files and a real local store."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlm.logdir.discovery import list_segments
from rlm.storage.local import LocalBackend
from rlm.tiering.copy import copy_pass
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.local.state import Progress
from rlm.tiering.manager import RemoteLogManager
from tests.tiering.test_broker_files import TOPIC, _manager, _settings, _write
from tests.tiering.test_copy_pipeline import FAILING, _HeldCommit


def _saved_highest(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The highest tiered offset of every ``progress.json`` written from now on."""
    saved: list[int] = []
    real = Progress.save

    def save(self: Progress, path: Path) -> None:
        saved.append(self.highest_tiered_offset)
        real(self, path)

    monkeypatch.setattr(Progress, "save", save)
    return saved


def _written(
    tmp_path: Path, seed: int, interval_s: float, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, Path, list[int]]:
    """A log dir of several rolled segments, an empty store, the save interval set to ``interval_s``;
    (log dir, store, the last offset of each rolled segment: the next one's base - 1)."""
    logs, store = tmp_path / "logs", tmp_path / "store"
    _write(logs, TOPIC, 0, seed=seed)
    monkeypatch.setattr(copy_pass, "PROGRESS_SAVE_INTERVAL_S", interval_s)
    bases = [s.base_offset for s in list_segments(logs / f"{TOPIC}-0")]
    return logs, store, [b - 1 for b in bases[1:]]


def _progress(logs: Path) -> Progress:
    [path] = (logs.parent / f"{logs.name}.rlm-state").glob(f"{TOPIC}-0*/progress.json")
    return Progress.load(path)


def test_a_run_within_the_interval_saves_once_when_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs, store, lasts = _written(tmp_path, 31, 3600.0, monkeypatch)
    assert len(lasts) > 3
    saved = _saved_highest(monkeypatch)
    manager = _manager(logs, store)

    [result] = manager.run_once(gc=False)
    assert result.error is None and len(result.copied) == len(lasts)
    # The first pass's recovery saves what it found (nothing); the copy run saves once, at its end.
    assert [h for h in saved if h >= 0] == [lasts[-1]]
    assert _progress(logs).highest_tiered_offset == lasts[-1]

    # What it saved is whole: a restart trusts it and asks the store nothing.
    metrics = TieringMetrics()
    again = RemoteLogManager(_settings(logs, store), LocalBackend(root=str(store)), metrics=metrics)
    [result] = again.run_once(gc=False)
    assert result.error is None and result.copied == []
    assert metrics.recoveries.labels(source="local")._value.get() == 1
    assert metrics.recoveries.labels(source="store")._value.get() == 0


def test_a_run_saves_at_most_once_per_interval_while_it_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs, store, lasts = _written(tmp_path, 32, 0.0, monkeypatch)  # a save due at every commit
    saved = _saved_highest(monkeypatch)
    manager = _manager(logs, store)

    [result] = manager.run_once(gc=False)
    assert result.error is None
    assert [h for h in saved if h >= 0] == lasts  # each commit, in order; nothing left at the end


def test_a_failed_run_saves_what_it_committed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    logs, store, lasts = _written(tmp_path, 33, 3600.0, monkeypatch)
    manager = RemoteLogManager(_settings(logs, store), _HeldCommit(str(store)), metrics=TieringMetrics())

    [result] = manager.run_once(gc=False)
    assert result.error is not None and "manifest refused" in result.error
    assert len(result.copied) == FAILING - 1
    assert _progress(logs).highest_tiered_offset == lasts[FAILING - 2]
