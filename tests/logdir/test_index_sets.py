"""The one reader of local remote-index sets (rlm/logdir/index_sets.py): sets written by the real
tiering engine (LogWriter partitions, RemoteLogManager, the local store), read back tolerantly —
a torn tail being appended is not visible, stray names are not sets."""

from __future__ import annotations

import itertools
from pathlib import Path

from rlm.formats import naming
from rlm.formats.indexes.remote_index import iter_entries
from rlm.logdir.index_sets import SET_SUFFIXES, SetCache, find_sets, read_local_entries
from rlm.storage.local import LocalBackend
from rlm.tiering.manager import RemoteLogManager
from tests.lookup.helpers import settings_for, write_generated


def _tiered(tmp_path: Path) -> Path:
    logs, store = tmp_path / "logs", tmp_path / "store"
    write_generated(logs, "t", 0, batches=200, seed=3, segment_bytes=6_000)
    # A small rotation size: several sets, so the reader must walk them in base order.
    settings = settings_for([logs], options={"root": str(store)}, index_rotate_bytes=300)
    RemoteLogManager(settings, LocalBackend(root=str(store))).run_once()
    return logs / "t-0"


def _strict(part: Path) -> list[tuple[int, int]]:
    out = []
    for base in sorted(find_sets(part)):
        buf = (part / naming.segment_file_name(base, naming.REMOTE_LOG_INDEX)).read_bytes()
        out += [(d.entry.first_offset, d.entry.last_offset) for d in iter_entries(buf)]
    return out


def test_every_set_is_read_in_offset_order(tmp_path: Path) -> None:
    part = _tiered(tmp_path)
    sets = find_sets(part)
    assert len(sets) >= 2 and all(found == set(SET_SUFFIXES) for found in sets.values())
    entries = [(e.first_offset, e.last_offset) for e in read_local_entries(part)]
    assert entries == _strict(part) and len(entries) >= 2
    assert all(a[1] < b[0] for a, b in itertools.pairwise(entries))
    views = SetCache().sets(part)
    assert [v.base_offset for v in views] == sorted(sets)
    assert views[-1].last is not None and views[-1].last.entry.last_offset == entries[-1][1]


def test_a_torn_tail_and_stray_names_are_not_read(tmp_path: Path) -> None:
    part = _tiered(tmp_path)
    whole = [(e.first_offset, e.last_offset) for e in read_local_entries(part)]
    before = find_sets(part)
    active = max(before)
    log_index = part / naming.segment_file_name(active, naming.REMOTE_LOG_INDEX)
    first_entry = log_index.read_bytes()[: next(iter_entries(log_index.read_bytes())).size]
    with log_index.open("ab") as fh:  # an append caught halfway: half of an entry
        fh.write(first_entry[: len(first_entry) // 2])
    (part / ("stray" + naming.REMOTE_LOG_INDEX)).write_bytes(first_entry)
    (part / ("00000000000000000007" + naming.REMOTE_TIME_INDEX)).write_bytes(b"")  # no entries
    assert set(find_sets(part)) == {*before, 7}  # "stray…" is no set: its name has no base offset
    assert [(e.first_offset, e.last_offset) for e in read_local_entries(part)] == whole
    views = SetCache().sets(part)
    assert views[-1].last is not None and views[-1].last.entry.last_offset == whole[-1][1]
    assert 7 not in [v.base_offset for v in views]
