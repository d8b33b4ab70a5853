"""``rlm dump`` agrees with Kafka's own ``DumpLogSegments`` on segments a live broker wrote (issue
#29, "formats"): every codec, idempotent and transactional producers, COMMIT and ABORT control
batches, CreateTime and LogAppendTime topics, and a compacted topic after the log cleaner's pass
(offset gaps, batches with a delete horizon); per batch its offsets, count, codec, producer id,
epoch and sequences, flags, delete horizon, CRC, timestamps, position and size, per record its
offset, timestamp, sequence, key, value and header keys (the tool prints no header values); and
the offset and time indexes, transaction indexes and producer snapshots."""

from __future__ import annotations

import base64
import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

from rlm.formats.records import iter_batches
from rlm.testing.daemon import rlm_cli
from rlm.testing.kafka_cluster import KafkaCluster, wait_until
from tests.live.helpers import produce
from tests.live.kafka_dump import (
    DumpedBatch,
    DumpedRecord,
    dump_log_segments,
    parse_dump,
    parse_entries,
    problems,
)
from tests.live.mixed_log import CODECS, produce_mixed, tombstones, transaction

pytestmark = [pytest.mark.kafka_live, pytest.mark.integration]

MiB = 1024 * 1024
#: a topic the log cleaner compacts as soon as it may: rolled every half second, any dirt cleaned,
#: tombstones kept a day (so the cleaned batches carry their delete horizon)
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": 500,
    "min.cleanable.dirty.ratio": 0.01,
    "min.compaction.lag.ms": 0,
    "delete.retention.ms": 86_400_000,
}
INT32_MAX = 2**31 - 1
_CONTROL_TYPES = {0: "ABORT", 1: "COMMIT"}


def _partition(
    kafka: KafkaCluster, topic: str, configs: dict[str, object], per_codec: int, size: int
) -> Path:
    kafka.create_topic(topic, configs=configs)
    produce_mixed(kafka.bootstrap, topic, per_codec, value_bytes=size)
    return kafka.nodes[0].log_dir / f"{topic}-0"


def _compacted(kafka: KafkaCluster, topic: str, copy: Path) -> Path:
    """A compacted partition the log cleaner has cleaned, copied to ``copy``: keyed batches (lz4,
    idempotent), tombstones and an aborted transaction, rolled every half second; once the cleaner
    rewrote them, batches keep tombstones and markers with a delete horizon (KIP-534). The copy
    is taken while the cleaner may still work (retried when a file is swapped under it), so both
    dump tools read the same bytes."""
    kafka.create_topic(topic, configs=COMPACTED)
    produce(kafka.bootstrap, topic, 60, value_bytes=40, compression="lz4")
    produce(kafka.bootstrap, topic, 60, value_bytes=40, compression="lz4")  # the same keys again
    tombstones(kafka.bootstrap, topic, [f"k{i}".encode() for i in range(0, 60, 3)])
    transaction(kafka.bootstrap, topic, 5, commit=False, compression="gzip", odd=False)
    source = kafka.nodes[0].log_dir / f"{topic}-0"

    def cleaned() -> Path | None:
        produce(kafka.bootstrap, topic, 1, value_bytes=16)  # appends roll the segments
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(source, copy)
        logs = sorted(copy.glob("*.log"))
        return copy if any(b.has_delete_horizon for p in logs for b in iter_batches(p.read_bytes())) else None

    done: Path = wait_until(cleaned, timeout=180, what=f"the log cleaner cleaning {topic}", interval=1)
    return done


