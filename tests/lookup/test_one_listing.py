"""One request, one listing of the partition directory (issue #32, docs/visibility.md): the segments,
the remote-index sets and the bounds a read applies all come from the same listing — a Kafka Fetch
under either isolation level, every ListOffsets, and the HTTP/CLI lookups and fetches. Once the
directory has settled, later requests list it no more until it changes (rlm/logdir/listing_cache.py).

The partition is transactional with a transaction left open in its tiered segments and one local
segment left (as tests/tiering/test_lso.py builds them), so read_committed answers need the
transactions of both tiers, and reads reach the remote tier through the local remote-index sets. It
has a topic id, as every partition of a KRaft broker: a partition without ``partition.metadata``
(a pre-2.8 log) costs one listing more, the re-creation check of docs/topic-identity.md.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rlm.config import settings_from_mapping
from rlm.formats.partition_metadata import format_partition_metadata
from rlm.fsutil import SETTLE_NS
from rlm.kafka import reads
from rlm.kafka.protocol import Codes
from rlm.logdir.discovery import PARTITION_METADATA
from rlm.storage.local import LocalBackend
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read import EARLIEST, EARLIEST_LOCAL, LATEST, LATEST_TIERED, MAX_TIMESTAMP, TieredReaders
from rlm.tiering.read import isolation as txn
from tests.lookup.helpers import delete_local_segments
from tests.tiering.test_lso import Layout
from tests.tiering.txn_helpers import Oracle, write_txn_log

TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAQ"


class Listings:
    """Counts os.listdir / os.scandir calls on one directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = os.path.realpath(directory)
        self.count = 0

    def wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def counted(path: Any = ".", *args: Any, **kwargs: Any) -> Any:
            if os.path.realpath(os.fspath(path)) == self.directory:
                self.count += 1
            return real(path, *args, **kwargs)

        return counted

    def of(self, request: Callable[[], Any], *, touch: bool = True) -> int:
        """The listings ``request`` makes. ``touch``: the directory changed just before (its
        mtime now), so no listing is kept (rlm/logdir/listing_cache.py) and each one the request
        makes is counted; else as it is (a settled directory's listing is kept)."""
        if touch:
            os.utime(self.directory)
        self.count = 0
        request()
        return self.count


@pytest.fixture(scope="module")
def lay(tmp_path_factory: pytest.TempPathFactory) -> Layout:
    tmp = tmp_path_factory.mktemp("listing")
    logs, store = tmp / "logs", tmp / "store"
    write_txn_log(logs, "txn", 0, seed=5, leave_open=True)
    part = logs / "txn-0"
    (part / PARTITION_METADATA).write_bytes(format_partition_metadata(TOPIC_ID))
    s = settings_from_mapping(
        {
            "log": {"dirs": [str(logs)], "eligibility": "rolled"},
            "remote": {"backend": "local", "options": {"root": str(store)}},
            "tiering": {"state_dir": str(tmp / "state"), "index_entry_bytes": 2_000},
        }
    )
    assert all(r.error is None for r in RemoteLogManager(s, LocalBackend(root=str(store))).run_once())
    delete_local_segments(part, keep_last=1)
    return Layout(s, store, part, Oracle.of(part), [])


@pytest.fixture
def listings(lay: Layout, monkeypatch: pytest.MonkeyPatch) -> Iterator[Listings]:
    counter = Listings(lay.part)
    monkeypatch.setattr(os, "listdir", counter.wrap(os.listdir))
    monkeypatch.setattr(os, "scandir", counter.wrap(os.scandir))
    yield counter


def _readers(lay: Layout) -> TieredReaders:
    return TieredReaders(lay.settings, LocalBackend(root=str(lay.store)))


def test_the_layout_reads_both_tiers(lay: Layout) -> None:
    vis = _readers(lay).reader("txn", 0).visibility()
    o = vis.offsets
    assert o.remote_log_start_offset is not None and o.local_log_start_offset is not None
    assert o.remote_log_start_offset < o.local_log_start_offset  # tiered history below the local log
    lso = vis.last_stable_offset()
    assert lso is not None and o.visible_end_offset is not None and lso < o.visible_end_offset


@pytest.mark.parametrize("committed", [False, True], ids=["read_uncommitted", "read_committed"])
def test_a_kafka_fetch_lists_the_directory_once(lay: Layout, listings: Listings, committed: bool) -> None:
    readers = _readers(lay)
    start = readers.reader("txn", 0).visibility().offsets.log_start_offset
    assert start is not None
    got: list[Any] = []
    n = listings.of(
        lambda: got.append(reads.fetch_partition(readers, "txn", 0, start, 1 << 20, committed, "k"))
    )
    assert got[0].error == Codes.NONE and got[0].records
    assert n == 1


@pytest.mark.parametrize("ts", [LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED, 0])
@pytest.mark.parametrize("committed", [False, True], ids=["read_uncommitted", "read_committed"])
def test_a_list_offsets_lists_the_directory_once(
    lay: Layout, listings: Listings, ts: int, committed: bool
) -> None:
    readers = _readers(lay)
    got: list[Any] = []
    n = listings.of(lambda: got.append(reads.list_offset(readers, "txn", 0, ts, committed, version=9)))
    assert got[0].error == Codes.NONE
    assert n == 1


@pytest.mark.parametrize("ts", [LATEST, EARLIEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED, 0])
def test_a_timestamp_lookup_lists_the_directory_once(lay: Layout, listings: Listings, ts: int) -> None:
    reader = _readers(lay).reader("txn", 0)
    assert listings.of(lambda: reader.lookup_timestamp(ts)) == 1


@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_an_http_fetch_and_lookup_list_the_directory_once(
    lay: Layout, listings: Listings, isolation: txn.Isolation
) -> None:
    readers = _readers(lay)
    start = readers.reader("txn", 0).visibility().offsets.log_start_offset
    assert start is not None
    assert listings.of(lambda: txn.fetch(readers.reader("txn", 0), start, 1 << 20, isolation)) == 1
    assert listings.of(lambda: readers.reader("txn", 0).lookup_offset(start)) == 1


def test_a_settled_directory_is_not_listed_again_until_it_changes(lay: Layout, listings: Listings) -> None:
    then = time.time_ns() - 2 * SETTLE_NS
    os.utime(lay.part, ns=(then, then))
    readers = _readers(lay)
    start = readers.reader("txn", 0).visibility().offsets.log_start_offset
    assert start is not None

    def fetch() -> Any:
        return reads.fetch_partition(readers, "txn", 0, start, 1 << 20, True, "k")

    first: list[Any] = []
    assert listings.of(lambda: first.append(fetch()), touch=False) == 0  # listed by the visibility above
    again: list[Any] = []
    assert listings.of(lambda: again.append(fetch()), touch=False) == 0
    assert again[0].records == first[0].records and first[0].error == Codes.NONE
    marker = lay.part / "00000000000999999999.log.deleted"  # a change of the entries: listed again
    marker.write_bytes(b"")
    try:
        assert listings.of(fetch, touch=False) == 1
    finally:
        marker.unlink()
