"""``rlm verify`` names every recorded gap (docs/visibility.md, "Gaps") as an error with its range,
instead of the "normal after compaction" warning the same hole in the store got before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlm.jobs import verify
from tests.tiering.test_gaps import Setup, tier_three_then_lose_two

pytestmark = pytest.mark.spark


def test_verify_reports_a_recorded_gap_as_an_error(spark: Any, tmp_path: Path) -> None:
    setup = Setup(tmp_path, [1_000_000])
    first, last = tier_three_then_lose_two(setup)
    report = verify(spark, setup.settings)
    gaps = [p for p in report.problems if p.check == "gap"]
    assert [(p.severity, p.offset) for p in gaps] == [("error", first)], [p.line() for p in gaps]
    assert f"offsets {first}-{last} are not available in any tier" in gaps[0].message
    assert not report.ok
