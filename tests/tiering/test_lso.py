"""The last stable offset when an open transaction began in tiered segments (docs/transactions.md,
"The last stable offset"): read_committed matches the kafka-python oracle whatever the number of
local segments (0..3), with and without Kafka's producer-state snapshots, in process and through
the job planner; a snapshot is trusted where it applies (local beside the first local segment, or
the uploaded one of a remote segment), a damaged one is not, and with snapshots the remote
segments' batches are not read to find the LSO.

Snapshots are crafted with ``struct`` from the layout Kafka documents, their content computed by
replaying the batches as kafka-python decodes them — independent of rlm's parser and replay."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka.record.memory_records import MemoryRecords

from rlm.config import Settings, settings_from_mapping
from rlm.errors import FormatError
from rlm.formats import naming
from rlm.formats.records import RecordSpec, encode_control_key, encode_end_txn_marker
from rlm.kafka import reads
from rlm.logdir.discovery import list_segments
from rlm.logdir.writer import LogWriter
from rlm.storage.local import LocalBackend
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read.readers import TieredReaders
from rlm.tiering.store import object_keys
from rlm.tiering.store.manifest import SegmentManifest
from tests.lookup.helpers import delete_local_segments
from tests.tiering.txn_helpers import (
    COMMIT,
    T0,
    Oracle,
    Row,
    open_at,
    read_committed_in_process,
    read_committed_planned,
    snapshot_bytes,
    write_snapshots,
    write_txn_log,
)

FAKE_PID = 7777  # a producer that never writes: only a snapshot can say it is open
LIE_AT = 17  # where its transaction began: below every true LSO of these logs
LIE_SEGMENT = 4  # the index of the segment whose snapshot carries the lie in the chain tests


class CountingBackend(LocalBackend):
    """The local backend, remembering every ranged read (key, start, end)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.reads: list[tuple[str, int, int | None]] = []

    def _read(self, key: str, start: int, end: int | None) -> bytes:
        self.reads.append((key, start, end))
        return super()._read(key, start, end)

    def whole_log_reads(self) -> list[str]:
        return [
            k for k, start, end in self.reads if k.endswith(object_keys.LOG) and start == 0 and end is None
        ]


@dataclass
class Layout:
    settings: Settings
    store: Path
    part: Path
    oracle: Oracle
    bases: list[int]


def manifests(store: Path) -> list[tuple[Path, dict[str, Any]]]:
    return [
        (p, json.loads(p.read_text()))
        for p in sorted(store.rglob("manifests/*.json"))
        if not p.name.startswith(object_keys.LINEAGE_MARKER_PREFIX)
    ]


def forget_open_at_end(store: Path) -> None:
    """Rewrite the manifests as a copy that did not know the open transactions writes them."""
    for path, doc in manifests(store):
        doc["txn_index"].pop("open_at_end", None)
        path.write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")))


def layout(
    tmp: Path,
    keep: int,
    leave_open: bool,
    *,
    snapshots: bool,
    recorded: bool = True,
    lie: dict[int, dict[int, int]] | None = None,
) -> Layout:
    """A transactional partition tiered, then its local segments deleted but the newest ``keep``
    (``recorded=False``: the manifests without ``open_at_end``)."""
    logs, store = tmp / "logs", tmp / "store"
    write_txn_log(logs, "txn", 0, seed=5, leave_open=leave_open)
    part = logs / "txn-0"
    if snapshots:
        write_snapshots(part, lie)
    bases = [s.base_offset for s in list_segments(part)]
    # With no local segment left the active one is gone too: the log ends where the tiered data does.
    oracle = Oracle.of(part, high_watermark=bases[-1] if keep == 0 else None)
    s = settings_from_mapping(
        {
            "log": {"dirs": [str(logs)], "eligibility": "rolled"},
            "remote": {"backend": "local", "options": {"root": str(store)}},
            "tiering": {"gc_grace_ms": 0, "state_dir": str(tmp / "state"), "index_entry_bytes": 2_000},
        }
    )
    assert all(r.error is None for r in RemoteLogManager(s, LocalBackend(root=str(store))).run_once())
    delete_local_segments(part, keep_last=keep)
    if not recorded:
        forget_open_at_end(store)
    return Layout(s, store, part, oracle, bases)


