"""Jobs over protected segments: the local export engine (thread and process workers, which open
each task's entries with the key files named in the BackendSpec, docs/protection.md) exports
exactly the records, and a store with a key-prefix spread (docs/key-spread.md) is protected the same."""

from __future__ import annotations

import base64
import pickle
from pathlib import Path

import pytest

from rlm.config import settings_from_mapping
from rlm.jobs import export_local
from rlm.jobs.reading.plan import BackendSpec, plan_read
from rlm.storage.registry import create_backend, open_backend
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read.readers import TieredReaders
from tests.jobs.helpers import read_export
from tests.lookup.helpers import delete_local_segments
from tests.protection.helpers import TOPIC, key_file, plaintext_found, settings, stored_objects, write_secrets


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_export_reads_protected_segments(tmp_path: Path, pool: str) -> None:
    logs = tmp_path / "logs"
    brute = write_secrets(logs)
    s = settings(tmp_path, logs, keys={"k1": key_file(tmp_path / "keys", "k1")}, active="k1")
    results = RemoteLogManager(s, open_backend("local", s.remote.options)).run_once()
    assert all(r.error is None for r in results)
    delete_local_segments(logs / f"{TOPIC}-0")
    plan = plan_read(s, [TOPIC], target_bytes=8 * 1024)
    remote = [t for t in plan.tasks if t.source == "remote"]
    assert len(remote) > 5 and all(t.sealed is not None for t in remote)
    # a task carries the wrapped key only: never the master key (nor any data key in the clear)
    master = base64.b64decode(s.remote.encryption.key_files["k1"].read_text())
    shipped = pickle.dumps(remote) + pickle.dumps(BackendSpec.from_settings(s))
    assert master not in shipped and base64.b64encode(master) not in shipped
    result = export_local(s, [TOPIC], tmp_path / "out", target_bytes=8 * 1024, parallelism=2, pool=pool)  # type: ignore[arg-type]
    table = read_export(tmp_path / "out")
    got = sorted(zip(table.column("offset").to_pylist(), table.column("value").to_pylist(), strict=True))
    want = [(r.offset, r.value) for r in brute.records]
    assert result.records == len(want) and got == want


def test_protection_on_a_spread_store(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    brute = write_secrets(logs, batches=60)
    base = settings(tmp_path, logs, keys={"k1": key_file(tmp_path / "keys", "k1")}, active="k1")
    files = {k: str(v) for k, v in base.remote.encryption.key_files.items()}
    raw = {
        "log": {"dirs": [str(logs)], "eligibility": "rolled"},
        "remote": {
            "backend": "local",
            "options": dict(base.remote.options),
            "prefix_spread": 2,
            "compression": {"codec": "zstd"},
            "encryption": {"key_files": files, "active_key": "k1"},
        },
        "tiering": {"gc_grace_ms": 0, "state_dir": str(tmp_path / "state"), "index_entry_bytes": 3_000},
    }
    s = settings_from_mapping(raw)
    backend = open_backend("local", s.remote.options, 2)
    assert all(r.error is None for r in RemoteLogManager(s, backend).run_once())
    raw_store = create_backend("local", s.remote.options)  # the stored (hashed) keys
    objects = stored_objects(raw_store)
    assert any(k[:3].endswith("/") and len(k.split("/")[0]) == 2 for k in objects)
    assert plaintext_found(objects, brute) == []
    delete_local_segments(logs / f"{TOPIC}-0")
    reader = TieredReaders(s, backend).reader(TOPIC, 0)
    got = reader.fetch(0, 1 << 20)
    assert got.tier == "remote" and bytes(got.data) == b"".join(
        b.data for b in brute.batches[: len(got.batches)]
    )
