"""``rlm verify`` names a local range the cleaner rewrote after tiering (docs/topic-policy.md):
a warning when the topic is archived with archive_compacted, an error when it is not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlm.config import load_settings
from rlm.jobs import verify
from rlm.testing.configs import write_config
from rlm.tiering.manager import RemoteLogManager
from tests.tiering.test_compaction import TOPIC, _compact, _setup

pytestmark = pytest.mark.spark


def test_verify_names_the_compaction(spark: Any, tmp_path: Path) -> None:
    logs, cfg, backend = _setup(tmp_path, overrides={"st*": {"archive_compacted": True}})
    assert RemoteLogManager(load_settings(cfg), backend).run_once()[0].error is None
    clean = verify(spark, load_settings(cfg))
    assert clean.ok and [p for p in clean.problems if p.check == "compacted"] == []

    base, _ = _compact(logs / f"{TOPIC}-0", 3)
    archived = verify(spark, load_settings(cfg))
    found = [p for p in archived.problems if p.check == "compacted"]
    assert archived.ok and [(p.severity, p.base_offset) for p in found] == [("warning", base)]
    assert "rewritten by compaction after tiering" in found[0].message

    plain = write_config(tmp_path / "plain.toml", [logs], root=tmp_path / "store", eligibility="rolled")
    report = verify(spark, load_settings(plain))
    found = [p for p in report.errors if p.check == "compacted"]
    assert not report.ok and [p.base_offset for p in found] == [base]
    assert "local and remote answers for these offsets differ" in found[0].message