def read_in_process(lay: Layout, start: int = 0) -> tuple[list[Row], int]:
    return read_committed_in_process(lay.settings, lay.store, start)


def read_planned(lay: Layout) -> list[Row]:
    return read_committed_planned(lay.settings)


def lso(lay: Layout, backend: LocalBackend | None = None) -> int:
    reader = TieredReaders(lay.settings, backend or LocalBackend(root=str(lay.store))).reader("txn", 0)
    found = reader.visibility().last_stable_offset()
    assert found is not None
    return found


# How the state before the replay is known: the copies' recorded open transactions (rlm's LogWriter
# writes no snapshot; the chain starts at offset 0), broker snapshots (and the record), or nothing.
STATES = {
    "recorded": {"snapshots": False, "recorded": True},
    "snapshots": {"snapshots": True, "recorded": False},
    "none": {"snapshots": False, "recorded": False},
}


@pytest.mark.parametrize("state", list(STATES))
@pytest.mark.parametrize("leave_open", [True, False], ids=["open", "settled"])
@pytest.mark.parametrize("keep", [0, 1, 2, 3])
def test_read_committed_matches_the_oracle_in_every_layout(
    tmp_path: Path, keep: int, leave_open: bool, state: str
) -> None:
    lay = layout(tmp_path, keep, leave_open, **STATES[state])
    expected = [(r.offset, r.key, r.value) for r in lay.oracle.committed]
    got, end = read_in_process(lay)
    assert end == lay.oracle.last_stable_offset
    assert got == expected
    assert read_planned(lay) == expected


def test_the_reproduced_layout_has_a_transaction_only_the_tiered_batches_show(tmp_path: Path) -> None:
    """The bug's shape, checked independently: with one local segment, a producer's transaction
    open at the end began in a tiered segment and that producer wrote nothing locally."""
    lay = layout(tmp_path, 1, True, snapshots=False)
    logs = tmp_path / "full"  # the same log again, whole
    write_txn_log(logs, "txn", 0, seed=5, leave_open=True)
    full = logs / "txn-0"
    local_base = lay.bases[-1]
    opened = open_at(full)[local_base]
    local_pids = set()
    records = MemoryRecords((full / naming.segment_file_name(local_base, naming.LOG)).read_bytes())
    while (b := records.next_batch()) is not None:
        local_pids.add(b.producer_id)
    culprit = [pid for pid, first in opened.items() if first == lay.oracle.last_stable_offset]
    assert culprit and not set(culprit) & local_pids


@pytest.mark.parametrize("snapshots", [False, True])
def test_each_copy_records_the_transactions_open_at_its_end(tmp_path: Path, snapshots: bool) -> None:
    """``txn_index.open_at_end`` of every manifest is what kafka-python's replay says is open
    before the next segment; with broker snapshots each copy starts from its own segment's (a
    lying one shows in that copy's record only: the next copy starts from the next snapshot)."""
    lie = {LIE_SEGMENT: {FAKE_PID: LIE_AT}} if snapshots else None
    lay = layout(tmp_path, 1, True, snapshots=snapshots, lie=lie)
    logs = tmp_path / "full"
    write_txn_log(logs, "txn", 0, seed=5, leave_open=True)
    truth = open_at(logs / "txn-0")
    docs = manifests(lay.store)
    assert len(docs) == len(lay.bases) - 1
    for (_, doc), next_base in zip(docs, lay.bases[1:], strict=True):
        expected = dict(truth[next_base])
        if snapshots and next_base == lay.bases[LIE_SEGMENT + 1]:
            expected[FAKE_PID] = LIE_AT  # no marker closes it within the segment
        assert dict(map(tuple, doc["txn_index"]["open_at_end"])) == expected, next_base


def test_a_copy_that_cannot_know_the_state_records_nothing(tmp_path: Path) -> None:
    """No snapshot and the log's first segment gone before tiering: the copies never guess."""
    logs, store = tmp_path / "logs", tmp_path / "store"
    write_txn_log(logs, "txn", 0, seed=5, leave_open=True)
    delete_local_segments(logs / "txn-0", keep_last=len(list_segments(logs / "txn-0")) - 1)
    s = settings_from_mapping(
        {
            "log": {"dirs": [str(logs)], "eligibility": "rolled"},
            "remote": {"backend": "local", "options": {"root": str(store)}},
            "tiering": {"gc_grace_ms": 0, "state_dir": str(tmp_path / "state")},
        }
    )
    assert all(r.error is None for r in RemoteLogManager(s, LocalBackend(root=str(store))).run_once())
    docs = manifests(store)
    assert docs and all("open_at_end" not in doc["txn_index"] for _, doc in docs)