@pytest.fixture(scope="module")
def partitions(kafka_single: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Live partitions: one over two 1 MiB segments (CreateTime), one LogAppendTime, and a copy
    of a compacted one after the log cleaner's pass."""
    copy = tmp_path_factory.mktemp("compacted") / "dump-agrees-compacted-0"
    return [
        _partition(kafka_single, "dump-agrees", {"segment.bytes": MiB}, 400, 700),
        _partition(kafka_single, "dump-agrees-lat", {"message.timestamp.type": "LogAppendTime"}, 40, 60),
        _compacted(kafka_single, "dump-agrees-compacted", copy),
    ]


def _rlm_dump(files: list[Path]) -> dict[str, dict[str, Any]]:
    done = rlm_cli("dump", "--records", *files, timeout=300)
    assert done.returncode == 0, done.stderr
    docs = [json.loads(line) for line in done.stdout.splitlines()]
    return {d["file"]: d for d in docs}


def _text(data: str | None) -> str | None:
    return None if data is None else base64.b64decode(data).decode("utf-8", errors="replace")


def _size(data: str | None) -> int:
    return -1 if data is None else len(base64.b64decode(data))


def _sequence(base_sequence: int, delta: int) -> int:
    """Kafka's ``DefaultRecordBatch.incrementSequence``: sequences wrap from INT32_MAX to 0."""
    if base_sequence < 0:
        return -1
    if base_sequence > INT32_MAX - delta:
        return delta - (INT32_MAX - base_sequence) - 1
    return base_sequence + delta


def _decrement(sequence: int, by: int) -> int:
    """Kafka's ``DefaultRecordBatch.decrementSequence`` (a snapshot entry's first sequence)."""
    return INT32_MAX - (by - sequence) + 1 if sequence < by else sequence - by


def record_tail(batch: dict[str, Any], record: dict[str, Any]) -> str:
    """The free tail DumpLogSegments prints after a record's header keys, from rlm's record."""
    if batch["is_control"]:
        _version, kind = struct.unpack(">hh", base64.b64decode(record["key"]))
        _version, coordinator_epoch = struct.unpack(">hi", base64.b64decode(record["value"]))
        return f" endTxnMarker: {_CONTROL_TYPES[kind]} coordinatorEpoch: {coordinator_epoch}"
    key, value = _text(record["key"]), _text(record["value"])
    return ("" if key is None else f" key: {key}") + ("" if value is None else f" payload: {value}")


def _batch_fields(b: dict[str, Any]) -> dict[str, str]:
    """rlm's batch as DumpLogSegments prints it (names and text of Kafka 4.1's batch line)."""
    flag = {True: "true", False: "false"}
    return {
        "baseOffset": str(b["base_offset"]),
        "lastOffset": str(b["last_offset"]),
        "count": str(b["record_count"]),
        "baseSequence": str(b["base_sequence"]),
        "lastSequence": str(_sequence(b["base_sequence"], b["last_offset"] - b["base_offset"])),
        "producerId": str(b["producer_id"]),
        "producerEpoch": str(b["producer_epoch"]),
        "partitionLeaderEpoch": str(b["partition_leader_epoch"]),
        "isTransactional": flag[b["is_transactional"]],
        "isControl": flag[b["is_control"]],
        "deleteHorizonMs": _optional(-1 if b["delete_horizon_ms"] is None else b["delete_horizon_ms"]),
        "position": str(b["position"]),
        b["timestamp_type"]: str(b["max_timestamp"]),
        "size": str(b["size"]),
        "magic": str(b["magic"]),
        "compresscodec": b["compression"],
        "crc": str(b["crc"]),
        "isvalid": flag[b["crc_valid"]],
    }


def _record_fields(b: dict[str, Any], r: dict[str, Any]) -> DumpedRecord:
    return DumpedRecord(
        offset=r["offset"],
        timestamp_type=b["timestamp_type"],
        timestamp=r["timestamp"],
        key_size=_size(r["key"]),
        value_size=_size(r["value"]),
        sequence=_sequence(b["base_sequence"], r["offset"] - b["base_offset"]),
        header_keys=[h["key"] for h in r["headers"]],
        tail=record_tail(b, r),
    )


def _compare_batch(where: str, kafka: DumpedBatch, rlm: dict[str, Any]) -> None:
    assert kafka.fields == _batch_fields(rlm), where
    assert kafka.timestamp_type == rlm["timestamp_type"], where
    assert len(kafka.records) == len(rlm["records"]) == rlm["record_count"], where
    for ours, theirs in zip(rlm["records"], kafka.records, strict=True):
        assert theirs == _record_fields(rlm, ours), f"{where}, offset {ours['offset']}"


def test_rlm_dump_agrees_with_dump_log_segments_on_live_segments(partitions: list[Path]) -> None:
    logs = sorted(p for d in partitions for p in d.glob("*.log"))
    compacted = list(partitions[2].glob("*.log"))
    text = dump_log_segments(logs, "--deep-iteration", "--print-data-log", gaps_in=compacted)
    assert problems(text) == []
    theirs = parse_dump(text)
    ours = _rlm_dump(logs)
    assert sorted(theirs) == sorted(ours) == sorted(map(str, logs))
    seen: dict[str, set[Any]] = {"codecs": set(), "types": set(), "markers": set(), "horizons": set()}
    for path in map(str, logs):
        kafka, rlm = theirs[path], ours[path]
        assert kafka.notes == [] and kafka.log_start == rlm["base_offset"]
        assert rlm["valid_bytes"] == rlm["size"] and len(kafka.batches) == len(rlm["batches"]), path
        for n, (k, r) in enumerate(zip(kafka.batches, rlm["batches"], strict=True)):
            _compare_batch(f"{path} batch {n}", k, r)
            seen["codecs"].add(r["compression"])
            seen["types"].add((r["timestamp_type"], r["is_transactional"], r["is_control"]))
            seen["markers"].update(rec.tail for rec in k.records if r["is_control"])
            seen["horizons"].add(r["delete_horizon_ms"] is not None)
    # the data really held what the comparison is about
    assert seen["codecs"] == set(CODECS) and seen["horizons"] == {True, False}
    assert {("CreateTime", True, True), ("LogAppendTime", True, True), ("CreateTime", True, False)} <= seen[
        "types"
    ]
    assert {m.split(" coordinatorEpoch")[0] for m in seen["markers"]} == {
        " endTxnMarker: COMMIT",
        " endTxnMarker: ABORT",
    }


def _optional(value: int) -> str:
    return "OptionalLong.empty" if value < 0 else f"OptionalLong[{value}]"


def _rlm_as_kafka_prints(doc: dict[str, Any]) -> list[dict[str, str]]:
    """rlm's entries of an index, transaction index or producer snapshot in DumpLogSegments' words."""
    if doc["kind"] == "offset_index":
        return [{"offset": str(e["offset"]), "position": str(e["position"])} for e in doc["entries"]]
    if doc["kind"] == "time_index":
        return [{"timestamp": str(e["timestamp"]), "offset": str(e["offset"])} for e in doc["entries"]]
    if doc["kind"] == "txn_index":
        return [
            {
                "version": "0",
                "producerId": str(e["producer_id"]),
                "firstOffset": str(e["first_offset"]),
                "lastOffset": str(e["last_offset"]),
                "lastStableOffset": str(e["last_stable_offset"]),
            }
            for e in doc["entries"]
        ]
    assert doc["kind"] == "producer_snapshot", doc
    return [
        {
            "producerId": str(e["producer_id"]),
            "producerEpoch": str(e["producer_epoch"]),
            "coordinatorEpoch": str(e["coordinator_epoch"]),
            "currentTxnFirstOffset": _optional(e["current_txn_first_offset"]),
            "lastTimestamp": str(e["timestamp"]),
            "firstSequence": str(_decrement(e["last_sequence"], e["offset_delta"])),
            "lastSequence": str(e["last_sequence"]),
            "lastOffset": str(e["last_offset"]),
            "offsetDelta": str(e["offset_delta"]),
            "timestamp": str(e["timestamp"]),
        }
        for e in doc["entries"]
    ]


def _unwritten_index(path: Path) -> bool:
    """An active segment's preallocated index before its first entry: non-empty, all zeros. The
    tool reads its first slot anyway — ``offset: <base> position: 0`` for an ``.index``, a
    ``timestamp mismatch ... Index timestamp: 0`` for a ``.timeindex`` — where rlm dump lists no
    entry (docs/cli.md: a preallocated zero tail is not reported; Kafka never indexes position 0)."""
    if path.suffix not in (".index", ".timeindex"):
        return False
    data = path.read_bytes()
    return bool(data) and not any(data)


def test_rlm_dump_agrees_on_indexes_transaction_indexes_and_snapshots(partitions: list[Path]) -> None:
    suffixes = (".index", ".timeindex", ".txnindex", ".snapshot")
    files = sorted(
        p for d in partitions for p in d.iterdir() if p.suffix in suffixes and not _unwritten_index(p)
    )
    text = dump_log_segments(files)
    assert problems(text) == []
    theirs = parse_entries(text)
    ours = _rlm_dump(files)
    assert sorted(theirs) == sorted(ours) == sorted(map(str, files))
    for path in map(str, files):
        assert theirs[path] == _rlm_as_kafka_prints(ours[path]), path
    kinds = {ours[str(p)]["kind"] for p in files if ours[str(p)]["entries"]}
    assert kinds == {"offset_index", "time_index", "txn_index", "producer_snapshot"}
