"""read_committed over protected segments (docs/transactions.md, docs/protection.md): the stored
``.txnindex`` objects are encrypted, and segments whose transactions are still open are scanned
through their opened entries — in-process fetches and the job planner's tasks match the
kafka-python oracle, and no transaction index is stored readable."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rlm.config import settings_from_mapping
from rlm.errors import CorruptIndexError
from rlm.formats.indexes.txn_index import parse_txn_index
from rlm.storage.local import LocalBackend
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read.partition_txns import PartitionTxns
from rlm.tiering.read.txn_sources import plan_sources
from rlm.tiering.store.manifest import SegmentManifest
from rlm.tiering.store.remote_state import RemoteState
from rlm.tiering.store.store_protection import StoreProtection
from tests.lookup.helpers import delete_local_segments
from tests.protection.helpers import key_file
from tests.tiering.txn_helpers import Oracle, read_committed_in_process, read_committed_planned, write_txn_log


def test_read_committed_over_protected_segments(tmp_path: Path) -> None:
    logs, store = tmp_path / "logs", tmp_path / "store"
    write_txn_log(logs, "txn", 0, seed=5, leave_open=True)
    oracle = Oracle.of(logs / "txn-0")
    key = key_file(tmp_path / "keys", "k1")
    s = settings_from_mapping(
        {
            "log": {"dirs": [str(logs)], "eligibility": "rolled"},
            "remote": {
                "backend": "local",
                "options": {"root": str(store)},
                "compression": {"codec": "zstd"},
                "encryption": {"key_files": {"k1": str(key)}, "active_key": "k1"},
            },
            "tiering": {"gc_grace_ms": 0, "state_dir": str(tmp_path / "state"), "index_entry_bytes": 2_000},
        }
    )
    manager = RemoteLogManager(s, LocalBackend(root=str(store)))
    assert all(r.error is None for r in manager.run_once())
    delete_local_segments(logs / "txn-0", keep_last=3)

    indexes = sorted(store.rglob("segment.txnindex"))
    assert indexes
    for path in indexes:  # encrypted: not Kafka's 34-byte entries any more
        data = path.read_bytes()
        assert data[:4] == b"\xff\xff\xff\xff" and (len(data) - 28) % 34 == 0
        with pytest.raises(CorruptIndexError):
            parse_txn_index(data)

    got, offset = read_committed_in_process(s, store)
    assert got == [(r.offset, r.key, r.value) for r in oracle.committed]
    assert offset == oracle.last_stable_offset

    assert read_committed_planned(s) == [(r.offset, r.key, r.value) for r in oracle.committed]


def test_control_batch_scans_of_protected_segments_match_plaintext(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no local source and no recorded open transactions (segments tiered before copies
    recorded ``open_at_end``), the last stable offset replays every tiered segment's batches: a
    protected segment is read whole and opened entry by entry (``StoreProtection.open_log``); the
    answers equal those of the same log tiered as plaintext, and of the recorded state (no scan)."""
    answers = []
    scans: list[str] = []
    real_open_log = StoreProtection.open_log

    def spy(self: StoreProtection, b: Any, m: SegmentManifest, data: bytes) -> bytes:
        scans.append(m.log.key)
        return real_open_log(self, b, m, data)

    monkeypatch.setattr(StoreProtection, "open_log", spy)
    for protect in (False, True):
        root = tmp_path / ("protected" if protect else "plain")
        logs, store = root / "logs", root / "store"
        write_txn_log(logs, "txn", 0, seed=5, leave_open=True)  # the same bytes twice
        remote: dict[str, object] = {"backend": "local", "options": {"root": str(store)}}
        if protect:
            key = key_file(root / "keys", "k1")
            remote |= {
                "compression": {"codec": "zstd"},
                "encryption": {"key_files": {"k1": str(key)}, "active_key": "k1"},
            }
        s = settings_from_mapping(
            {
                "log": {"dirs": [str(logs)], "eligibility": "rolled"},
                "remote": remote,
                "tiering": {"gc_grace_ms": 0, "state_dir": str(root / "state"), "index_entry_bytes": 2_000},
            }
        )
        backend = LocalBackend(root=str(store))
        assert all(r.error is None for r in RemoteLogManager(s, backend).run_once())
        state = RemoteState(backend, "txn", 0, protection=StoreProtection.from_settings(s.remote))
        links = state.chain().links
        end = links[-1].last_offset + 1
        sources = plan_sources(links, [], end, None)
        recorded = PartitionTxns(sources, backend, state.protection).last_stable_offset(end)
        assert not scans
        sources = [replace(src, open_at_end=None) for src in sources]
        txns = PartitionTxns(sources, backend, state.protection)
        answers.append((txns.last_stable_offset(end), txns.aborted(0, end).entries))
        assert answers[-1][0] == recorded
    assert answers[0] == answers[1] and answers[0][1]
    assert len(set(scans)) > 1 and all("/data/" in k for k in scans)
