"""The broker's deadlines (docs/topic-policy.md §8; issue #30 item 3): the model of when Kafka's
retention deletes a local segment, checked against hand-worked cases of Kafka's rules; the largest
timestamp read from real segment files (LogWriter); the status row, the metric and the warning;
and the copy order — the partition nearest its deadline is passed first.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from pathlib import Path
from typing import BinaryIO

import pytest

from rlm.daemon.scheduler import TieringDaemon
from rlm.errors import TransientStorageError
from rlm.formats.records import RecordSpec, iter_batches
from rlm.logdir.discovery import list_segments
from rlm.logdir.timestamps import largest_timestamp
from rlm.logdir.writer import LogWriter
from rlm.storage.api import ObjectInfo
from rlm.storage.local import LocalBackend
from rlm.tiering.expire.deadline_watch import forget_deadline, note_deadline
from rlm.tiering.expire.deadlines import (
    Deadline,
    LocalRetention,
    LocalSegment,
    broker_deadlines,
    by_deadline,
    margin_ms,
)
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.manager import RemoteLogManager
from tests.lookup.helpers import settings_for

H = 3_600_000
WEEK = 168 * H  # Kafka's default retention.ms: what the broker keeps without a metadata log


def segs(*rows: tuple[int, int, int | None]) -> list[LocalSegment]:
    """(base, size, largest timestamp) rows, oldest first; the last one is the active segment."""
    return [
        LocalSegment(base, size, ts, rows[n + 1][0] if n + 1 < len(rows) else None)
        for n, (base, size, ts) in enumerate(rows)
    ]


THREE = segs((0, 100, 1000), (10, 100, 2000), (20, 50, 2500))


def fates(out: list[Deadline]) -> list[tuple[int | None, str | None, int | None]]:
    return [(d.deadline_ms, d.cause, d.headroom_bytes) for d in out]


def test_time_retention_deletes_once_now_minus_largest_timestamp_exceeds_retention_ms() -> None:
    out = broker_deadlines(THREE, LocalRetention(500, -1), now_ms=1200)
    # Kafka: startMs - largestTimestamp > retentionMs, so the first moment is ts + retention + 1;
    # the committed, non-empty active segment goes too (the broker rolls a new one first).
    assert fates(out) == [(1501, "time", None), (2501, "time", None), (3001, "time", None)]
    assert margin_ms(out[0], 1200) == 301
    assert margin_ms(out[0], 1600) == -99  # overdue: gone at the broker's next check


def test_time_retention_never_deletes_a_segment_before_an_older_one() -> None:
    # The second segment's records are older than the first's: the predicate stops at the first
    # segment it keeps, so the second waits for the first.
    out = broker_deadlines(segs((0, 100, 1000), (10, 100, 700), (20, 0, None)), LocalRetention(500, -1), 0)
    assert fates(out)[:2] == [(1501, "time", None), (1501, "time", None)]


def test_size_retention_deletes_the_oldest_while_the_rest_still_exceeds_retention_bytes() -> None:
    # 250 bytes, retention.bytes 100: Kafka's diff = 150; the first (100) goes (diff 50), the
    # second (100) would leave -50: kept. Headroom = bytes still appendable before each goes.
    out = broker_deadlines(THREE, LocalRetention(-1, 100), now_ms=7)
    assert fates(out) == [(7, "size", -50), (None, None, 50), (None, None, 100)]


def test_size_and_time_together_each_segment_goes_by_the_first_rule_that_breaches_it() -> None:
    out = broker_deadlines(THREE, LocalRetention(500, 100), now_ms=1200)
    assert fates(out) == [(1200, "size", -50), (2501, "time", 50), (3001, "time", 100)]
    # Exactly at retention.bytes nothing is over: diff 0, no segment fits in it.
    assert broker_deadlines(THREE, LocalRetention(-1, 250), 0)[0].deadline_ms is None


def test_unlimited_retention_sets_no_deadline() -> None:
    out = broker_deadlines(THREE, LocalRetention(-1, -1), now_ms=1200)
    assert fates(out) == [(None, None, None)] * 3
    assert margin_ms(out[0], 1200) is None
    assert margin_ms(None, 1200) is None


def test_the_active_segment_goes_only_when_non_empty_and_committed() -> None:
    empty_active = segs((0, 100, 1000), (10, 0, None))
    assert fates(broker_deadlines(empty_active, LocalRetention(500, -1), 0))[1] == (None, None, None)
    uncommitted = LocalRetention(500, -1, active_committed=False)
    assert broker_deadlines(THREE, uncommitted, 0)[2].deadline_ms is None
    assert broker_deadlines(THREE, uncommitted, 0)[1].deadline_ms == 2501  # rolled ones unaffected


def test_log_start_breached_segments_are_due_now_whatever_their_age() -> None:
    out = broker_deadlines(THREE, LocalRetention(-1, -1, log_start_offset=15), now_ms=1200)
    # The first segment ends below the log start (DeleteRecords moved it): next check. The second
    # straddles it: kept (no retention limit), and so is everything after it.
    assert fates(out) == [(1200, "log start", None), (None, None, None), (None, None, None)]


def test_a_segment_without_a_known_timestamp_blocks_the_later_ones() -> None:
    out = broker_deadlines(segs((0, 100, None), (10, 100, 900), (20, 1, 950)), LocalRetention(500, -1), 0)
    assert [d.deadline_ms for d in out] == [None, None, None]


def test_by_deadline_orders_nearest_first_and_keeps_the_rest_in_order() -> None:
    deadlines = {"a": None, "b": 50, "c": 10, "d": None, "e": 50}
    assert by_deadline(list(deadlines), deadlines.get) == ["c", "b", "e", "a", "d"]


# -- real segment files ------------------------------------------------------------------------


def write_partition(log_dir: Path, topic: str, t0: int, *, segments: int = 3) -> None:
    """``segments × 20`` records of ~100 bytes (offset n stamped t0 + n s) in 1 000-byte segments."""
    with LogWriter(log_dir, topic, 0, segment_bytes=1_000) as w:
        for n in range(segments * 20):
            w.append([RecordSpec(t0 + 1000 * n, b"k", b"x" * 40)])


def test_largest_timestamp_is_the_time_index_last_entry_or_the_log_mtime(tmp_path: Path) -> None:
    write_partition(tmp_path, "t", 1_700_000_000_000)
    listed = list_segments(tmp_path / "t-0")
    assert len(listed) >= 3
    data = listed[0].log.read_bytes()
    assert largest_timestamp(listed[0]) == max(b.max_timestamp for b in iter_batches(data))
    # A rolled segment's index is trimmed: an entry of timestamp 0 at its base is twelve zero
    # bytes and still its last entry (Kafka's largestTimestamp 0, not the file's mtime).
    zero = tmp_path / "zero.timeindex"
    zero.write_bytes(bytes(12))
    assert largest_timestamp(dataclasses.replace(listed[0], time_index=zero)) == 0
    # The active segment's is preallocated: its zero tail is not entries.
    prealloc = tmp_path / "prealloc.timeindex"
    prealloc.write_bytes(listed[0].time_index.read_bytes() + bytes(120))
    active = dataclasses.replace(listed[0], time_index=prealloc)
    assert largest_timestamp(active, active=True) == largest_timestamp(listed[0])
    assert listed[0].time_index is not None
    listed[0].time_index.unlink()  # no index: Kafka falls back to the file's last-modified time
    os.utime(listed[0].log, (1_234_567, 1_234_567))
    assert largest_timestamp(list_segments(tmp_path / "t-0")[0]) == 1_234_567_000


class Logs:
    """Two partitions beside each other: ``far`` written an hour ago, ``near`` 167.5 h ago, so
    under Kafka's default retention.ms (168 h) the broker deletes near's oldest segment first."""

    def __init__(self, tmp_path: Path, now: int, store: type[LocalBackend] = LocalBackend) -> None:
        self.logs = tmp_path / "logs"
        self.now = now
        write_partition(self.logs, "far", now - H)
        write_partition(self.logs, "near", now - WEEK + H // 2)
        settings = settings_for([self.logs], options={"root": str(tmp_path / "store")}, deadline_warn_ms=H)
        self.metrics = TieringMetrics()
        self.manager = RemoteLogManager(
            settings,
            store(root=str(tmp_path / "store")),
            metrics=self.metrics,
            clock_ms=lambda: self.now,
        )

    def margin_metric(self, topic: str) -> float | None:
        return self.metrics.registry.get_sample_value(
            "rlm_retention_margin_seconds", {"topic": topic, "partition": "0"}
        )


def test_status_shows_the_smallest_margin_and_the_daemon_passes_the_nearest_partition_first(
    tmp_path: Path,
) -> None:
    logs = Logs(tmp_path, 1_800_000_000_000)
    parts = logs.manager.discover()
    assert [p.topic for p in logs.manager.copy_order(parts)] == ["far", "near"]  # nothing known yet
    rows = {r["topic"]: r for r in logs.manager.status()}
    near = list_segments(logs.logs / "near-0")
    # near's oldest segment's largest timestamp: its last record's (offset n at t0 + n s)
    expected = logs.now - WEEK + H // 2 + 1000 * (near[1].base_offset - 1) + WEEK + 1
    assert rows["near"]["retention_deadline_ms"] == expected
    assert rows["near"]["retention_margin_ms"] == expected - logs.now
    assert rows["near"]["retention_deadline_offset"] == near[0].base_offset
    assert rows["near"]["retention_deadline_cause"] == "time"
    assert rows["near"]["retention_headroom_bytes"] is None  # no retention.bytes
    assert rows["far"]["retention_margin_ms"] > rows["near"]["retention_margin_ms"]

    assert [p.topic for p in logs.manager.copy_order(parts)] == ["near", "far"]
    daemon = TieringDaemon(logs.manager)
    submitted: list[list[str]] = []
    daemon._submit = submitted.append  # type: ignore[method-assign]
    daemon.discover()
    daemon.sweep()
    assert submitted[-1] == ["near-0", "far-0"]
    daemon.passes.shutdown()


def test_a_pass_publishes_the_margin_and_warns_once_per_episode(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    logs = Logs(tmp_path, 1_800_000_000_000)
    manager = logs.manager
    [part] = [p for p in manager.discover() if p.topic == "near"]
    ctx = manager.context(part)
    segments = list_segments(part)
    pending = manager.pending(ctx, segments)
    assert len(pending) == len(segments) - 1
    policy, state = manager.policy_for(part), manager.state_of(ctx)
    caplog.set_level(logging.WARNING, "rlm.tiering.expire.deadline_watch")

    def note(now: int) -> Deadline | None:
        logs.now = now
        return note_deadline(ctx, segments, pending, policy, state)

    first = note(logs.now)  # 30 min + 19 s left, below the 1 h threshold: one warning
    assert first is not None and first.deadline_ms is not None
    assert logs.margin_metric("near") == (first.deadline_ms - logs.now) / 1000
    note(logs.now + 60_000)  # still below: no second line
    warnings = [r for r in caplog.records if "near-0" in r.getMessage()]
    assert len(warnings) == 1 and "time retention" in warnings[0].getMessage()
    note(first.deadline_ms - 2 * H)  # back above the threshold: the episode ends
    note(first.deadline_ms + 5)  # overdue: a new episode, a new line, a negative margin
    assert len([r for r in caplog.records if "near-0" in r.getMessage()]) == 2
    assert logs.margin_metric("near") == -0.005
    forget_deadline(ctx)  # leadership moved away: the leader watches it now
    assert ctx.deadline is None and logs.margin_metric("near") == math.inf
    assert manager.copy_order(manager.discover())[0].topic == "far"  # no deadline known any more
    ctx.progress.highest_tiered_offset = pending[-1].next_base - 1  # everything tiered
    assert note(logs.now) is None
    assert logs.margin_metric("near") == math.inf


class DownStore(LocalBackend):
    """The real local backend with every upload failing, as a store that is down."""

    def _put(self, key: str, stream: BinaryIO, if_absent: bool) -> ObjectInfo:
        raise TransientStorageError("store down (test)")


def test_a_pass_whose_copy_fails_still_publishes_the_margin_and_orders_the_next_sweep(tmp_path: Path) -> None:
    logs = Logs(tmp_path, 1_800_000_000_000, store=DownStore)
    results = logs.manager.run_once(gc=False)
    assert {r.topic for r in results} == {"far", "near"} and all(r.error for r in results)
    near, far = logs.margin_metric("near"), logs.margin_metric("far")
    assert near is not None and far is not None and 0 < near < far < math.inf
    assert [p.topic for p in logs.manager.copy_order(logs.manager.discover())] == ["near", "far"]
