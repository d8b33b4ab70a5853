"""``rlm dump [--records] FILE...`` — one JSON object per file, JSON Lines (docs/cli.md).

The field names and kinds are a contract other tools parse: change them only together with
docs/cli.md. A corrupt or unreadable file still prints the entries readable before the damage,
then one line on stderr naming file, position and reason, and the command exits 1.
"""

from __future__ import annotations

import mmap
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from rlm.cli.errors import EXIT_FAILURE, handle_errors, report
from rlm.cli.output import emit_json
from rlm.errors import FormatError, RlmError
from rlm.formats import naming
from rlm.formats.checkpoint import parse_leader_epoch_checkpoint, parse_offset_checkpoint
from rlm.formats.indexes.offset_index import OffsetIndex
from rlm.formats.indexes.remote_index import TRANSFORM_AES_GCM, TRANSFORM_ZSTD, scan_entries
from rlm.formats.indexes.time_index import TimeIndex
from rlm.formats.indexes.txn_index import ABORTED_TXN_SIZE, parse_txn_index
from rlm.formats.producer_snapshot import PRODUCER_SNAPSHOT_VERSION, parse_producer_snapshot
from rlm.formats.records import RecordBatch, decode_records, iter_batches
from rlm.formats.records.as_json import record_json

__all__ = [
    "DumpResult",
    "Json",
    "dump",
    "dump_checkpoint",
    "dump_file",
    "dump_log",
    "dump_producer_snapshot",
    "dump_remote_log_index",
]

Json = dict[str, Any]

# KRaft snapshots (<offset>-<epoch>.checkpoint) and bootstrap.checkpoint hold record batches.
_SNAPSHOT_NAME = re.compile(r"^(\d{20}-\d{10}|bootstrap)\.checkpoint$")


@dataclass
class DumpResult:
    """What one file produced: the JSON object, and the error that stopped reading, if any."""

    doc: Json
    error: RlmError | None = None


@contextmanager
def _mapped(path: Path) -> Iterator[bytes | mmap.mmap]:
    """Map a file read-only (an empty file cannot be mapped: it reads as b"")."""
    with path.open("rb") as fh:
        size = fh.seek(0, 2)
        if size == 0:
            yield b""
            return
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            yield mm


def _transform_names(transform: int) -> list[str]:
    """A magic 1 entry's transform bits by name, in the order they were applied."""
    return [
        name
        for bit, name in ((TRANSFORM_ZSTD, "zstd"), (TRANSFORM_AES_GCM, "aes-256-gcm"))
        if transform & bit
    ]


def _base_offset(path: Path) -> int | None:
    try:
        return naming.parse_base_offset(path.name)
    except RlmError:
        return None


def _batch_json(batch: RecordBatch) -> Json:
    return {
        "position": batch.position,
        "size": batch.size,
        "base_offset": batch.base_offset,
        "last_offset": batch.last_offset,
        "magic": batch.magic,
        "crc": batch.crc,
        "crc_valid": batch.crc_valid,
        "compression": batch.compression.label,
        "timestamp_type": batch.timestamp_type.label,
        "base_timestamp": batch.base_timestamp,
        "max_timestamp": batch.max_timestamp,
        "producer_id": batch.producer_id,
        "producer_epoch": batch.producer_epoch,
        "base_sequence": batch.base_sequence,
        "partition_leader_epoch": batch.partition_leader_epoch,
        "is_transactional": batch.is_transactional,
        "is_control": batch.is_control,
        "record_count": batch.record_count,
        # KIP-534: a batch the log cleaner kept for its tombstones or markers stores the delete
        # horizon in its base timestamp field (docs/formats.md §3.2); null otherwise
        "delete_horizon_ms": batch.base_timestamp if batch.has_delete_horizon else None,
    }


