"""``rlm verify`` reports the broker-file findings tiering acts on (docs/broker-files.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rlm.cli.main import main
from rlm.jobs import verify
from rlm.logdir.discovery import list_segments
from rlm.testing.configs import write_config
from tests.tiering.test_broker_files import TOPIC, _damage_index, _damage_log, _manager, _settings, _write

pytestmark = pytest.mark.spark


def test_verify_reports_local_broken_index_and_quarantine(spark: Any, tmp_path: Path) -> None:
    logs, store = tmp_path / "logs", tmp_path / "store"
    _write(logs, TOPIC, 0, seed=1)
    _write(logs, "other", 0, seed=2)
    segments = list_segments(logs / f"{TOPIC}-0")
    assert segments[1].index is not None
    _damage_index(segments[1].index, 8, "random")
    position, _ = _damage_log(segments[3], "truncated")
    _manager(logs, store).run_once()

    report = verify(spark, _settings(logs, store))
    assert not report.ok
    local = {(p.check, p.key) for p in report.errors if p.check.startswith("local_")}
    assert local == {
        ("local_broken_index", str(segments[1].index)),
        ("local_segment_quarantine", str(segments[3].log)),
    }
    assert all(p.topic == TOPIC for p in report.errors), [p.line() for p in report.errors]

    cfg = write_config(tmp_path / "c.toml", [logs], root=store)
    result = CliRunner().invoke(main, ["verify", "--config", str(cfg)])
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    quarantine = next(p for p in doc["problems"] if p["check"] == "local_segment_quarantine")
    assert (quarantine["key"], quarantine["position"]) == (str(segments[3].log), position)
