"""A lookup says where it found its record with typed data (rlm/tiering/read/answers.py): a local
answer names the segment's ``.log`` and the batch's byte position, a remote one the entry's remote
data identifier and length. A local fetch reads from that typed location (it used to read the file
path back out of the JSON dict). Real partitions (LogWriter) tiered by a real manager."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlm.logdir.discovery import list_segments
from rlm.storage.local import LocalBackend
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read.answers import LocalLocation, RemoteLocation
from rlm.tiering.read.readers import TieredReaders
from tests.lookup.helpers import BruteLog, delete_local_segments, settings_for, write_generated


@pytest.fixture
def readers(tmp_path: Path) -> tuple[TieredReaders, Path]:
    logs, store = tmp_path / "logs", tmp_path / "store"
    write_generated(logs, "orders", 0, batches=120, seed=11)
    settings = settings_for([logs], options={"root": str(store)})
    manager = RemoteLogManager(settings, LocalBackend(root=str(store)))
    assert all(r.error is None for r in manager.run_once())
    delete_local_segments(logs / "orders-0", keep_last=2)
    return TieredReaders(settings, LocalBackend(root=str(store))), logs / "orders-0"


def test_a_local_answer_names_the_log_file_and_the_batch_position(
    readers: tuple[TieredReaders, Path],
) -> None:
    tiered, part = readers
    newest = list_segments(part)[-1]
    brute = BruteLog.scan(part)
    offset = next(r.offset for r in brute.records if r.offset > newest.base_offset)
    found = tiered.reader("orders", 0).lookup_offset(offset)
    assert found.tier == "local" and isinstance(found.location, LocalLocation)
    assert found.location.file == newest.log and found.batch is not None
    assert found.location.position == found.batch.position
    assert found.to_json()["location"] == {"file": str(newest.log), "position": found.batch.position}
    fetched = tiered.reader("orders", 0).fetch(offset, 1 << 20)
    raw = newest.log.read_bytes()
    start = found.location.position
    assert fetched.tier == "local" and bytes(fetched.data) == raw[start : start + len(fetched.data)]


def test_a_remote_answer_names_the_entry(readers: tuple[TieredReaders, Path]) -> None:
    tiered, _ = readers
    found = tiered.reader("orders", 0).lookup_offset(0)
    assert found.tier == "remote" and isinstance(found.location, RemoteLocation)
    url, _, position = found.location.rdi.rpartition("#")
    assert url and int(position) >= 0 and found.location.data_length > 0
    assert found.to_json()["location"] == {
        "rdi": found.location.rdi,
        "data_length": found.location.data_length,
    }
