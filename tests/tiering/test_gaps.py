"""Gaps (docs/visibility.md, "Gaps"): offsets the broker deleted before rlm tiered them are recorded
and named on every surface. Generated partitions (LogWriter), the real engine, the local store:
some segments are tiered, the next ones are deleted before rlm sees them, then a pass."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from rlm.errors import OffsetInGapError
from rlm.formats.checkpoint import format_offset_checkpoint
from rlm.logdir.discovery import REPLICATION_OFFSET_CHECKPOINT, list_segments
from rlm.storage.local import LocalBackend
from rlm.testing.daemon import rlm_cli
from rlm.tiering.local.gaps import DELETED_BEFORE_TIERED, MISSING_IN_STORE
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.local.state import PROGRESS_FILE
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read.readers import TieredReaders
from tests.lookup.edges import _unlink_segments, delete_records
from tests.lookup.helpers import settings_for, write_config, write_generated

T = "t"


class Setup:
    """A partition of ~12 segments whose high watermark is first held at the 4th segment's base,
    so a pass tiers exactly the first three."""

    def __init__(self, tmp_path: Path, clock: list[int]) -> None:
        self.logs, self.store = tmp_path / "logs", tmp_path / "store"
        write_generated(self.logs, T, 0, batches=160, seed=5, segment_bytes=8_000)
        self.part = self.logs / f"{T}-0"
        self.bases = [s.base_offset for s in list_segments(self.part)]
        assert len(self.bases) >= 8
        self.hw_file = self.logs / REPLICATION_OFFSET_CHECKPOINT
        self.real_hw = self.hw_file.read_text()
        self.settings = settings_for(
            [self.logs], options={"root": str(self.store)}, eligibility="high-watermark"
        )
        self.clock = clock
        self.manager = self.new_manager()

    def new_manager(self) -> RemoteLogManager:
        backend = LocalBackend(root=str(self.store))
        return RemoteLogManager(
            self.settings, backend, metrics=TieringMetrics(), clock_ms=lambda: self.clock[0]
        )

    def hold_hw(self, offset: int) -> None:
        self.hw_file.write_text(format_offset_checkpoint({(T, 0): offset}))

    def release_hw(self) -> None:
        self.hw_file.write_text(self.real_hw)

    def run(self) -> None:
        assert [r.error for r in self.manager.run_once()] == [None]

    def readers(self) -> TieredReaders:
        return TieredReaders(
            self.settings, LocalBackend(root=str(self.store)), progress=self.manager.live_progress
        )

    def row(self) -> dict[str, object]:
        rows = self.manager.status()
        assert len(rows) == 1
        return rows[0]

    def metric(self) -> float | None:
        return self.manager.shared.metrics.registry.get_sample_value(
            "rlm_gap_offsets", {"topic": T, "partition": "0"}
        )


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return Setup(tmp_path, [1_000_000])


def tier_three_then_lose_two(s: Setup) -> tuple[int, int]:
    """Tier segments 0-2; the broker deletes segments 3 and 4 before rlm sees them; a pass.
    Returns the lost range (inclusive)."""
    s.hold_hw(s.bases[3])
    s.run()
    assert s.manager.live_progress(s.manager.discover()[0]).highest_tiered_offset == s.bases[3] - 1
    _unlink_segments(s.part, s.bases[:5])  # 0-2 were tiered (local retention), 3-4 never were
    s.release_hw()
    s.clock[0] = 2_000_000
    s.run()
    return s.bases[3], s.bases[5] - 1


def test_a_segment_deleted_before_it_was_tiered_is_a_recorded_gap(setup: Setup) -> None:
    first, last = tier_three_then_lose_two(setup)
    gap = {
        "first_offset": first,
        "last_offset": last,
        "noticed_ms": 2_000_000,
        "reason": DELETED_BEFORE_TIERED,
    }
    row = setup.row()
    assert row["gaps"] == [gap]
    assert row["highest_tiered_offset"] > last  # the copy went on above the gap
    assert setup.metric() == last - first + 1
    setup.clock[0] = 3_000_000  # another pass: the same gap, noticed when it was first seen
    setup.run()
    assert setup.row()["gaps"] == [gap]
    # A restart keeps it (progress.json), and so does a rebuild of the local index.
    setup.manager = setup.new_manager()
    assert setup.row()["gaps"] == [gap]
    setup.manager.rebuild_index()
    assert setup.row()["gaps"] == [gap]


def test_reads_inside_a_gap_name_it_and_never_skip_past_it(setup: Setup) -> None:
    first, last = tier_three_then_lose_two(setup)
    reader = setup.readers().reader(T, 0)
    for offset in (first, (first + last) // 2, last):
        found = reader.lookup_offset(offset)
        assert not found.found and found.gap is not None
        assert (found.gap.first_offset, found.gap.last_offset) == (first, last)
        doc = found.to_json()
        assert doc["gap"]["first_offset"] == first and "not available in any tier" in doc["reason"]
        with pytest.raises(OffsetInGapError) as err:
            reader.fetch(offset, 1 << 20)
        assert (err.value.first_offset, err.value.last_offset) == (first, last)
        assert f"{first}-{last}" in str(err.value)
    assert reader.lookup_offset(first - 1).found
    assert reader.lookup_offset(last + 1).offset == last + 1
    # A fetch just below the gap ends at it: the next fetch names the gap.
    below = reader.fetch(first - 1, 1 << 20)
    assert below.batches and below.next_offset == first


def test_a_lost_state_dir_finds_the_same_gap_in_the_store(setup: Setup) -> None:
    first, last = tier_three_then_lose_two(setup)
    state = setup.manager.context(setup.manager.discover()[0]).state_dir
    (state / PROGRESS_FILE).unlink()
    setup.manager = setup.new_manager()  # e.g. another sidecar, or this one after losing its state
    setup.clock[0] = 5_000_000
    setup.run()
    assert setup.row()["gaps"] == [
        {"first_offset": first, "last_offset": last, "noticed_ms": 5_000_000, "reason": MISSING_IN_STORE}
    ]


def test_nothing_below_a_delete_records_point_is_a_gap(setup: Setup) -> None:
    setup.hold_hw(setup.bases[3])
    setup.run()
    point = setup.bases[5] + 1  # DeleteRecords inside segment 5: 0-4 go locally, untiered 3-4 too
    delete_records(setup.logs, T, 0, point)
    setup.release_hw()
    setup.run()
    assert setup.row()["gaps"] == [] and setup.row()["delete_records_offset"] == point


def test_retention_past_the_delete_records_point_is_a_gap_from_the_point(setup: Setup) -> None:
    setup.hold_hw(setup.bases[3])
    setup.run()
    point = setup.bases[4] + 1
    delete_records(setup.logs, T, 0, point)
    setup.run()  # sees the point (segment 4 is not yet eligible)
    _unlink_segments(setup.part, setup.bases[4:6])  # the broker's retention, before any copy
    setup.release_hw()
    setup.run()
    row = setup.row()
    assert row["delete_records_offset"] == point
    assert [(g["first_offset"], g["last_offset"]) for g in row["gaps"]] == [(point, setup.bases[6] - 1)]  # type: ignore[attr-defined]


def test_before_anything_is_tiered_nothing_is_a_gap(setup: Setup) -> None:
    _unlink_segments(setup.part, setup.bases[:2])  # deleted before rlm ever tiered this incarnation
    setup.run()
    row = setup.row()
    assert row["gaps"] == [] and row["highest_tiered_offset"] >= setup.bases[2]  # type: ignore[operator]
    assert setup.metric() in (None, 0.0)


def test_a_gap_goes_once_remote_retention_passes_it(setup: Setup) -> None:
    _, last = tier_three_then_lose_two(setup)
    assert setup.row()["gaps"]
    # Remote retention by size keeps about the newest two segments: everything below the gap goes.
    setup.settings = settings_for(
        [setup.logs], options={"root": str(setup.store)}, eligibility="high-watermark", retention_bytes=16_000
    )
    setup.manager = setup.new_manager()
    setup.run()
    row = setup.row()
    assert row["remote_log_start_offset"] > last  # type: ignore[operator]
    assert row["gaps"] == [] and setup.metric() == 0.0


def test_the_cli_names_the_gap(setup: Setup, tmp_path: Path) -> None:
    first, last = tier_three_then_lose_two(setup)
    config = write_config(
        tmp_path / "rlm.toml", [setup.logs], store=setup.store, eligibility="high-watermark"
    )

    def cli(*args: str | Path | int) -> subprocess.CompletedProcess[str]:
        return rlm_cli(*args, "--config", config)

    status = cli("status")
    assert status.returncode == 0, status.stderr
    assert [(g["first_offset"], g["last_offset"]) for g in json.loads(status.stdout)[0]["gaps"]] == [
        (first, last)
    ]
    found = cli("lookup", "--topic", T, "--partition", 0, "--offset", first + 1)
    doc = json.loads(found.stdout)
    assert found.returncode == 0 and doc["found"] is False
    assert (doc["gap"]["first_offset"], doc["gap"]["last_offset"]) == (first, last)
    fetched = cli("fetch", "--topic", T, "--partition", 0, "--offset", first)
    assert (
        fetched.returncode == 2 and f"offsets {first}-{last} are not available in any tier" in fetched.stderr
    )