def dump_log(path: Path, *, kind: str = "log", with_records: bool = False) -> DumpResult:
    """Batches of a ``.log`` (or a KRaft snapshot); CRCs are reported per batch, not raised."""
    with _mapped(path) as buf:
        batches: list[Json] = []
        doc: Json = {
            "file": str(path),
            "kind": kind,
            "base_offset": _base_offset(path),
            "size": len(buf),
            "valid_bytes": 0,
            "batches": batches,
        }
        error: RlmError | None = None
        try:
            for batch in iter_batches(buf, verify_crc=False):
                entry = _batch_json(batch)
                if with_records:
                    entry["records"] = [record_json(r) for r in decode_records(buf, batch)]
                batches.append(entry)
                doc["valid_bytes"] = batch.position + batch.size
                if not batch.crc_valid and error is None:
                    error = FormatError(
                        f"CRC mismatch: stored {batch.crc:#010x}",
                        position=batch.position,
                        offset=batch.base_offset,
                    )
        except RlmError as err:
            error = err
        if error is None and doc["valid_bytes"] < len(buf):
            # Iteration stops cleanly at a torn tail (the store may be mid-append); for a file
            # someone asked to inspect, bytes that are not a complete batch are worth an error.
            error = FormatError(
                f"incomplete batch: {len(buf) - doc['valid_bytes']} trailing bytes do not form "
                "a complete batch",
                position=doc["valid_bytes"],
            )
    return DumpResult(doc, error.in_file(path) if error else None)


def _dump_index(
    path: Path, kind: str, parse: Callable[[int, bytes, bool], list[Json]], entry_size: int
) -> DumpResult:
    """Kafka's own index files may carry a preallocated zero tail; rlm's remote ones never do."""
    preallocated = not kind.startswith("remote_")
    base = _base_offset(path)
    data = path.read_bytes()
    doc: Json = {"file": str(path), "kind": kind, "base_offset": base, "entries": []}
    if base is None:
        return DumpResult(doc, RlmError("file name does not start with a base offset", file=path))
    try:
        doc["entries"] = parse(base, data, preallocated)
        return DumpResult(doc)
    except FormatError as err:
        # Report what is readable: the whole entries before the damaged one.
        good = (err.position if err.position is not None else len(data)) // entry_size * entry_size
        try:
            doc["entries"] = parse(base, data[:good], preallocated)
        except FormatError:
            doc["entries"] = []
        return DumpResult(doc, err.in_file(path))


def _offset_entries(base: int, data: bytes, preallocated: bool) -> list[Json]:
    index = OffsetIndex(base, data, preallocated=preallocated)
    return [{"offset": e.offset, "position": e.position} for e in index]


def _time_entries(base: int, data: bytes, preallocated: bool) -> list[Json]:
    index = TimeIndex(base, data, preallocated=preallocated)
    return [{"timestamp": e.timestamp, "offset": e.offset} for e in index]


def _txn_entries(base: int, data: bytes, _preallocated: bool) -> list[Json]:
    """Aborted transactions (docs/formats.md §4.4); Kafka's ``sanityCheck`` rules apply."""
    return [
        {
            "producer_id": e.producer_id,
            "first_offset": e.first_offset,
            "last_offset": e.last_offset,
            "last_stable_offset": e.last_stable_offset,
        }
        for e in parse_txn_index(data, base)
    ]


def dump_producer_snapshot(path: Path) -> DumpResult:
    """A producer-state ``.snapshot`` (docs/formats.md §4.5), named by the offset it describes.
    Its CRC covers every entry, so a damaged file lists none."""
    doc: Json = {
        "file": str(path),
        "kind": "producer_snapshot",
        "base_offset": _base_offset(path),
        "version": PRODUCER_SNAPSHOT_VERSION,
        "entries": [],
    }
    try:
        snapshot = parse_producer_snapshot(path.read_bytes())
    except FormatError as err:
        return DumpResult(doc, err.in_file(path))
    doc["entries"] = [
        {
            "producer_id": e.producer_id,
            "producer_epoch": e.producer_epoch,
            "coordinator_epoch": e.coordinator_epoch,
            "current_txn_first_offset": e.current_txn_first_offset,
            "last_sequence": e.last_sequence,
            "last_offset": e.last_offset,
            "offset_delta": e.offset_delta,
            "timestamp": e.timestamp,
        }
        for e in snapshot.entries
    ]
    return DumpResult(doc)


