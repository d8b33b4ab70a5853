"""``verify`` stage 2 (``--deep``), one executor task per committed segment: every object is read
in full and its size and CRC-32C compared with the manifest; every batch of the log object is
CRC-checked and every ``.remotelogindex`` entry's offsets and max timestamp are compared with the
batches it covers. The log object is read in chunks of at most :data:`DEEP_CHUNK_BYTES`, cut at
entry boundaries, so an executor's memory stays bounded whatever the segment size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import crc32c as _crc32c

from rlm.errors import FormatError, ProtectionError, RlmError
from rlm.formats.indexes.remote_index import RemoteLogIndexEntry, iter_entries
from rlm.formats.records import RecordBatch, iter_batches
from rlm.jobs.checks.problem import Problem
from rlm.jobs.reading import BackendSpec, pack_entries
from rlm.storage.api import StorageBackend
from rlm.tiering.store import SegmentManifest

__all__ = ["DEEP_CHUNK_BYTES", "deep_check_segment"]

#: Bytes of the log object one read covers (bounded executor memory).
DEEP_CHUNK_BYTES = 16 * 1024 * 1024


def deep_check_segment(
    spec: BackendSpec, manifest_json: bytes, entries_blob: bytes | None
) -> tuple[list[Problem], int, int]:
    """Read every object of the segment; return (problems, bytes read, batches checked)."""
    backend = spec.create()  # its calls retried where it is opened (BackendSpec.create)
    m = SegmentManifest.from_json(manifest_json)
    where = _Where(m.topic, m.partition, m.base_offset, m.log.key)
    problems: list[Problem] = []
    entries: list[RemoteLogIndexEntry] = (
        [d.entry for d in iter_entries(entries_blob)] if entries_blob is not None else []
    )
    opened = _Opener(spec, m, problems)
    # A protected log without its (readable) entries cannot be cut into entries to open: stage 1
    # reported why; the objects are still read, checksummed and authenticated below.
    opened.failed |= m.protection is not None and not entries
    tally = _LogTally()
    try:
        _scan_log(backend, m, entries, opened, tally, problems)
    except RlmError as err:
        problems.append(where.problem("object_read", str(err)))
        return problems, tally.read, tally.batches
    problems += _log_totals(where, m, tally, opened.failed)
    read = tally.read + _check_objects(backend, m, opened, problems)
    return problems, read, tally.batches


@dataclass(frozen=True, slots=True)
class _Where:
    """The segment (topic, partition, base offset) and object key a problem is about."""

    topic: str
    partition: int
    base: int
    key: str

    def problem(self, check: str, message: str, **kw: Any) -> Problem:
        return Problem(check, self.topic, self.partition, message, base_offset=self.base, key=self.key, **kw)


@dataclass
class _LogTally:
    """What the log object's chunks read so far held: bytes, their running CRC-32C, batches and
    the max batch timestamp (ms, -1 before any batch)."""

    read: int = 0
    crc: int = 0
    batches: int = 0
    max_ts: int = -1


def _scan_log(
    backend: StorageBackend,
    m: SegmentManifest,
    entries: list[RemoteLogIndexEntry],
    opened: _Opener,
    tally: _LogTally,
    problems: list[Problem],
) -> None:
    """Read the log object in chunks of at most :data:`DEEP_CHUNK_BYTES` cut at entry boundaries
    (the whole object as one when its entries are unknown), add each to ``tally`` and check the
    batches of each entry; a failed read raises (``tally`` holds what was read before)."""
    where = _Where(m.topic, m.partition, m.base_offset, m.log.key)
    chunks = pack_entries(entries, DEEP_CHUNK_BYTES, lambda e: True) if entries else [(0, m.log.size)]
    pending = list(entries)
    for start, end in chunks:
        data = backend.read(m.log.key, start, end)
        tally.read += len(data)
        tally.crc = _crc32c.crc32c(data, tally.crc)
        ranges: list[tuple[RemoteLogIndexEntry | None, int, int]] = []
        while pending and pending[0].rdi.position < end:
            e = pending.pop(0)
            ranges.append((e, e.rdi.position - start, e.rdi.position - start + e.stored_size))
        if not ranges and m.protection is None:
            ranges = [(None, 0, len(data))]
        for entry, s, t in ranges:
            plain = opened.entry(entry, data[s:t]) if entry is not None and entry.transformed else None
            if entry is not None and entry.transformed and plain is None:
                continue  # not authentic / no key: reported once by the opener
            batch_count, entry_max, errs = _check_range(
                where,
                *((plain, 0, len(plain), start + s) if plain is not None else (data, s, t, start)),
                entry,
            )
            tally.batches += batch_count
            tally.max_ts = max(tally.max_ts, entry_max)
            problems += errs


def _log_totals(where: _Where, m: SegmentManifest, tally: _LogTally, failed: bool) -> list[Problem]:
    """The whole log object against its manifest: size and CRC-32C, and — unless some entry did
    not open (``failed``, already reported) — the batch count and max timestamp."""
    out = []
    if tally.read != m.log.size or tally.crc != m.log.crc32c:
        out.append(
            where.problem(
                "object_crc32c",
                f"log object: {tally.read} bytes with CRC-32C {tally.crc:#010x}, the manifest says "
                f"{m.log.size} bytes with {m.log.crc32c:#010x}",
            )
        )
    if tally.batches != m.record_batches and not failed:
        out.append(
            where.problem(
                "manifest_batches",
                f"{tally.batches} batches in the log object, the manifest says {m.record_batches}",
            )
        )
    if tally.batches and tally.max_ts != m.max_timestamp and not failed:
        out.append(
            where.problem(
                "manifest_timestamp",
                f"max batch timestamp {tally.max_ts}, the manifest says {m.max_timestamp}",
            )
        )
    return out


def _check_objects(
    backend: StorageBackend, m: SegmentManifest, opened: _Opener, problems: list[Problem]
) -> int:
    """Read every object but the log whole: its size and CRC-32C against the manifest, and
    authenticate it when encrypted; return the bytes read."""
    read = 0
    for name, stored in sorted(m.objects.items()):
        if name == "log":
            continue
        where = _Where(m.topic, m.partition, m.base_offset, stored.key)
        try:
            data = backend.read(stored.key)
        except RlmError as err:
            problems.append(where.problem("object_read", str(err)))
            continue
        read += len(data)
        actual = _crc32c.crc32c(data)
        if len(data) != stored.size or actual != stored.crc32c:
            problems.append(
                where.problem(
                    "object_crc32c",
                    f"object {name!r}: {len(data)} bytes with CRC-32C {actual:#010x}, the "
                    f"manifest says {stored.size} bytes with {stored.crc32c:#010x}",
                )
            )
        opened.whole(stored.key, data)  # authenticates an encrypted object (docs/protection.md)
    return read


class _Opener:
    """Authenticates and opens a protected segment's entries and objects for the deep check; each
    failure is one ``protection`` problem naming the object, offset and key id (a missing or wrong
    key once per segment, not per entry)."""

    def __init__(self, spec: BackendSpec, m: SegmentManifest, problems: list[Problem]) -> None:
        self.m, self.problems = m, problems
        self.protection = spec.protection() if m.protection is not None else None
        self.usable = True
        self.failed = False  # some entry or object did not open (already reported)
        if self.protection is not None:
            try:
                self.protection.data_key(m)
            except ProtectionError as err:
                self._report(err)
                self.usable = False

    def _report(self, err: RlmError) -> None:
        self.failed = True
        self.problems.append(
            Problem(
                "protection",
                self.m.topic,
                self.m.partition,
                err.reason,
                base_offset=self.m.base_offset,
                key=err.file,
                offset=err.offset,
            )
        )

    def entry(self, entry: RemoteLogIndexEntry, stored: bytes) -> bytes | None:
        if self.protection is None or not self.usable:
            return None
        try:
            return self.protection.open_entry(self.m, entry, stored)
        except (ProtectionError, FormatError) as err:
            self._report(err)
            return None

    def whole(self, key: str, stored: bytes) -> None:
        if self.protection is None or not self.usable or not self.m.encrypted:
            return
        try:
            self.protection.open_object(self.m, key, stored)
        except ProtectionError as err:
            self._report(err)


def _check_range(
    where: _Where, data: bytes, s: int, t: int, chunk_start: int, entry: RemoteLogIndexEntry | None
) -> tuple[int, int, list[Problem]]:
    """CRC-check the batches in ``data[s:t]`` (one entry; ``chunk_start``: the byte of the object
    ``data`` starts at): (batches, max timestamp, problems)."""
    errs: list[Problem] = []
    found = []
    try:
        found = list(iter_batches(data, s, verify_crc=False, end=t))
    except FormatError as err:
        position = None if err.position is None else chunk_start + err.position
        errs.append(where.problem("batch_corrupt", err.reason, position=position, offset=err.offset))
    errs += [
        where.problem(
            "batch_crc",
            f"record batch CRC mismatch (stored {b.crc:#010x}, offsets {b.base_offset}-{b.last_offset})",
            position=chunk_start + b.position,
            offset=b.base_offset,
        )
        for b in found
        if not b.crc_valid
    ]
    covered = found[-1].end_position if found else s
    if not errs and covered != t:
        errs.append(
            where.problem(
                "batch_corrupt",
                f"batches end at byte {chunk_start + covered}, the entry ends at "
                f"{chunk_start + t} (torn or mis-framed)",
                position=chunk_start + covered,
            )
        )
    if entry is not None and found and not errs:
        errs += _entry_agrees(where, entry, found, chunk_start + s)
    return len(found), max((b.max_timestamp for b in found), default=-1), errs


def _entry_agrees(
    where: _Where, entry: RemoteLogIndexEntry, found: list[RecordBatch], position: int
) -> list[Problem]:
    """The entry's offsets and last timestamp must be those of the batches it covers."""
    if (found[0].base_offset, found[-1].last_offset) != (entry.first_offset, entry.last_offset):
        return [
            where.problem(
                "entry_mismatch",
                f"entry says offsets {entry.first_offset}-{entry.last_offset}, its batches "
                f"hold {found[0].base_offset}-{found[-1].last_offset}",
                position=position,
                offset=entry.first_offset,
            )
        ]
    max_ts = max(b.max_timestamp for b in found)
    if max_ts != entry.last_timestamp:
        return [
            where.problem(
                "entry_mismatch",
                f"entry last timestamp {entry.last_timestamp} != max batch timestamp {max_ts}",
                position=position,
                offset=entry.first_offset,
            )
        ]
    return []
