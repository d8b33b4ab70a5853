"""A killed export's hidden staging dir is removed by the next export to the same ``out``; a live
export's is not (its driver holds the staging dir's lock)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from rlm.jobs.staging import StagedDir, sweep_stale

_BEGIN = """
import sys, time
from pathlib import Path
from rlm.jobs.staging import StagedDir
staged = StagedDir.begin(Path(sys.argv[1]), False)
(staged.staging / "part-0.parquet").write_bytes(b"half")
print(staged.staging, flush=True)
time.sleep(600)
"""


def _exporter(out: Path) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen([sys.executable, "-c", _BEGIN, str(out)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def test_a_killed_exports_staging_dir_is_swept_a_live_ones_is_not(tmp_path: Path) -> None:
    out = tmp_path / "out"
    killed, killed_dir = _exporter(out)
    live, live_dir = _exporter(out)
    try:
        killed.kill()
        killed.wait(30)
        assert killed_dir.is_dir() and live_dir.is_dir()
        staged = StagedDir.begin(out, False)  # the next export to the same out
        assert not killed_dir.exists() and not Path(f"{killed_dir}.lock").exists()
        assert live_dir.is_dir() and (live_dir / "part-0.parquet").read_bytes() == b"half"
        (staged.staging / "_SUCCESS").write_bytes(b"")
        staged.commit()
        assert sorted(p.name for p in out.iterdir()) == ["_SUCCESS"]
        assert not Path(f"{staged.staging}.lock").exists()
    finally:
        for proc in (killed, live):
            proc.kill()
            proc.wait(30)
            assert proc.stdout is not None
            proc.stdout.close()  # the pipe the staging path was read from
    time.sleep(0.05)
    assert sweep_stale(out) == [live_dir]  # its driver is gone now
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
