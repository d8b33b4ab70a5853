"""``rlm dump`` through a real subprocess: the JSON Lines contract of docs/cli.md and clean failures."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path
from typing import Any

import crc32c
import pytest

from rlm.formats.indexes.remote_index import RemoteDataIdentifier, RemoteLogIndexEntry
from rlm.formats.indexes.txn_index import ABORTED_TXN_SIZE, AbortedTxn, encode_txn_index
from rlm.formats.records import RecordSpec, build_batch
from rlm.testing.daemon import rlm_cli

BATCH_FIELDS = {
    "position",
    "size",
    "base_offset",
    "last_offset",
    "magic",
    "crc",
    "crc_valid",
    "compression",
    "timestamp_type",
    "base_timestamp",
    "max_timestamp",
    "producer_id",
    "producer_epoch",
    "base_sequence",
    "partition_leader_epoch",
    "is_transactional",
    "is_control",
    "record_count",
    "delete_horizon_ms",
}
ARTHUR = "ArthurArutunyan04__Backend_labs"
ITUMELENG = "ItumelengMogase__Real-Time-Data-Pipeline-for-Patient-Admissions"


def rlm_dump(*args: str | Path) -> tuple[int, list[dict[str, Any]], str]:
    proc = rlm_cli("dump", *args)
    docs = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return proc.returncode, docs, proc.stderr


def assert_one_line_error(stderr: str, *needles: str) -> None:
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_every_fixture_log_dumps_with_the_contract_fields(fixtures_dir: Path, expected: dict) -> None:
    logs = sorted((fixtures_dir / "kafka-logs").glob("*/*/*.log"))
    assert logs
    code, docs, stderr = rlm_dump(*logs)
    assert code == 0, stderr
    assert len(docs) == len(logs)
    for path, doc in zip(logs, docs, strict=True):
        assert set(doc) == {"file", "kind", "base_offset", "size", "valid_bytes", "batches"}
        assert doc["kind"] == "log"
        assert doc["size"] == doc["valid_bytes"] == path.stat().st_size
        seg = next(s for s in expected[path.parts[-3]][path.parts[-2]] if s["file"] == path.name)
        assert doc["base_offset"] == seg["base"]
        assert len(doc["batches"]) == seg["batches"]
        assert all(set(b) == BATCH_FIELDS and b["crc_valid"] for b in doc["batches"])
        first = doc["batches"][0]
        assert (first["position"], first["size"], first["crc"]) == (
            seg["first_batch"]["pos"],
            seg["first_batch"]["size"],
            seg["first_batch"]["crc"],
        )
        assert first["compression"] == seg["first_batch"]["codec"]
        assert first["timestamp_type"] in {"CreateTime", "LogAppendTime"}


def test_records_show_base64_keys_and_the_commit_marker(fixtures_dir: Path) -> None:
    log = (
        fixtures_dir
        / "kafka-logs"
        / ITUMELENG
        / "_confluent-ksql-default__command_topic-0"
        / "00000000000000000000.log"
    )
    code, [doc], stderr = rlm_dump("--records", log)
    assert code == 0, stderr
    data, control = doc["batches"]
    assert data["is_transactional"] and not data["is_control"] and data["producer_id"] == 0
    assert control["is_control"] and control["is_transactional"]
    [marker] = control["records"]
    assert set(marker) == {"offset", "timestamp", "key", "value", "headers"}
    assert marker["offset"] == 1
    assert base64.b64decode(marker["key"]) == b"\x00\x00\x00\x01"  # version 0, type 1 = COMMIT


def test_indexes_dump_absolute_offsets(fixtures_dir: Path) -> None:
    part = fixtures_dir / "kafka-logs" / ARTHUR / "oms_order_created-1"
    code, (index, timeindex), stderr = rlm_dump(
        part / "00000000000000081908.index", part / "00000000000000081908.timeindex"
    )
    assert code == 0, stderr
    assert index["kind"] == "offset_index" and index["base_offset"] == 81908
    assert len(index["entries"]) == 581
    assert index["entries"][0] == {"offset": 81939, "position": 4609}
    assert index["entries"][-1] == {"offset": 94635, "position": 3092362}
    assert timeindex["kind"] == "time_index" and len(timeindex["entries"]) == 583
    assert timeindex["entries"][-1] == {"timestamp": 1766802778446, "offset": 94645}


def test_checkpoints_and_kraft_snapshots(fixtures_dir: Path) -> None:
    root = fixtures_dir / "kafka-logs" / ARTHUR
    code, (lec, hw, log_doc), stderr = rlm_dump(
        root / "oms_order_created-1" / "leader-epoch-checkpoint",
        root / "replication-offset-checkpoint",
        fixtures_dir / "kafka-logs" / ARTHUR / "__cluster_metadata-0" / "00000000000000005151.log",
    )
    assert code == 0, stderr
    assert lec["kind"] == "leader_epoch_checkpoint"
    assert [(e["epoch"], e["start_offset"]) for e in lec["entries"]] == [
        (10, 81908),
        (12, 91078),
        (14, 94005),
    ]
    assert hw["kind"] == "offset_checkpoint"
    assert {"topic": "oms_order_created", "partition": 1, "offset": 94646} in hw["entries"]
    assert log_doc["kind"] == "log" and len(log_doc["batches"]) == 1746
    snapshots = sorted((fixtures_dir / "kafka-logs").glob("*/*/*-*.checkpoint"))
    assert len(snapshots) == 3
    code, docs, stderr = rlm_dump(*snapshots)
    assert code == 0, stderr
    assert all(d["kind"] == "snapshot" and len(d["batches"]) == 3 for d in docs)


@pytest.fixture
def segment_copy(fixtures_dir: Path, tmp_path: Path) -> Path:
    src = fixtures_dir / "kafka-logs" / ARTHUR / "oms_order_status_changed-0" / "00000000000000000000.log"
    dst = tmp_path / "00000000000000000000.log"
    shutil.copyfile(src, dst)
    return dst


def test_flipped_byte_names_file_position_and_offset(segment_copy: Path) -> None:
    code, [clean], _ = rlm_dump(segment_copy)
    assert code == 0
    victim = clean["batches"][10]
    data = bytearray(segment_copy.read_bytes())
    data[victim["position"] + 70] ^= 0xFF  # inside the records, covered by the CRC
    segment_copy.write_bytes(bytes(data))
    code, [doc], stderr = rlm_dump(segment_copy)
    assert code == 1
    assert_one_line_error(
        stderr, str(segment_copy), f"byte {victim['position']}", f"offset {victim['base_offset']}", "CRC"
    )
    assert [b["crc_valid"] for b in doc["batches"][:11]] == [True] * 10 + [False]


def test_truncated_batch_prints_readable_batches_then_fails(segment_copy: Path) -> None:
    data = segment_copy.read_bytes()
    segment_copy.write_bytes(data[: len(data) - 5])
    code, [doc], stderr = rlm_dump(segment_copy)
    assert code == 1
    last_good_end = doc["valid_bytes"]
    assert last_good_end < len(data) - 5
    assert_one_line_error(stderr, str(segment_copy), f"byte {last_good_end}", "incomplete")


def test_bad_magic_is_named(segment_copy: Path) -> None:
    data = bytearray(segment_copy.read_bytes())
    data[16] = 7
    segment_copy.write_bytes(bytes(data))
    code, [doc], stderr = rlm_dump(segment_copy)
    assert code == 1 and doc["batches"] == []
    assert_one_line_error(stderr, str(segment_copy), "byte 0", "magic")


def test_index_with_a_torn_entry(fixtures_dir: Path, tmp_path: Path) -> None:
    src = fixtures_dir / "kafka-logs" / ARTHUR / "oms_order_created-1" / "00000000000000081908.index"
    dst = tmp_path / src.name
    dst.write_bytes(src.read_bytes() + b"\x00\x01\x02")
    code, [doc], stderr = rlm_dump(dst)
    assert code == 1
    assert len(doc["entries"]) == 581
    assert_one_line_error(stderr, str(dst))


def test_remote_log_index_with_a_bad_crc(tmp_path: Path) -> None:
    entries = [
        RemoteLogIndexEntry(
            first_offset=100 + 10 * i,
            last_offset=109 + 10 * i,
            first_timestamp=1000 + i,
            last_timestamp=2000 + i,
            data_length=512,
            rdi=RemoteDataIdentifier("s3://bkt/pfx/t-0/x.log", 512 * i),
        )
        for i in range(3)
    ]
    encoded = [e.encode() for e in entries]
    path = tmp_path / "00000000000000000100.remotelogindex"
    data = bytearray(b"".join(encoded))
    third = len(encoded[0]) + len(encoded[1])
    data[third + 20] ^= 0x01  # firstOffset of the third entry: covered by its CRC
    path.write_bytes(bytes(data))
    code, [doc], stderr = rlm_dump(path)
    assert code == 1
    assert doc["kind"] == "remote_log_index" and doc["base_offset"] == 100
    assert [e["first_offset"] for e in doc["entries"]] == [100, 110]
    assert doc["entries"][1]["rdi"] == "s3://bkt/pfx/t-0/x.log#512"
    assert_one_line_error(stderr, str(path), f"byte {third}", "CRC")


def test_unknown_and_missing_files_fail_cleanly(tmp_path: Path) -> None:
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    code, docs, stderr = rlm_dump(other, tmp_path / "missing.log")
    assert code == 1 and docs == []
    assert "Traceback" not in stderr
    assert "notes.txt" in stderr and "missing.log" in stderr


def test_no_arguments_is_a_usage_error() -> None:
    code, _, stderr = rlm_dump()
    assert code == 2 and "Traceback" not in stderr


def test_preallocated_zero_tails_are_not_reported(fixtures_dir: Path, tmp_path: Path) -> None:
    src = fixtures_dir / "kafka-logs" / ARTHUR / "oms_order_created-1" / "00000000000000081908.index"
    index = tmp_path / src.name
    index.write_bytes(src.read_bytes() + bytes(8 * 1000))  # what an unclean shutdown leaves
    fresh = tmp_path / "00000000000000094646.timeindex"
    fresh.write_bytes(bytes(12 * 1000))  # a new active segment's preallocated time index
    code, (idx, tix), stderr = rlm_dump(index, fresh)
    assert code == 0, stderr
    assert len(idx["entries"]) == 581 and idx["entries"][-1] == {"offset": 94635, "position": 3092362}
    assert tix["entries"] == []


def test_producer_snapshot_lists_the_producers_of_its_log(fixtures_dir: Path, tmp_path: Path) -> None:
    """A broker's producer-state ``.snapshot`` (Kafka's DumpLogSegments reads them; rlm dump
    refused them before tests/live/test_dump_agrees.py compared the two)."""
    part = fixtures_dir / "kafka-logs" / ITUMELENG / "_confluent-ksql-default__command_topic-0"
    code, (snap, log), stderr = rlm_dump(
        part / "00000000000000000002.snapshot", part / "00000000000000000000.log"
    )
    assert code == 0, stderr
    assert (snap["kind"], snap["base_offset"], snap["version"]) == ("producer_snapshot", 2, 1)
    [entry] = snap["entries"]
    data = log["batches"][0]  # the producer's data batch, offset 0, the transaction's COMMIT after it
    assert entry == {
        "producer_id": data["producer_id"],
        "producer_epoch": data["producer_epoch"],
        "coordinator_epoch": 0,
        "current_txn_first_offset": -1,
        "last_sequence": data["base_sequence"],
        "last_offset": data["last_offset"],
        "offset_delta": 0,
        "timestamp": entry["timestamp"],
    }
    damaged = tmp_path / "00000000000000000002.snapshot"
    raw = bytearray((part / damaged.name).read_bytes())
    raw[-1] ^= 0x01  # inside the entry, covered by the file's CRC
    damaged.write_bytes(bytes(raw))
    code, [doc], stderr = rlm_dump(damaged)
    assert code == 1 and doc["entries"] == []
    assert_one_line_error(stderr, str(damaged), "crc")


def test_txn_index_lists_aborted_transactions_then_names_a_torn_entry(tmp_path: Path) -> None:
    entries = [AbortedTxn(90, 120, 7, 121), AbortedTxn(125, 140, 8, 141)]
    path = tmp_path / "00000000000000000100.txnindex"
    path.write_bytes(encode_txn_index(entries))
    code, [doc], stderr = rlm_dump(path)
    assert code == 0, stderr
    assert doc == {
        "file": str(path),
        "kind": "txn_index",
        "base_offset": 100,
        "entries": [
            {"producer_id": 7, "first_offset": 90, "last_offset": 120, "last_stable_offset": 121},
            {"producer_id": 8, "first_offset": 125, "last_offset": 140, "last_stable_offset": 141},
        ],
    }
    path.write_bytes(encode_txn_index(entries) + b"\x00\x00\x01")
    code, [doc], stderr = rlm_dump(path)
    assert code == 1 and len(doc["entries"]) == 2
    assert_one_line_error(stderr, str(path), f"byte {2 * ABORTED_TXN_SIZE}", "torn")


def test_a_cleaned_batch_reports_its_delete_horizon(tmp_path: Path) -> None:
    """KIP-534: attribute bit 6 says baseTimestamp holds the delete horizon (DumpLogSegments'
    deleteHorizonMs; rlm dump did not report it before tests/live/test_dump_agrees.py compared
    the two on a compacted topic)."""
    records = [RecordSpec(1_700_000_000_000, b"k", None)]  # a tombstone
    plain = build_batch(records, base_offset=0)
    cleaned = bytearray(build_batch(records, base_offset=1))
    cleaned[22] |= 0x40  # attributes (int16 at byte 21), bit 6
    cleaned[17:21] = crc32c.crc32c(bytes(cleaned[21:])).to_bytes(4, "big")
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(plain + bytes(cleaned))
    code, [doc], stderr = rlm_dump(path)
    assert code == 0, stderr
    assert [b["delete_horizon_ms"] for b in doc["batches"]] == [None, 1_700_000_000_000]
    assert all(b["crc_valid"] for b in doc["batches"])
