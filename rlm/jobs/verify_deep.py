"""``verify`` stage 2 (``--deep``), one executor task per committed segment: every object is read
in full and its size and CRC-32C compared with the manifest; every batch of the log object is
CRC-checked and every ``.remotelogindex`` entry's offsets and max timestamp are compared with the
batches it covers. The log object is read in chunks of at most :data:`DEEP_CHUNK_BYTES`, cut at
entry boundaries, so an executor's memory stays bounded whatever the segment size.
"""

from __future__ import annotations

import crc32c as _crc32c

from rlm.errors import FormatError, ProtectionError, RlmError
from rlm.formats.records import iter_batches
from rlm.formats.remote_index import RemoteLogIndexEntry, iter_entries
from rlm.jobs.plan import BackendSpec, pack_entries
from rlm.jobs.problem import Problem
from rlm.storage.retry import RetryPolicy
from rlm.tiering.manifest import SegmentManifest

__all__ = ["DEEP_CHUNK_BYTES", "deep_check_segment"]

#: Bytes of the log object one read covers (bounded executor memory).
DEEP_CHUNK_BYTES = 16 * 1024 * 1024


def deep_check_segment(
    spec: BackendSpec, manifest_json: bytes, entries_blob: bytes | None
) -> tuple[list[Problem], int, int]:
    """Read every object of the segment; return (problems, bytes read, batches checked)."""
    backend, retry = spec.create(), RetryPolicy()
    m = SegmentManifest.from_json(manifest_json)
    topic, partition, base = m.topic, m.partition, m.base_offset
    problems: list[Problem] = []
    read = 0
    log_key = m.log.key
    entries: list[RemoteLogIndexEntry] = (
        [d.entry for d in iter_entries(entries_blob)] if entries_blob is not None else []
    )
    chunks = pack_entries(entries, DEEP_CHUNK_BYTES, lambda e: True) if entries else [(0, m.log.size)]
    crc, batches, max_ts = 0, 0, -1
    pending = list(entries)
    opened = _Opener(spec, m, problems)
    # A protected log without its (readable) entries cannot be cut into entries to open: stage 1
    # reported why; the objects are still read, checksummed and authenticated below.
    opened.failed |= m.protection is not None and not entries
    try:
        for start, end in chunks:
            data = retry.call(lambda s=start, t=end: backend.read(log_key, s, t))
            read += len(data)
            crc = _crc32c.crc32c(data, crc)
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
                    topic,
                    partition,
                    base,
                    log_key,
                    *((plain, 0, len(plain), start + s) if plain is not None else (data, s, t, start)),
                    entry,
                )
                batches += batch_count
                max_ts = max(max_ts, entry_max)
                problems += errs
    except RlmError as err:
        problems.append(Problem("object_read", topic, partition, str(err), base_offset=base, key=log_key))
        return problems, read, batches
    if read != m.log.size or crc != m.log.crc32c:
        problems.append(
            Problem(
                "object_crc32c",
                topic,
                partition,
                f"log object: {read} bytes with CRC-32C {crc:#010x}, the manifest says "
                f"{m.log.size} bytes with {m.log.crc32c:#010x}",
                base_offset=base,
                key=log_key,
            )
        )
    if batches != m.record_batches and not opened.failed:  # entries that did not open: reported
        problems.append(
            Problem(
                "manifest_batches",
                topic,
                partition,
                f"{batches} batches in the log object, the manifest says {m.record_batches}",
                base_offset=base,
                key=log_key,
            )
        )
    if batches and max_ts != m.max_timestamp and not opened.failed:
        problems.append(
            Problem(
                "manifest_timestamp",
                topic,
                partition,
                f"max batch timestamp {max_ts}, the manifest says {m.max_timestamp}",
                base_offset=base,
                key=log_key,
            )
        )
    for name, stored in sorted(m.objects.items()):
        if name == "log":
            continue
        try:
            data = retry.call(lambda k=stored.key: backend.read(k))
        except RlmError as err:
            problems.append(
                Problem("object_read", topic, partition, str(err), base_offset=base, key=stored.key)
            )
            continue
        read += len(data)
        actual = _crc32c.crc32c(data)
        if len(data) != stored.size or actual != stored.crc32c:
            problems.append(
                Problem(
                    "object_crc32c",
                    topic,
                    partition,
                    f"object {name!r}: {len(data)} bytes with CRC-32C {actual:#010x}, the "
                    f"manifest says {stored.size} bytes with {stored.crc32c:#010x}",
                    base_offset=base,
                    key=stored.key,
                )
            )
        opened.whole(stored.key, data)  # authenticates an encrypted object (docs/protection.md)
    return problems, read, batches


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
    topic: str,
    partition: int,
    base: int,
    key: str,
    data: bytes,
    s: int,
    t: int,
    chunk_start: int,
    entry: RemoteLogIndexEntry | None,
) -> tuple[int, int, list[Problem]]:
    """CRC-check the batches in ``data[s:t]`` (one entry): (batches, max timestamp, problems)."""
    errs: list[Problem] = []
    found = []
    try:
        found = list(iter_batches(data, s, verify_crc=False, end=t))
    except FormatError as err:
        errs.append(
            Problem(
                "batch_corrupt",
                topic,
                partition,
                err.reason,
                base_offset=base,
                key=key,
                position=None if err.position is None else chunk_start + err.position,
                offset=err.offset,
            )
        )
    for b in found:
        if not b.crc_valid:
            errs.append(
                Problem(
                    "batch_crc",
                    topic,
                    partition,
                    f"record batch CRC mismatch (stored {b.crc:#010x}, offsets "
                    f"{b.base_offset}-{b.last_offset})",
                    base_offset=base,
                    key=key,
                    position=chunk_start + b.position,
                    offset=b.base_offset,
                )
            )
    covered = found[-1].end_position if found else s
    if not errs and covered != t:
        errs.append(
            Problem(
                "batch_corrupt",
                topic,
                partition,
                f"batches end at byte {chunk_start + covered}, the entry ends at "
                f"{chunk_start + t} (torn or mis-framed)",
                base_offset=base,
                key=key,
                position=chunk_start + covered,
            )
        )
    if entry is not None and found and not errs:
        if (found[0].base_offset, found[-1].last_offset) != (entry.first_offset, entry.last_offset):
            errs.append(
                Problem(
                    "entry_mismatch",
                    topic,
                    partition,
                    f"entry says offsets {entry.first_offset}-{entry.last_offset}, its batches "
                    f"hold {found[0].base_offset}-{found[-1].last_offset}",
                    base_offset=base,
                    key=key,
                    position=chunk_start + s,
                    offset=entry.first_offset,
                )
            )
        elif max(b.max_timestamp for b in found) != entry.last_timestamp:
            errs.append(
                Problem(
                    "entry_mismatch",
                    topic,
                    partition,
                    f"entry last timestamp {entry.last_timestamp} != max batch timestamp "
                    f"{max(b.max_timestamp for b in found)}",
                    base_offset=base,
                    key=key,
                    position=chunk_start + s,
                    offset=entry.first_offset,
                )
            )
    return len(found), max((b.max_timestamp for b in found), default=-1), errs
