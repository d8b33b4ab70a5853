"""Every segment and KRaft snapshot written by real brokers parses exactly as expected.json says."""

from __future__ import annotations

import itertools
import mmap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rlm.formats.records import (
    ControlRecordType,
    RecordBatch,
    decode_records,
    iter_batches,
    parse_control_record,
    valid_bytes,
)
from tests.conftest import locate_fixtures

_FIXTURES = locate_fixtures()


def _segment_ids() -> list[Any]:
    """(source, partition, index) per .log / .checkpoint; one skipping param when fixtures are absent."""
    if _FIXTURES is None:
        return [pytest.param(None, id="no-fixtures")]  # its fixtures_dir skips, or fails in CI
    import json

    expected = json.loads((_FIXTURES / "expected.json").read_text())
    ids = []
    for source, parts in sorted(expected.items()):
        for part, segments in sorted(parts.items()):
            for i, seg in enumerate(segments):
                name = seg["file"] if part == "_kraft_snapshots" else f"{part}/{seg['file']}"
                ids.append(pytest.param((source, part, i), id=f"{source.split('__')[0]}/{name}"))
    return ids


SEGMENTS = _segment_ids()


def _load(
    fixtures_dir: Path, expected: dict[str, Any], key: tuple[str, str, int]
) -> tuple[Path, dict[str, Any]]:
    source, part, i = key
    seg = expected[source][part][i]
    rel = seg["file"] if part == "_kraft_snapshots" else f"{part}/{seg['file']}"
    return fixtures_dir / "kafka-logs" / source / rel, seg


def _scan(path: Path) -> tuple[bytes, list[RecordBatch]]:
    data = path.read_bytes()
    return data, list(iter_batches(data, verify_crc=True))


def test_fixture_inventory_is_complete(fixtures_dir: Path, expected: dict[str, Any]) -> None:
    # Guards against a parametrization that silently covers fewer files than exist on disk.
    on_disk = {p for p in (fixtures_dir / "kafka-logs").rglob("*") if p.suffix in (".log", ".checkpoint")}
    on_disk = {p for p in on_disk if p.name[0].isdigit()}  # bootstrap.checkpoint etc. are not logs
    listed = {_load(fixtures_dir, expected, s.values[0])[0] for s in SEGMENTS}
    assert listed == on_disk
    assert len(listed) == 21


@pytest.mark.parametrize("key", SEGMENTS)
def test_segment_matches_expected(
    fixtures_dir: Path, expected: dict[str, Any], key: tuple[str, str, int]
) -> None:
    path, seg = _load(fixtures_dir, expected, key)
    data, batches = _scan(path)
    assert len(data) == seg["bytes"]
    assert all(b.crc_valid for b in batches) is seg["crc_all_ok"] is True
    assert valid_bytes(data) == len(data)  # no torn tails in cleanly shut down logs
    assert len(batches) == seg["batches"]
    records = [decode_records(data, b) for b in batches]
    assert sum(len(r) for r in records) == seg["records"]
    assert sum(b.record_count for b in batches) == seg["records"]
    assert batches[0].base_offset == seg["first_offset"]
    assert batches[-1].last_offset == seg["last_offset"]
    assert sum(b.is_control for b in batches) == seg["control_batches"]
    # batches tile the file
    assert [b.position for b in batches[1:]] == [b.end_position for b in batches[:-1]]
    assert batches[-1].end_position == len(data)
    # records sit inside their batch's offset range, strictly increasing
    offsets = [r.offset for rs in records for r in rs]
    assert offsets == sorted(set(offsets))
    for b, rs in zip(batches, records, strict=True):
        assert all(b.base_offset <= r.offset <= b.last_offset for r in rs)
    if "magics" not in seg:  # KRaft snapshot entries carry fewer facts
        return
    assert sorted({b.magic for b in batches}) == seg["magics"]
    assert Counter(b.compression.label for b in batches) == Counter(seg["codec_counts"])
    assert sorted({b.timestamp_type.label for b in batches}) == sorted(seg["ts_types"])
    assert min(b.base_timestamp for b in batches) == seg["min_ts"]  # batch ts range is base..max
    assert max(b.max_timestamp for b in batches) == seg["max_ts"]
    assert min(r.timestamp for rs in records for r in rs) == seg["min_record_ts"]
    assert sum(b.is_transactional for b in batches) == seg["transactional_batches"]
    assert sorted({b.partition_leader_epoch for b in batches}) == sorted(seg["ples"])
    gaps = sum(1 for a, b in itertools.pairwise(batches) if b.base_offset != a.next_offset)
    assert gaps == seg["offset_gaps_between_batches"]
    for which, batch in (("first_batch", batches[0]), ("last_batch", batches[-1])):
        exp = seg[which]
        got = {
            "pos": batch.position,
            "size": batch.size,
            "base_offset": batch.base_offset,
            "last_offset": batch.last_offset,
            "count": batch.record_count,
            "crc": batch.crc,
            "base_ts": batch.base_timestamp,
            "max_ts": batch.max_timestamp,
            "producer_id": batch.producer_id,
            "codec": batch.compression.label,
            "magic": batch.magic,
        }
        assert got == {k: exp[k] for k in got}, which


