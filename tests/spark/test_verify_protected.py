"""``rlm verify --deep`` on Spark over a protected store (docs/protection.md): clean when every
key is there, one ``protection`` problem naming object and key id for a missing key, and the
tampered entry / object named when bytes were changed; the read job (``read_tiered``) returns the
records of encrypted segments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlm.jobs import read_tiered, verify
from rlm.logdir.discovery import list_segments
from rlm.storage.local import LocalBackend
from rlm.tiering.manager import RemoteLogManager
from tests.lookup.helpers import delete_local_segments
from tests.protection.helpers import TOPIC, key_file, settings, write_secrets

pytestmark = pytest.mark.spark


def test_verify_deep_and_read_over_a_protected_store(spark: Any, tmp_path: Path) -> None:
    logs, store = tmp_path / "logs", tmp_path / "store"
    brute = write_secrets(logs, batches=60)
    keys = {"k1": key_file(tmp_path / "keys", "k1"), "k2": key_file(tmp_path / "keys", "k2")}
    good = settings(tmp_path, logs, keys={"k1": keys["k1"]}, active="k1")
    assert all(r.error is None for r in RemoteLogManager(good, LocalBackend(root=str(store))).run_once())
    delete_local_segments(logs / f"{TOPIC}-0")

    rows = read_tiered(spark, good, [TOPIC]).select("offset", "value").collect()
    got = sorted((r["offset"], bytes(r["value"])) for r in rows)
    assert got == [(r.offset, r.value) for r in brute.records]

    report = verify(spark, good, deep=True)
    assert report.ok, [p.line() for p in report.errors]
    local_start = list_segments(logs / f"{TOPIC}-0")[0].base_offset  # the active segment's stay local
    assert report.batches_checked == sum(1 for b in brute.batches if b.batch.base_offset < local_start)

    missing = verify(spark, settings(tmp_path, logs, keys={"k2": keys["k2"]}, active="k2"), deep=True)
    # without k1 no manifest's MAC can be checked (docs/protection.md §9): each is one `protection`
    # error naming k1, and the store view verify can trust is empty, so the local index (built
    # by the sidecar that had k1) is reported ahead of it too
    checks = {p.check for p in missing.errors}
    assert not missing.ok and checks <= {"protection", "local_index_ahead"} and "protection" in checks
    assert all("'k1'" in p.line() and p.key for p in missing.errors if p.check == "protection")

    obj = sorted(store.rglob("segment.log"))[0]
    data = bytearray(obj.read_bytes())
    data[123] ^= 0x20
    obj.write_bytes(bytes(data))
    tampered = verify(spark, good, deep=True)
    lines = [p.line() for p in tampered.errors]
    assert any("protection" in line and "authentication" in line and obj.name in line for line in lines), (
        lines
    )