def dump_remote_log_index(path: Path) -> DumpResult:
    """Entries of a ``.remotelogindex``; each CRC is verified, a bad tail stops the listing."""
    data = path.read_bytes()
    scan = scan_entries(data)
    entries = [
        {
            "position": d.position,
            "magic": d.entry.magic,
            "crc": d.crc,
            "crc_valid": True,
            "first_offset": d.entry.first_offset,
            "last_offset": d.entry.last_offset,
            "first_timestamp": d.entry.first_timestamp,
            "last_timestamp": d.entry.last_timestamp,
            "data_length": d.entry.data_length,
            "rdi": str(d.entry.rdi),
            # magic 1 (docs/protection.md): how the entry is stored
            **(
                {"stored_length": d.entry.stored_length, "transform": _transform_names(d.entry.transform)}
                if d.entry.transformed
                else {}
            ),
        }
        for d in scan.entries
    ]
    doc: Json = {
        "file": str(path),
        "kind": "remote_log_index",
        "base_offset": _base_offset(path),
        "entries": entries,
    }
    return DumpResult(doc, scan.error.in_file(path) if scan.error else None)


def dump_checkpoint(path: Path) -> DumpResult:
    """Kafka's text checkpoints: offset checkpoints and ``leader-epoch-checkpoint``."""
    text = path.read_bytes()  # the parser decodes: bad UTF-8 is a CheckpointError naming the byte
    try:
        if path.name == "leader-epoch-checkpoint":
            lec = parse_leader_epoch_checkpoint(text)
            entries: list[Json] = [{"epoch": e.epoch, "start_offset": e.start_offset} for e in lec.entries]
            return DumpResult(
                {
                    "file": str(path),
                    "kind": "leader_epoch_checkpoint",
                    "version": lec.version,
                    "entries": entries,
                }
            )
        oc = parse_offset_checkpoint(text)
        entries = [
            {"topic": topic, "partition": partition, "offset": offset}
            for (topic, partition), offset in oc.entries.items()
        ]
        return DumpResult(
            {"file": str(path), "kind": "offset_checkpoint", "version": oc.version, "entries": entries}
        )
    except FormatError as err:
        return DumpResult({"file": str(path), "kind": "checkpoint", "entries": []}, err.in_file(path))


def dump_file(path: Path, *, with_records: bool = False) -> DumpResult:
    """Dispatch on the file name (Kafka names files by kind, not by content)."""
    name = path.name
    suffix = path.suffix
    if suffix == naming.LOG:
        return dump_log(path, with_records=with_records)
    if _SNAPSHOT_NAME.match(name):
        return dump_log(path, kind="snapshot", with_records=with_records)
    if suffix == naming.INDEX:
        return _dump_index(path, "offset_index", _offset_entries, OffsetIndex.ENTRY_SIZE)
    if suffix == naming.REMOTE_OFFSET_INDEX:
        return _dump_index(path, "remote_offset_index", _offset_entries, OffsetIndex.ENTRY_SIZE)
    if suffix == naming.TIME_INDEX:
        return _dump_index(path, "time_index", _time_entries, TimeIndex.ENTRY_SIZE)
    if suffix == naming.REMOTE_TIME_INDEX:
        return _dump_index(path, "remote_time_index", _time_entries, TimeIndex.ENTRY_SIZE)
    if suffix == naming.TXN_INDEX:
        return _dump_index(path, "txn_index", _txn_entries, ABORTED_TXN_SIZE)
    if suffix == naming.SNAPSHOT:
        return dump_producer_snapshot(path)
    if suffix == naming.REMOTE_LOG_INDEX:
        return dump_remote_log_index(path)
    if name.endswith("-checkpoint"):
        return dump_checkpoint(path)
    raise RlmError(
        "unsupported file type (expected .log, .index, .timeindex, .txnindex, .snapshot, "
        ".remotelogindex, .remoteoffsetindex, .remotetimeindex, *-checkpoint or a KRaft "
        ".checkpoint snapshot)",
        file=path,
    )


@click.command("dump")
@click.option("--records", "with_records", is_flag=True, help="Also decode every record of each batch.")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@handle_errors
def dump(files: tuple[Path, ...], with_records: bool) -> None:
    """Print FILE... as JSON Lines: segments, indexes, transaction indexes, producer snapshots,
    remote indexes, checkpoints."""
    failed = False
    for path in files:
        try:
            result = dump_file(path, with_records=with_records)
        except (RlmError, OSError) as err:
            report(err)
            failed = True
            continue
        emit_json(result.doc)
        if result.error is not None:
            report(result.error)
            failed = True
    sys.stdout.flush()
    if failed:
        raise SystemExit(EXIT_FAILURE)