@pytest.mark.parametrize("keep", [1, 2])
def test_the_recorded_state_spares_the_remote_batches(tmp_path: Path, keep: int) -> None:
    lay = layout(tmp_path, keep, True, snapshots=False)
    counting = CountingBackend(root=str(lay.store))
    assert lso(lay, counting) == lay.oracle.last_stable_offset
    assert counting.whole_log_reads() == []


@pytest.mark.parametrize("keep", [1, 2])
def test_a_local_snapshot_is_trusted_and_spares_the_remote_batches(tmp_path: Path, keep: int) -> None:
    probe = layout(tmp_path / "probe", keep, True, snapshots=False, recorded=False)
    lay = layout(
        tmp_path / "lie", keep, True, snapshots=True, recorded=False, lie={-keep: {FAKE_PID: LIE_AT}}
    )
    counting = CountingBackend(root=str(lay.store))
    assert lso(lay, counting) == LIE_AT
    assert counting.whole_log_reads() == []  # no remote segment replayed
    honest = layout(tmp_path / "honest", keep, True, snapshots=True, recorded=False)
    counting = CountingBackend(root=str(honest.store))
    assert lso(honest, counting) == honest.oracle.last_stable_offset
    assert counting.whole_log_reads() == []
    # Without snapshots or records the same answer needs every remote segment's batches.
    counting = CountingBackend(root=str(probe.store))
    assert lso(probe, counting) == probe.oracle.last_stable_offset
    assert len(counting.whole_log_reads()) == len(probe.bases) - keep


@pytest.mark.parametrize("keep", [0, 1])
def test_the_uploaded_snapshot_of_a_remote_segment_is_used_when_no_local_one_applies(
    tmp_path: Path, keep: int
) -> None:
    # -2: the newest tiered segment, below the first local one (keep 1) or the last (keep 0).
    lay = layout(tmp_path, keep, True, snapshots=True, recorded=False, lie={-2: {FAKE_PID: LIE_AT}})
    if keep:  # the first local segment's own snapshot would answer first
        (lay.part / naming.segment_file_name(lay.bases[-keep], naming.SNAPSHOT)).unlink()
    counting = CountingBackend(root=str(lay.store))
    assert lso(lay, counting) == LIE_AT
    assert len(counting.whole_log_reads()) == 1  # only the segment the snapshot describes
    got, end = read_in_process(lay)
    assert end <= LIE_AT and all(offset < LIE_AT for offset, _, _ in got)
    assert all(offset < LIE_AT for offset, _, _ in read_planned(lay))


def test_a_damaged_snapshot_is_not_trusted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lay = layout(tmp_path, 2, True, snapshots=True, recorded=False)
    local = lay.part / naming.segment_file_name(lay.bases[-2], naming.SNAPSHOT)
    data = bytearray(snapshot_bytes({FAKE_PID: 3}))
    data[-1] ^= 0xFF  # the CRC no longer matches: its claim must not lower the LSO
    local.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="rlm.tiering.store.producer_state"):
        got, end = read_in_process(lay)
    assert end == lay.oracle.last_stable_offset
    assert got == [(r.offset, r.key, r.value) for r in lay.oracle.committed]
    assert any(str(local) in m and "crc" in m for m in caplog.messages)


def test_a_damaged_snapshot_is_not_recorded_by_the_copy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    logs = tmp_path / "logs"
    write_txn_log(logs, "txn", 0, seed=5, leave_open=True)
    part = logs / "txn-0"
    truth = write_snapshots(part)
    bases = sorted(truth)
    target = part / naming.segment_file_name(bases[LIE_SEGMENT], naming.SNAPSHOT)
    data = bytearray(snapshot_bytes({**truth[bases[LIE_SEGMENT]], FAKE_PID: LIE_AT}))
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))
    s = settings_from_mapping(
        {
            "log": {"dirs": [str(logs)], "eligibility": "rolled"},
            "remote": {"backend": "local", "options": {"root": str(tmp_path / "store")}},
            "tiering": {"gc_grace_ms": 0, "state_dir": str(tmp_path / "state")},
        }
    )
    with caplog.at_level(logging.WARNING, logger="rlm.tiering.copy.txn_capture"):
        results = RemoteLogManager(s, LocalBackend(root=str(tmp_path / "store"))).run_once()
    assert all(r.error is None for r in results)
    assert any("producer snapshot unusable" in m for m in caplog.messages)
    for (_, doc), next_base in zip(manifests(tmp_path / "store"), bases[1:], strict=True):
        assert dict(map(tuple, doc["txn_index"]["open_at_end"])) == truth[next_base]


