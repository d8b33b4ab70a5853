"""A read_uncommitted Fetch answers the partition's last stable offset, as Kafka's broker does
(docs/kafka-listener.md §5), without building one transaction source per tiered segment each time:
the remote tier's sources are built once per version of the partition's index sets and local log
start (rlm/tiering/read/txn_sources.py ``reader_sources``), so a catch-up's fetches cost the same
over 5 or 500 tiered segments — and the answers still follow the local log start when the broker's
retention moves it.

The partition is a transactional log with transactions left open at its end (tests/tiering/test_lso.py's
layouts), so the last stable offset lies below the high watermark and depends on replaying the
segments nearest the local log; the oracle decodes every batch with kafka-python.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlm.kafka import reads
from rlm.kafka.protocol import Codes
from rlm.storage.local import LocalBackend
from rlm.tiering.read.readers import TieredReaders
from tests.lookup.helpers import delete_local_segments
from tests.tiering.test_lso import layout


class KeyCountingBackend(LocalBackend):
    """A local store counting :meth:`key_for_url`: one call per tiered segment is what building
    the remote sources costs."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.keys = 0

    def key_for_url(self, url: str) -> str:
        self.keys += 1
        return super().key_for_url(url)


def _fetch(readers: TieredReaders, offset: int) -> reads.FetchedPartition:
    got = reads.fetch_partition(readers, "txn", 0, offset, 4_000, False, "catch-up")
    assert got.error == Codes.NONE, got
    return got


def test_fetches_after_the_first_build_no_remote_source(tmp_path: Path) -> None:
    lay = layout(tmp_path, 1, leave_open=True, snapshots=False)
    backend = KeyCountingBackend(root=str(lay.store))
    readers = TieredReaders(lay.settings, backend)
    first = _fetch(readers, 0)
    assert first.last_stable_offset == lay.oracle.last_stable_offset < first.high_watermark
    built = backend.keys
    tiered = len(lay.bases) - 1
    assert built >= tiered > 5  # the first fetch built one source per tiered segment

    step = max(1, first.high_watermark // 40)
    offsets = range(0, first.high_watermark, step)
    answers = {_fetch(readers, offset).last_stable_offset for offset in offsets}
    assert answers == {lay.oracle.last_stable_offset}
    # the records' own objects only (a 4 KB fetch spans at most two), not every tiered segment's
    assert backend.keys - built <= 2 * len(offsets) < tiered * len(offsets)


def test_the_answer_follows_the_local_log_start(tmp_path: Path) -> None:
    lay = layout(tmp_path, 3, leave_open=True, snapshots=False)
    readers = TieredReaders(lay.settings, LocalBackend(root=str(lay.store)))
    assert _fetch(readers, 0).last_stable_offset == lay.oracle.last_stable_offset
    for keep in (2, 1):
        # the broker's retention deleted local segments: their offsets are the remote tier's now
        delete_local_segments(lay.part, keep_last=keep)
        got = _fetch(readers, 0)
        assert (got.last_stable_offset, got.high_watermark) == (
            lay.oracle.last_stable_offset,
            lay.oracle.high_watermark,
        )
