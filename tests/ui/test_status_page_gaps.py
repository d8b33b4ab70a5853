"""The status page draws a recorded gap (docs/visibility.md, "Gaps") as a red range where it lies —
here between two remote ranges, where the page's own local/remote arithmetic sees no hole — and
names it as the row's problem. Real headless Chromium, real uvicorn socket, LogWriter partitions."""

from __future__ import annotations

import json
from pathlib import Path

from tests.ui.chromium import Chromium
from tests.ui.fixture import TOKEN, fill, serve, writer
from tests.ui.test_status_page import ROWS_JS, browser  # noqa: F401  (the Chromium fixture)


def test_a_recorded_gap_is_drawn_and_named(browser: Chromium, tmp_path: Path) -> None:  # noqa: F811
    served = serve(tmp_path)
    try:
        w = writer(served, "lost", 0)
        fill(w, 8)
        b = w.segment_base_offsets
        w.high_watermark = b[3]
        w.write_checkpoints()
        served.tier()  # segments 0-2 tiered
        for base in b[:5]:  # local retention: 0-2 were tiered, 3-4 never were
            for suffix in (".log", ".index", ".timeindex"):
                (served.logs / "lost-0" / f"{base:020d}{suffix}").unlink()
        w.high_watermark = w.log_end_offset
        w.write_checkpoints()
        served.tier()  # the gap is recorded, the copy goes on above it
        assert [(g["first_offset"], g["last_offset"]) for g in served.status("lost", 0)["gaps"]] == [
            (b[3], b[5] - 1)
        ]
        page = browser.open()
        page.navigate(f"{served.server.url}/?token={TOKEN}&refresh=1")
        page.wait_for("document.body.dataset.state === 'ready'", what="the first refresh")
        [row] = json.loads(page.evaluate(ROWS_JS))
        assert row["ranges"] == [
            ["remote-only", 0, b[3]],
            ["gap", b[3], b[5]],
            ["both", b[5], w.log_end_offset],
        ]
        assert row["state"] == "error"
        assert f"{b[3]:,} – {b[5] - 1:,}".replace(",", "") in row["error"].replace(",", "").replace(
            "\u202f", ""
        )
        shown = page.evaluate("document.querySelector('.partition').dataset.gaps")
        assert shown == f"{b[3]}-{b[5] - 1}"
    finally:
        served.close()