def test_without_any_known_state_the_full_replay_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lay = layout(tmp_path, 1, True, snapshots=False, recorded=False)
    with caplog.at_level(logging.INFO, logger="rlm.tiering.read.partition_txns"):
        assert lso(lay) == lay.oracle.last_stable_offset
    assert any(
        "no producer snapshot" in m and f"{len(lay.bases) - 1} tiered segment" in m for m in caplog.messages
    )


@pytest.mark.parametrize("bad", [{"1001": 5}, [[1001]], [[1001, -1]], [[1001, 5.0]], [[True, 5]], "x"])
def test_a_malformed_open_at_end_is_a_format_error_naming_the_field(tmp_path: Path, bad: Any) -> None:
    lay = layout(tmp_path, 2, True, snapshots=False)
    path, doc = manifests(lay.store)[0]
    assert SegmentManifest.from_json(path.read_bytes()).txn_index is not None
    doc["txn_index"]["open_at_end"] = bad
    with pytest.raises(FormatError, match=r"m\.json: manifest field txn_index\.open_at_end"):
        SegmentManifest.from_json(json.dumps(doc).encode(), key="m.json")


def test_the_last_stable_offset_is_never_below_the_log_start(tmp_path: Path) -> None:
    """Kafka's last stable offset is ``max(first unstable offset, log start offset)``. Seen beside
    a live broker (#29): retention deleted the segment where a transaction still open began; the
    broker answered its log start, rlm the transaction's first offset — below every offset either
    serves. Here the segments before the last are deleted untiered (nothing in the store) while a
    transaction that began in them is open, as Kafka's snapshot beside the last segment says."""
    logs = tmp_path / "logs"
    write_txn_log(logs, "txn", 0, seed=5, leave_open=True)
    part = logs / "txn-0"
    bases = [s.base_offset for s in list_segments(part)]
    opened = write_snapshots(part)[bases[-1]]
    assert opened and min(opened.values()) < bases[-1]  # the layout this test is about
    delete_local_segments(part, keep_last=1)
    s = settings_from_mapping(
        {
            "log": {"dirs": [str(logs)]},
            "remote": {"backend": "local", "options": {"root": str(tmp_path / "store")}},
            "tiering": {"state_dir": str(tmp_path / "state")},
        }
    )
    reader = TieredReaders(s, LocalBackend(root=str(tmp_path / "store"))).reader("txn", 0)
    ranges = reader.offsets()
    assert ranges.log_start_offset == bases[-1] and ranges.visible_end_offset is not None
    assert ranges.visible_end_offset > bases[-1]  # the checkpointed high watermark
    assert reader.visibility().last_stable_offset() == bases[-1]


def test_latest_tiered_under_read_committed_is_never_below_the_remote_start(tmp_path: Path) -> None:
    """ListOffsets -5 through the Kafka listener answers ``min(highest tiered, bound - 1)``; under
    read_committed the bound is the last stable offset, which can be the log start (a transaction
    still open whose first records were deleted, above). Seen beside a live broker (#29): -5 then
    answered ``log start - 1``, an offset below everything rlm serves; nothing visible is tiered,
    so it is -1, as the HTTP lookup of -5 answers (docs/visibility.md)."""
    lay = layout(tmp_path, 1, True, snapshots=False)
    first_open = lay.oracle.last_stable_offset  # the open transaction began in a tiered segment
    assert first_open < lay.bases[-1]
    state = tmp_path / "state" / "txn-0" / "progress.json"
    doc = json.loads(state.read_text())
    doc["delete_records_offset"] = first_open + 1  # DeleteRecords above it, seen by a pass
    state.write_text(json.dumps(doc))
    readers = TieredReaders(lay.settings, LocalBackend(root=str(lay.store)))
    ranges = readers.reader("txn", 0).offsets()
    assert ranges.remote_log_start_offset == first_open + 1
    committed = reads.list_offset(readers, "txn", 0, -5, True, 9)
    assert (committed.error, committed.offset) == (0, -1)
    latest = reads.list_offset(readers, "txn", 0, -1, True, 9)
    assert latest.offset == first_open + 1  # the last stable offset: the log start
    uncommitted = reads.list_offset(readers, "txn", 0, -5, False, 9)
    assert uncommitted.offset == ranges.highest_tiered_offset


