"""What the read path remembers between a partition's Fetches about its local remote-index sets
(rlm/logdir/index_sets.py ``SetCache``, rlm/tiering/read/served_sets.py ``StoreSets``) is
answered again as soon as anything it depends on changed: the directory's listing, a set, the
claim of the progress. Real sets, written by the real tiering engine into the local store."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlm.formats import naming
from rlm.formats.indexes.remote_index import iter_entries
from rlm.formats.indexes.remote_index_derived import find_entry_for_offset
from rlm.logdir import index_sets
from rlm.logdir.discovery import list_names, partition_dir
from rlm.logdir.index_sets import SetCache
from rlm.storage.local import LocalBackend
from rlm.tiering.local import Progress
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read.served_sets import StoreSets
from rlm.tiering.store import StoreProtection
from tests.lookup.helpers import settings_for, write_generated


def _tiered(tmp_path: Path) -> tuple[Path, LocalBackend]:
    logs, store = tmp_path / "logs", tmp_path / "store"
    write_generated(logs, "t", 0, batches=200, seed=3, segment_bytes=6_000)
    settings = settings_for([logs], options={"root": str(store)}, index_rotate_bytes=300)
    backend = LocalBackend(root=str(store))
    RemoteLogManager(settings, backend).run_once()
    return logs, backend


def test_the_sets_of_a_listing_follow_the_listing(tmp_path: Path) -> None:
    logs, _ = _tiered(tmp_path)
    part = logs / "t-0"
    cache = SetCache()
    names = list_names(part)
    every = [v.base_offset for v in cache.sets(part, names)]
    assert len(every) >= 3
    gate = naming.segment_file_name(every[1], naming.REMOTE_OFFSET_INDEX)
    without = [n for n in names if n != gate]  # a listing taken while the set was being republished
    assert [v.base_offset for v in cache.sets(part, without)] == every[:1] + every[2:]
    assert [v.base_offset for v in cache.sets(part, names)] == every
    (part / gate).unlink()  # the same listing, but the gate is gone now: the set is not served
    assert [v.base_offset for v in cache.sets(part, names)] == every[:1] + every[2:]


def test_local_sets_found_whole_are_checked_again_when_the_sets_or_the_claim_change(tmp_path: Path) -> None:
    logs, backend = _tiered(tmp_path)
    part = partition_dir(logs, "t", 0)
    local = SetCache().sets(part.path)
    first, last = local[0].first, local[-1].last
    assert first is not None and last is not None and len(local) >= 3
    whole = Progress(
        highest_tiered_offset=last.entry.last_offset, remote_log_start_offset=first.entry.first_offset
    )
    sets = StoreSets(backend, StoreProtection())
    assert sets.served(part, whole, local) is local
    assert sets.served(part, whole, local) is local  # remembered
    # The last set is gone (retention, a rebuild): the same claim is no longer covered.
    shorter = local[:-1]
    assert sets.served(part, whole, shorter) is not shorter
    # The progress claims more than the sets hold: the store answers.
    ahead = Progress(highest_tiered_offset=last.entry.last_offset + 1, remote_log_start_offset=0)
    assert sets.served(part, ahead, local) is not local
    # Views read again (new objects, say after the cache dropped them): checked again, still whole.
    again = SetCache().sets(part.path)
    assert sets.served(part, whole, again) is again


def test_entries_a_view_keeps_are_the_entries_its_bytes_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs, _ = _tiered(tmp_path)
    monkeypatch.setattr(index_sets, "_DECODED_PER_VIEW", 2)  # so the walk starts over several times
    for view in SetCache().sets(logs / "t-0"):
        assert view.first is not None and view.last is not None
        strict = list(iter_entries(view.log_index))
        for _ in range(2):  # decoded, then kept (or decoded again once over the bound)
            assert list(view.entries_from(view.first)) == strict
            for offset in range(view.first.entry.first_offset - 1, view.last.entry.last_offset + 2):
                assert view.find_entry(offset) == find_entry_for_offset(view.offsets, view.log_index, offset)
        assert len(view._decoded) <= 2
