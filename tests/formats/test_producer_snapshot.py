"""Kafka's producer-state snapshot parser (rlm.formats.producer_snapshot, docs/formats.md §4.5):
every real broker snapshot of shared/fixtures parses, its entries agree with the partition's
batches as kafka-python decodes them, and damaged bytes (CRC, truncation, version, count) are
refused with the field and byte position named."""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import pytest
from kafka.record.memory_records import MemoryRecords

from rlm.errors import CorruptSnapshotError, FormatError
from rlm.formats.producer_snapshot import parse_producer_snapshot


def craft(entries: list[tuple[int, int, int, int, int, int, int, int]], version: int = 1) -> bytes:
    """A snapshot from the documented layout: entries are (pid, epoch, lastSeq, lastOffset,
    offsetDelta, timestamp, coordinatorEpoch, currentTxnFirstOffset)."""
    body = struct.pack(">i", len(entries)) + b"".join(struct.pack(">qhiqiqiq", *e) for e in entries)
    return struct.pack(">hI", version, crc32c.crc32c(body)) + body


def test_every_fixture_snapshot_parses_and_names_real_batches(fixtures_dir: Path) -> None:
    files = sorted((fixtures_dir / "kafka-logs").glob("*/*/*.snapshot"))
    assert len(files) >= 10
    with_entries = 0
    for path in files:
        snap = parse_producer_snapshot(path.read_bytes())
        at = int(path.stem)  # the state after every batch below this offset
        if not snap.entries:
            continue
        with_entries += 1
        batches = []
        for log in sorted(path.parent.glob("*.log")):
            records = MemoryRecords(log.read_bytes())
            while (b := records.next_batch()) is not None:
                batches.append(b)
        for e in snap.entries:
            assert 0 <= e.last_offset < at, (path, e)
            (batch,) = [b for b in batches if b.base_offset + b.last_offset_delta == e.last_offset]
            assert batch.producer_id == e.producer_id
            assert batch.producer_epoch == e.producer_epoch
            assert batch.base_sequence + batch.last_offset_delta == e.last_sequence
            assert batch.last_offset_delta == e.offset_delta
            assert e.timestamp > 0  # the broker's time of the producer's last write (not the batch's)
            if not batch.is_transactional:
                assert e.current_txn_first_offset == -1
        assert snap.open_transactions() == {
            e.producer_id: e.current_txn_first_offset for e in snap.entries if e.current_txn_first_offset >= 0
        }
    assert with_entries >= 1  # the ksql command topic's idempotent producer


def test_crafted_snapshot_round_trips_every_field() -> None:
    entries = [
        (1001, 3, 41, 900, 4, 1_700_000_000_123, 7, 850),
        (1002, 0, 9, 910, 0, 1_700_000_000_456, -1, -1),
        (2**62, -1, -1, -1, 0, -1, -1, -1),
    ]
    snap = parse_producer_snapshot(craft(entries))
    assert [
        (
            e.producer_id,
            e.producer_epoch,
            e.last_sequence,
            e.last_offset,
            e.offset_delta,
            e.timestamp,
            e.coordinator_epoch,
            e.current_txn_first_offset,
        )
        for e in snap.entries
    ] == entries
    assert snap.open_transactions() == {1001: 850}
    assert parse_producer_snapshot(craft([])).entries == ()


@pytest.mark.parametrize(
    ("mutate", "field", "position"),
    [
        (lambda b: b[:9], "header", 0),
        (lambda b: b[:-1], "crc", 2),  # a torn last entry no longer matches its CRC
        (lambda b: b[:6] + bytes([b[6] ^ 1]) + b[7:], "crc", 2),
        (lambda b: struct.pack(">h", 2) + b[2:], "version 2", 0),
        (lambda b: struct.pack(">h", 0) + b[2:], "version 0", 0),
    ],
)
def test_damaged_snapshots_are_refused_naming_the_field(mutate: object, field: str, position: int) -> None:
    good = craft([(1001, 0, 5, 100, 2, 1, 0, 90)])
    with pytest.raises(CorruptSnapshotError) as err:
        parse_producer_snapshot(mutate(good))  # type: ignore[operator]
    assert isinstance(err.value, FormatError)
    assert err.value.position == position and field in str(err.value)
    assert "snap.snapshot: byte" in str(err.value.in_file("snap.snapshot"))


@pytest.mark.parametrize(("count", "extra"), [(2, b""), (-1, b""), (1, b"\0")])
def test_counts_that_do_not_match_the_size_are_refused(count: int, extra: bytes) -> None:
    entry = struct.pack(">qhiqiqiq", 1001, 0, 5, 100, 2, 1, 0, 90)
    body = struct.pack(">i", count) + entry + extra
    data = struct.pack(">hI", 1, crc32c.crc32c(body)) + body  # a valid CRC: the count itself is wrong
    with pytest.raises(CorruptSnapshotError, match=f"count {count}") as err:
        parse_producer_snapshot(data)
    assert err.value.position == 6
