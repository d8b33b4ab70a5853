"""A segment with no checksum walk done ahead (the first of a pass) is CRC-verified while its
``.log`` uploads (rlm/tiering/copy/copier.py ``_copy_overlapped``). The walk still decides: a
damaged segment found that way is never committed, what its attempt stored is deleted, and it is
quarantined exactly as when it was checked before any upload. Real local store, real log files."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from rlm.config import Settings
from rlm.logdir.discovery import list_segments
from rlm.storage.api import ObjectInfo
from rlm.storage.local import LocalBackend
from rlm.tiering.copy import prepare
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.manager import RemoteLogManager
from tests.tiering.test_broker_files import TOPIC, _damage_log, _settings, _write

#: Bound on each ordering wait below: a hang fails the test instead of blocking it.
WAIT_S = 60.0


class _OrderedStore(LocalBackend):
    """The real local store; with ``walk_first`` set, a ``.log`` upload starts only once the
    checksum walk has failed (``walked``), so it is cancelled, not completed."""

    def __init__(self, root: str, walked: threading.Event | None) -> None:
        super().__init__(root=root)
        self.walked = walked
        self.logs_stored = threading.Event()

    def _put(self, key: str, stream: BinaryIO, if_absent: bool) -> ObjectInfo:
        if key.endswith("/segment.log") and self.walked is not None:
            assert self.walked.wait(WAIT_S)
        info = super()._put(key, stream, if_absent)
        if key.endswith("/segment.log"):
            self.logs_stored.set()
        return info


def _events(manager: RemoteLogManager, logs: Path) -> list[tuple[str, int, str]]:
    part = next(p for p in manager.discover() if p.topic == TOPIC)
    return [(e.type, e.base_offset, e.attempt_id) for e in manager.context(part).journal.events()]


def _ordered(
    monkeypatch: pytest.MonkeyPatch, settings: Settings, store: Path, order: str
) -> RemoteLogManager:
    """A manager whose copy of the first segment runs in ``order``: ``upload_first`` — the walk
    starts once the ``.log`` is stored (then found damaged: the stored object must be deleted);
    ``walk_first`` — the upload starts once the walk failed (it must be cancelled)."""
    walked = threading.Event()
    backend = _OrderedStore(str(store), walked if order == "walk_first" else None)
    real = prepare.checksum_segment

    def checksum_segment(path: Path) -> Any:
        if order == "upload_first":
            assert backend.logs_stored.wait(WAIT_S)
        try:
            return real(path)
        finally:
            walked.set()

    monkeypatch.setattr(prepare, "checksum_segment", checksum_segment)
    return RemoteLogManager(settings, backend, metrics=TieringMetrics())


@pytest.mark.parametrize("order", ["upload_first", "walk_first"])
@pytest.mark.parametrize("damage", ["empty", "truncated", "bitflip"])
def test_first_segment_damaged_while_uploading_is_never_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str, order: str
) -> None:
    logs, store = tmp_path / "logs", tmp_path / "store"
    _write(logs, TOPIC, 0, seed=11)
    segments = list_segments(logs / f"{TOPIC}-0")
    victim = segments[0]  # the first pending segment: nothing checksums it ahead of its upload
    position, cause = _damage_log(victim, damage)
    manager = _ordered(monkeypatch, _settings(logs, store), store, order)

    [result] = manager.run_once(gc=False)  # not GC (grace 0 here): the copy itself must clean up
    assert result.error is not None and result.error.startswith("quarantined")
    [row] = manager.status()
    [q] = row["quarantine"]
    assert (q["base_offset"], q["file"], q["position"], q["cause"]) == (
        victim.base_offset,
        str(victim.log),
        position,
        cause,
    )
    assert row["highest_tiered_offset"] == -1
    # Nothing of the partition is in the store: no manifest, and the attempt's uploaded objects
    # (the .log streamed while it was being checked) were deleted.
    assert [o.key for o in LocalBackend(root=str(store)).list(f"{TOPIC}-0/")] == []
    # Its attempt was journaled before the upload and ended as aborted, not left open.
    events = _events(manager, logs)
    [(_, base, attempt)] = [e for e in events if e[0] == "COPY_STARTED"]
    assert base == victim.base_offset
    assert events[-1] == ("COPY_ABORTED", victim.base_offset, attempt)
    assert not list((manager.context(manager.discover()[0]).staging_dir).iterdir())  # pin dropped

    # A second pass finds it again without copying anything past it.
    monkeypatch.undo()
    manager.run_once(gc=False)
    assert [o.key for o in LocalBackend(root=str(store)).list(f"{TOPIC}-0/")] == []


def test_first_segment_verified_while_uploading_commits_the_same_bytes(tmp_path: Path) -> None:
    logs, store = tmp_path / "logs", tmp_path / "store"
    _write(logs, TOPIC, 0, seed=12)
    segments = list_segments(logs / f"{TOPIC}-0")[:-1]
    manager = RemoteLogManager(
        _settings(logs, store), LocalBackend(root=str(store)), metrics=TieringMetrics()
    )
    [result] = manager.run_once()
    assert result.error is None and result.copied == [s.base_offset for s in segments]
    backend = LocalBackend(root=str(store))
    part = manager.discover()[0]
    for seg, manifest in zip(segments, manager.context(part).manifests, strict=True):
        assert backend.read(manifest.objects["log"].key) == seg.log.read_bytes()
    events = _events(manager, logs)
    assert [e[0] for e in events].count("COPY_FINISHED") == len(segments)
    assert "COPY_ABORTED" not in [e[0] for e in events]
