"""A leader asks the broker's live high watermark when the checkpoint's holds a rolled segment back
(docs/operations.md "The high watermark"): it copies that segment now, not when the broker next
writes ``replication-offset-checkpoint``; it asks only then, and a broker that does not answer
leaves the checkpoint to decide. The broker here is a stand-in lister: what a live broker answers
is tests/live/test_live_hw.py's."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from rlm.cli.wiring import build_api
from rlm.cluster.log_starts import BrokerHighWatermarks, BrokerLogStarts
from rlm.config import load_settings
from rlm.formats.records import RecordSpec
from rlm.kafka.protocol import Codes
from rlm.kafka.reads import fetch_partition, partition_marks
from rlm.logdir.writer import LogWriter
from rlm.storage.local import LocalBackend
from rlm.testing.configs import write_config
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read import LATEST_TIERED
from rlm.tiering.read.readers import TieredReaders

TOPIC = "hw"


class _Broker:
    """Answers ListOffsets latest with ``hw`` (or raises ``error``), counting the partitions asked."""

    def __init__(self, hw: int | None) -> None:
        self.hw = hw
        self.error: Exception | None = None
        self.asked: list[tuple[str, int]] = []

    def __call__(self, keys: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        self.asked += keys
        if self.error is not None:
            raise self.error
        return {} if self.hw is None else {k: self.hw for k in keys}


def _setup(tmp_path: Path, *, cluster: dict[str, object] | None = None) -> tuple[RemoteLogManager, LogWriter]:
    writer = LogWriter(tmp_path / "logs", TOPIC, 0, segment_bytes=4096)
    for b in range(40):
        writer.append([RecordSpec(1_700_000_000_000 + b, b"k", bytes(300)) for _ in range(3)])
    bases = writer.segment_base_offsets
    writer.high_watermark = bases[1]  # the checkpoint commits the first segment only
    writer.write_checkpoints()
    writer.roll()  # the last one rolls now: the checkpoint has not caught up
    time.sleep(0.15)
    cfg = write_config(tmp_path / "c.toml", [tmp_path / "logs"], root=tmp_path / "store", cluster=cluster)
    return RemoteLogManager(load_settings(cfg), LocalBackend(root=str(tmp_path / "store"))), writer


def _asking(mgr: RemoteLogManager, broker: _Broker) -> None:
    mgr.shared.high_watermarks = BrokerHighWatermarks(mgr.settings.cluster, lister=broker)


def _tiered(mgr: RemoteLogManager) -> int:
    (result,) = mgr.run_once(gc=False)
    assert result.error is None, result.error
    (ctx,) = mgr.contexts()
    return ctx.progress.highest_tiered_offset


def test_a_segment_the_checkpoint_holds_back_is_copied_on_the_brokers_word(tmp_path: Path) -> None:
    mgr, writer = _setup(tmp_path)
    broker = _Broker(writer.log_end_offset)
    _asking(mgr, broker)
    assert _tiered(mgr) == writer.log_end_offset - 1  # every rolled segment, the last included
    assert broker.asked == [(TOPIC, 0)]
    assert _tiered(mgr) == writer.log_end_offset - 1 and broker.asked == [(TOPIC, 0)]  # nothing held back
    writer.close()


def test_without_an_answer_the_checkpoint_decides(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    mgr, writer = _setup(tmp_path)
    committed = writer.segment_base_offsets[1] - 1
    broker = _Broker(None)  # a partition the broker will not tell about
    _asking(mgr, broker)
    assert _tiered(mgr) == committed
    broker.hw, broker.error = writer.log_end_offset, ConnectionError("no broker")
    mgr.shared.high_watermarks = BrokerHighWatermarks(mgr.settings.cluster, lister=broker)
    with caplog.at_level(logging.ERROR):
        assert _tiered(mgr) == committed
        assert _tiered(mgr) == committed  # not asked again for a while: one line
    assert sum("cannot ask" in r.getMessage() for r in caplog.records) == 1
    lower = _Broker(committed - 5)  # an answer below the checkpoint's never lowers it
    _asking(mgr, lower)
    assert _tiered(mgr) == committed
    writer.close()


def test_a_follower_does_not_ask(tmp_path: Path) -> None:
    cluster = {"node_id": 2, "leadership": "static", "leaders": {f"{TOPIC}-0": 1}}
    mgr, writer = _setup(tmp_path, cluster=cluster)
    broker = _Broker(writer.log_end_offset)
    _asking(mgr, broker)
    assert _tiered(mgr) == -1 and broker.asked == []
    writer.close()


def test_with_the_log_start_check_a_read_at_a_lagging_checkpoints_end_is_out_of_range(tmp_path: Path) -> None:
    """Both askers on: the broker's word tiers past a checkpoint that still says 0, then DeleteRecords
    moves the log start past that end. A Fetch at 0, the files' visible end, is out of range, as
    the broker answers it: the listener once answered "nothing yet" with log start 0 (a
    consumer at the end asked nothing), so a consumer at 0 was not reset."""
    mgr, writer = _setup(tmp_path)
    writer.high_watermark = 0  # the broker wrote its checkpoint before the records came
    writer.write_checkpoints()
    _asking(mgr, _Broker(writer.log_end_offset))
    assert _tiered(mgr) == writer.log_end_offset - 1
    point = writer.segment_base_offsets[1] + 3  # DeleteRecords inside a tiered local segment
    starts = _Broker(point)
    readers = TieredReaders(
        mgr.settings,
        LocalBackend(root=str(tmp_path / "store")),
        progress=mgr.live_progress,
        log_starts=BrokerLogStarts(mgr.settings.cluster, lister=starts),
    )
    query = readers.log_start_query([(TOPIC, 0)])
    got = fetch_partition(readers, TOPIC, 0, 0, 1 << 20, False, "c", query)
    assert (got.error, got.log_start_offset, got.records) == (Codes.OFFSET_OUT_OF_RANGE, -1, b"")
    assert partition_marks(readers, TOPIC, 0, point, query) == (point, point)
    assert starts.asked == [(TOPIC, 0)]  # a waiting Fetch's re-checks take its read's answer
    ranges = readers.reader(TOPIC, 0).offsets(at=writer.log_end_offset)
    assert ranges.log_start_offset == 0 and len(starts.asked) == 1  # at the log's end: not asked
    writer.close()


def _readers(mgr: RemoteLogManager, tmp_path: Path, *, told: bool) -> TieredReaders:
    """The daemon's readers (rlm/cli/wiring.py): with ``told``, the manager's broker answers too."""
    return TieredReaders(
        mgr.settings,
        LocalBackend(root=str(tmp_path / "store")),
        progress=mgr.live_progress,
        checkpoints=mgr.checkpoints,
        high_watermarks=mgr.shared.high_watermarks if told else None,
    )


def test_readers_see_what_the_broker_said_until_it_writes_its_checkpoint(tmp_path: Path) -> None:
    """The copy tiered past the checkpoint on the broker's word: readers, status and -5 answer up to
    that high watermark too, not the file's older one, until the broker writes the file again;
    from then on the file decides, also when it says less (an unclean election meanwhile)."""
    mgr, writer = _setup(tmp_path)
    file_hw, end = writer.segment_base_offsets[1], writer.log_end_offset
    _asking(mgr, _Broker(end))
    assert _tiered(mgr) == end - 1
    told = build_api(mgr.settings, mgr).readers  # the daemon's, as rlm/cli/wiring.py wires them
    files_only = _readers(mgr, tmp_path, told=False)
    ranges = told.reader(TOPIC, 0).offsets()
    assert (ranges.visible_end_offset, ranges.high_watermark_source) == (end, "broker")
    assert told.reader(TOPIC, 0).visibility().special_offset(LATEST_TIERED) == end - 1
    assert partition_marks(told, TOPIC, 0, 0, None) == (0, end)  # a Fetch answer's (log start, HW)
    got = fetch_partition(told, TOPIC, 0, file_hw, 1 << 20, False, "c", None)
    assert got.error == Codes.NONE and got.records  # past the file's high watermark: served
    plain = files_only.reader(TOPIC, 0).offsets()
    assert (plain.visible_end_offset, plain.high_watermark_source) == (file_hw, "checkpoint")
    (row,) = mgr.status(observe=False)
    assert (row["visible_end_offset"], row["high_watermark_source"]) == (end, "broker")

    time.sleep(0.01)  # the broker writes its checkpoint after the answer: the file decides again
    writer.high_watermark = end - 3  # lower: the answer is not used once the file is newer
    writer.write_checkpoints()
    ranges = told.reader(TOPIC, 0).offsets()
    assert (ranges.visible_end_offset, ranges.high_watermark_source) == (end - 3, "checkpoint")
    writer.close()


def test_a_brokers_word_above_the_local_log_is_not_this_logs(tmp_path: Path) -> None:
    mgr, writer = _setup(tmp_path)
    file_hw, end = writer.segment_base_offsets[1], writer.log_end_offset
    _asking(mgr, _Broker(end + 100))  # the topic deleted and created again: another log's answer
    assert _tiered(mgr) == end - 1  # the copy takes a rolled segment below it: committed either way
    ranges = _readers(mgr, tmp_path, told=True).reader(TOPIC, 0).offsets()
    assert (ranges.visible_end_offset, ranges.high_watermark_source) == (file_hw, "checkpoint")
    writer.close()
