"""Reads that must not wait (rlm/nowait.py; the Kafka listener answers such Fetches on its event
loop, docs/kafka-listener.md §8): inside ``without_waiting`` every step that would wait — a store
read, a read ahead still in flight, reads a fetch would start in parallel, the broker's log start,
a segment's records on disk, the store's sets when the local remote index is lost, tiered
transaction data — raises ``BlockingIOError`` before that step starts (nothing asked of the store,
a range in flight left in the read-ahead window), and the same read outside (as the pool thread
that goes on with it) answers what it always did. Real tiered logs (LogWriter), requests counted
by rlm.testing.counting; no timing is asserted."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlm.nowait import may_wait, waiting_allowed, without_waiting
from rlm.storage.local import LocalBackend
from rlm.tiering.read.readers import TieredReaders
from tests.tiering.test_broker_log_start import Cluster, _tiered
from tests.tiering.test_lso import layout
from tests.tiering.test_readahead import Catchup, _rid


def test_may_wait_raises_only_inside_without_waiting() -> None:
    may_wait("a store read")  # outside: nothing
    assert waiting_allowed()
    with without_waiting():
        assert not waiting_allowed()
        with pytest.raises(BlockingIOError, match="a store read"):
            may_wait("a store read")
        with without_waiting():
            pass
        assert not waiting_allowed()  # a nested scope restores what was
    assert waiting_allowed()


@pytest.mark.parametrize("warm", [0, 1])  # nothing cached; the first entry (not the next ones)
def test_a_cold_remote_fetch_stops_before_any_store_read_then_answers_from_the_cache(
    tmp_path: Path, warm: int
) -> None:
    t = Catchup(tmp_path)
    readers = t.readers()
    start = readers.reader("orders", 0).offsets().remote_log_start_offset
    assert start is not None
    if warm:
        readers.reader("orders", 0).fetch(start, warm)  # one batch: its entry is cached
    t.backend.ranges.clear()
    stopped = "a store read" if not warm else "store reads"  # the entries it would read in parallel
    with without_waiting(), pytest.raises(BlockingIOError, match=stopped):
        readers.reader("orders", 0).fetch(start, 6_000, reader_key="c")
    pool = readers.resources.ahead._pool  # any read it had started in parallel: done after this
    if pool is not None:
        pool.shutdown(wait=True)
    assert not t.backend.ranges  # nothing was asked of the store
    readers = t.readers()  # (that pool is shut)
    first = readers.reader("orders", 0).fetch(start, 6_000, reader_key="c")
    assert len(first.batches) > 1 and t.backend.ranges
    with without_waiting():  # now cached: answered without waiting, the same bytes
        again = readers.reader("orders", 0).fetch(start, 6_000)
    assert bytes(again.data) == bytes(first.data)


def test_a_range_read_ahead_in_flight_is_not_waited_for_and_stays_in_the_window(tmp_path: Path) -> None:
    t = Catchup(tmp_path, gate=True)  # the read-ahead threads' reads are held until the gate opens
    assert t.gate is not None
    readers = t.readers()
    ahead, rid = readers.resources.ahead, _rid("r")
    offset = readers.reader("orders", 0).offsets().remote_log_start_offset
    assert offset is not None
    for _ in range(2):  # sequential from the second: its next entries are read ahead (held)
        offset = readers.reader("orders", 0).fetch(offset, 1_000, reader_key="r").next_offset
        assert offset is not None
    window = ahead._readers[rid].window  # which ranges it holds, in chain order
    stopped = None
    for _ in range(200):  # one batch at a time through what landed (a fetch's rest, kept)
        held, before = ahead.reader_bytes(rid), list(window)
        try:
            with without_waiting():
                got = readers.reader("orders", 0).fetch(offset, 1, reader_key="r")
        except BlockingIOError as err:
            stopped = str(err)
            break
        assert got.next_offset is not None
        offset = got.next_offset
    assert stopped is not None and "in flight" in stopped, stopped
    in_flight = [k for k in before if not ahead.landed(rid, k)]
    assert in_flight and [k for k in window if k in in_flight] == in_flight  # still there, to be taken
    taken = [k for k in before if k not in window]  # landed ranges the stopped read took: now cached
    assert all(k in readers.resources.cache for k in taken)
    t.gate.opened.set()
    ahead.settle(60)
    with without_waiting():
        got = readers.reader("orders", 0).fetch(offset, 1, reader_key="r")
    assert ahead.reader_bytes(rid) < held
    assert got.batches and bytes(got.data) == bytes(readers.reader("orders", 0).fetch(offset, 1).data)


def test_a_local_segment_is_not_read_without_waiting(tmp_path: Path) -> None:
    t = Catchup(tmp_path)
    readers = t.readers()
    with without_waiting(), pytest.raises(BlockingIOError, match="on disk"):
        readers.reader("orders", 0).fetch(t.local_start, 1_000)
    assert readers.reader("orders", 0).fetch(t.local_start, 1_000).tier == "local"


def test_the_broker_is_not_asked_without_waiting_and_a_fresh_answer_is_used(tmp_path: Path) -> None:
    cluster = Cluster({("t", 0): 0})
    readers, _bases = _tiered(tmp_path, cluster, max_age_ms=60_000)
    query = readers.log_start_query()
    with without_waiting(), pytest.raises(BlockingIOError, match="log start"):
        readers.reader("t", 0, query).fetch(0, 1_000)
    assert cluster.asked == []
    readers.reader("t", 0, query).fetch(0, 1_000)
    assert cluster.asked == [[("t", 0)]]
    with without_waiting():  # answered within the max age: nothing to wait for
        readers.reader("t", 0, readers.log_start_query()).offsets()
    assert cluster.asked == [[("t", 0)]]


def test_the_stores_sets_are_not_built_without_waiting(tmp_path: Path) -> None:
    t = Catchup(tmp_path)
    for f in t.part.iterdir():  # the local remote index lost: the store's sets answer instead
        if f.suffix in (".remotelogindex", ".remoteoffsetindex", ".remotetimeindex"):
            f.unlink()
    readers = t.readers()
    start = readers.reader("orders", 0).offsets().remote_log_start_offset
    assert start is not None
    t.backend.ranges.clear()
    with without_waiting(), pytest.raises(BlockingIOError, match="index sets"):
        readers.reader("orders", 0).fetch(start, 1)
    assert not t.backend.ranges
    first = readers.reader("orders", 0).fetch(start, 1)  # builds them (kept for the partition)
    with without_waiting():
        assert bytes(readers.reader("orders", 0).fetch(start, 1).data) == bytes(first.data)


def test_tiered_transaction_data_is_not_read_without_waiting(tmp_path: Path) -> None:
    # no recorded open transactions: the last stable offset scans the tiered segments' batches
    scan = layout(tmp_path / "scan", 1, True, snapshots=False, recorded=False)
    readers = TieredReaders(scan.settings, LocalBackend(root=str(scan.store)))
    # the first wait is the segment's manifest, read from the store (the storage API's own check)
    with without_waiting(), pytest.raises(BlockingIOError, match=r"a store request|control batches"):
        readers.reader("txn", 0).visibility().last_stable_offset()
    lso = readers.reader("txn", 0).visibility().last_stable_offset()
    assert lso == scan.oracle.last_stable_offset
    # a read_committed answer's aborted transactions: the tiered segments' transaction indexes
    indexed = layout(tmp_path / "indexed", 1, False, snapshots=False)
    readers = TieredReaders(indexed.settings, LocalBackend(root=str(indexed.store)))
    vis = readers.reader("txn", 0).visibility()
    end = vis.end("read_committed")
    with without_waiting(), pytest.raises(BlockingIOError, match="transaction index"):
        vis.aborted(0, end)
    found = vis.aborted(0, end).entries
    assert found
    with without_waiting():  # kept once read (immutable bytes)
        assert readers.reader("txn", 0).visibility().aborted(0, end).entries == found