def test_snapshot_control_records(fixtures_dir: Path, expected: dict[str, Any]) -> None:
    snaps = expected["ItumelengMogase__Real-Time-Data-Pipeline-for-Patient-Admissions"]["_kraft_snapshots"]
    root = fixtures_dir / "kafka-logs" / "ItumelengMogase__Real-Time-Data-Pipeline-for-Patient-Admissions"
    for snap in snaps:
        data, batches = _scan(root / snap["file"])
        kinds = [
            parse_control_record(r).type for b in batches if b.is_control for r in decode_records(data, b)
        ]
        assert kinds == [ControlRecordType.SNAPSHOT_HEADER, ControlRecordType.SNAPSHOT_FOOTER], snap["file"]
        assert [b.is_control for b in batches] == [True, False, True]


def _arthur(fixtures_dir: Path, rel: str) -> Path:
    return fixtures_dir / "kafka-logs" / "ArthurArutunyan04__Backend_labs" / rel


def test_compacted_consumer_offsets_sparse_offsets(fixtures_dir: Path) -> None:
    data, batches = _scan(_arthur(fixtures_dir, "__consumer_offsets-19/00000000000000000000.log"))
    by_pos = {b.position: b for b in batches}
    b551 = by_pos[551]
    assert (b551.base_offset, b551.last_offset, b551.record_count) == (258466, 258515, 3)
    assert [r.offset for r in decode_records(data, b551)] == [258480, 258496, 258515]
    assert [r.offset for r in decode_records(data, by_pos[867])] == [258519, 258522, 258526]
    assert [r.offset for r in decode_records(data, by_pos[0])] == [186795]


def test_ksql_command_topic_transaction_commit(fixtures_dir: Path) -> None:
    path = (
        fixtures_dir
        / "kafka-logs/ItumelengMogase__Real-Time-Data-Pipeline-for-Patient-Admissions"
        / "_confluent-ksql-default__command_topic-0/00000000000000000000.log"
    )
    data, (txn, ctrl) = _scan(path)
    assert (txn.position, txn.size, txn.attributes, txn.crc) == (0, 7525, 0x0010, 0x3BBD50DA)
    assert (txn.producer_id, txn.producer_epoch, txn.base_sequence) == (0, 0, 0)
    assert txn.is_transactional and not txn.is_control
    assert (ctrl.position, ctrl.size, ctrl.attributes, ctrl.crc) == (7525, 78, 0x0030, 0xBD392A76)
    assert ctrl.base_sequence == -1 and ctrl.is_control and ctrl.is_transactional
    (marker,) = decode_records(data, ctrl)
    assert marker.key == bytes.fromhex("00000001")
    parsed = parse_control_record(marker)
    assert (parsed.version, parsed.type, parsed.type_name) == (0, 1, "COMMIT")


@pytest.mark.parametrize(
    ("segment", "leader_changes"), [("00000000000000000000.log", 5), ("00000000000000005151.log", 3)]
)
def test_kraft_leader_change_records(fixtures_dir: Path, segment: str, leader_changes: int) -> None:
    path = _arthur(fixtures_dir, f"__cluster_metadata-0/{segment}")
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        types = Counter(
            parse_control_record(r).type
            for b in iter_batches(m)
            if b.is_control
            for r in decode_records(m, b)
        )
    assert types == {ControlRecordType.LEADER_CHANGE: leader_changes}


def test_oms_order_created_worked_answers(fixtures_dir: Path) -> None:
    _, batches = _scan(_arthur(fixtures_dir, "oms_order_created-1/00000000000000081908.log"))
    assert Counter(b.partition_leader_epoch for b in batches) == {10: 906, 12: 284, 14: 63}
    by_pos = {b.position: b for b in batches}
    assert (by_pos[1544137].base_offset, by_pos[1544137].last_offset) == (88232, 88244)
    assert by_pos[0].crc == 0x98D0D8CA