def test_earliest_local_ignores_the_isolation_level(tmp_path: Path) -> None:
    """ListOffsets -2 and -4 answer the log start and the local log start whatever the isolation
    level, as Kafka's do (only -1 and timestamps are bounded by the last stable offset). Seen
    beside a live broker (#29): with a transaction open since a tiered offset, -4 under
    read_committed answered that transaction's first offset, the broker its local log start."""
    lay = layout(tmp_path, 1, True, snapshots=False)
    first_open = lay.oracle.last_stable_offset
    assert first_open < lay.bases[-1]  # open since an offset below the local log
    readers = TieredReaders(lay.settings, LocalBackend(root=str(lay.store)))
    for committed in (False, True):
        assert reads.list_offset(readers, "txn", 0, -4, committed, 9).offset == lay.bases[-1]
        assert reads.list_offset(readers, "txn", 0, -2, committed, 9).offset == 0
    assert reads.list_offset(readers, "txn", 0, -1, True, 9).offset == first_open


def test_what_a_copy_recorded_open_before_a_gap_is_not_taken_as_open_after_it(tmp_path: Path) -> None:
    """A transaction open at the end of the last tiered segment whose COMMIT lies in a gap (the
    broker deleted that segment before rlm tiered it) is closed for the broker. Seen beside a live
    broker under load: rlm seeded the first local segment with the tiered segment's
    ``open_at_end`` across the gap, so its last stable offset stayed at that transaction's first
    offset and a read_committed consumer could never pass it; Kafka's snapshot at the first local
    segment (nothing open) is the state there."""
    logs, store, aside, pid = tmp_path / "logs", tmp_path / "store", tmp_path / "aside", 1001
    part = logs / "txn-0"
    with LogWriter(logs, "txn", 0, clock=lambda: T0) as w:
        # offset 0 (tiered): the transaction opens; offset 1 (the gap): its COMMIT; 2, 3: local
        w.append(
            [RecordSpec(T0, b"k", b"v")],
            producer_id=pid,
            producer_epoch=0,
            base_sequence=0,
            is_transactional=True,
        )
        w.roll()
        commit = RecordSpec(T0, encode_control_key(COMMIT), encode_end_txn_marker(3))
        w.append([commit], producer_id=pid, producer_epoch=0, is_transactional=True, is_control=True)
        after_gap = w.roll()
        w.append([RecordSpec(T0, b"k", b"v")])
        w.roll()
        w.append([RecordSpec(T0, b"k", b"v")])
        end = w.log_end_offset
    write_snapshots(part)  # Kafka's, at every roll
    aside.mkdir()
    later = [f for f in part.iterdir() if f.stem.isdigit() and int(f.stem) >= after_gap]
    for f in later:  # not there yet: the first segment is tiered, the COMMIT's is the active one
        f.rename(aside / f.name)
    s = settings_from_mapping(
        {
            "log": {"dirs": [str(logs)], "eligibility": "rolled"},
            "remote": {"backend": "local", "options": {"root": str(store)}},
            "tiering": {"gc_grace_ms": 0, "state_dir": str(tmp_path / "state")},
        }
    )
    assert all(r.error is None for r in RemoteLogManager(s, LocalBackend(root=str(store))).run_once())
    [(_, doc)] = manifests(store)
    assert doc["txn_index"]["open_at_end"] == [[pid, 0]]
    for f in later:
        (aside / f.name).rename(f)
    delete_local_segments(part, keep_last=2)  # the COMMIT's segment deleted untiered: the gap
    reader = TieredReaders(s, LocalBackend(root=str(store))).reader("txn", 0)
    assert reader.offsets().local_log_start_offset == after_gap
    assert reader.visibility().last_stable_offset() == end
