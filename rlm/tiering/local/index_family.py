"""The local remote-index family of one partition: sets of three files, appended, rotated, repaired
(the writer; reading a set is rlm/logdir/index_sets.py, the byte format rlm/formats/indexes/remote_index.py).

Files live in the partition directory (docs/formats.md §5)::

    <base>.remotelogindex   entries (CRC-32 each), the source of truth
    <base>.remoteoffsetindex / <base>.remotetimeindex   derived from it, rebuilt whenever in doubt

Exactly one set — the one with the highest base — is *active* and receives appends; it is
rotated (left as it is, fsynced, never written again) when its ``.remotelogindex`` reaches
``rotate_bytes``, when it is older than ``rotate_ms``, or before an entry would overflow an int32
field. A new set's base is the first offset of its first entry.

Crash safety: every append writes the ``.remotelogindex`` bytes first, then the two derived
files (the ``.remoteoffsetindex`` last), then fsyncs all three. On open, the active set's
``.remotelogindex`` is CRC-scanned, a torn or corrupt tail is truncated at the last good entry, and
the derived files are rewritten from what remains whenever they differ; a sealed set whose
``.remoteoffsetindex`` lags its entries gets them rewritten too.

Readers go by each set's ``.remoteoffsetindex`` — its gate (docs/formats.md §5.4): a set is deleted
and cut back gate first, derived files are replaced by rename, gate last, and :meth:`RemoteIndexFamily.staged`
(recovery's rebuild) publishes every changed set only once all its entries are written.
"""

from __future__ import annotations

import json
import logging
import os
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rlm.errors import FormatError
from rlm.formats import naming
from rlm.formats.indexes.offset_index import INT32_MAX, OffsetIndex
from rlm.formats.indexes.remote_index import (
    DecodedEntry,
    RemoteLogIndexEntry,
    iter_entries,
    scan_entries,
)
from rlm.formats.indexes.remote_index_derived import RemoteIndexSetBuilder
from rlm.fsutil import atomic_write, fsync_dir, fsync_file
from rlm.logdir.index_sets import SET_SUFFIXES, find_sets, mapped, set_bounds
from rlm.tiering.local.crash import crash_point
from rlm.tiering.local.statefiles import int_field, loads_or_none

__all__ = ["RemoteIndexFamily", "RemoteIndexSet", "RepairReport"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RepairReport:
    """What opening the active set had to fix (all zero on a clean open)."""

    truncated_bytes: int = 0
    rewrote_derived: bool = False
    error: str | None = None


class RemoteIndexSet:
    """One set: three files sharing ``base_offset``. Reads go through mmap; appends through
    :meth:`RemoteIndexFamily.append`, which owns rotation."""

    def __init__(self, directory: Path, base_offset: int, created_ms: int) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.created_ms = created_ms
        self._builder: RemoteIndexSetBuilder | None = None
        self._first: RemoteLogIndexEntry | None = None
        self._last: RemoteLogIndexEntry | None = None

    def path(self, suffix: str) -> Path:
        return self.directory / naming.segment_file_name(self.base_offset, suffix)

    @property
    def log_index_path(self) -> Path:
        return self.path(naming.REMOTE_LOG_INDEX)

    @property
    def size_bytes(self) -> int:
        """Bytes of the ``.remotelogindex``."""
        if self._builder is not None:
            return self._builder.log_index_size
        try:
            return self.log_index_path.stat().st_size
        except FileNotFoundError:
            return 0

    def _offset_index(self) -> OffsetIndex:
        raw = self.path(naming.REMOTE_OFFSET_INDEX).read_bytes()
        return OffsetIndex(self.base_offset, raw, preallocated=False)

    def _load_bounds(self) -> None:
        """Read the first and last entry from disk, once. Status and lookups ask from other threads
        while a pass writes: a set just created (:meth:`RemoteIndexFamily._new_set`, no file until
        its first entries) or hidden (its gate removed) reads as empty, never as an error."""
        if self._last is not None:
            return
        with mapped(self.log_index_path) as buf:
            try:
                offsets = self._offset_index()
            except FileNotFoundError:
                return
            bounds = set_bounds(offsets, buf)
            if bounds is not None:
                self._first, self._last = bounds[0].entry, bounds[1].entry

    @property
    def first_entry(self) -> RemoteLogIndexEntry | None:
        self._load_bounds()
        return self._first

    @property
    def last_entry(self) -> RemoteLogIndexEntry | None:
        self._load_bounds()
        return self._last

    def entries(self) -> list[DecodedEntry]:
        """Every entry, CRC-verified (strict: a bad entry raises naming the file)."""
        with mapped(self.log_index_path) as buf:
            try:
                return list(iter_entries(buf))
            except FormatError as err:
                raise err.in_file(self.log_index_path) from err

    # -- writing (active set only) ------------------------------------------------------------

    def tail_is_whole(self) -> bool:
        """Whether the last entry (found through the offset index) is CRC-valid and ends the
        ``.remotelogindex`` exactly: what any state but an interrupted append leaves. Reads two
        small pieces of the set, never all of it."""
        try:
            with mapped(self.log_index_path) as buf:
                bounds = set_bounds(self._offset_index(), buf)
                if bounds is None:
                    return False
                first, last = bounds[0].entry, bounds[1].entry
                whole = bounds[1].end_position == len(buf)
                del bounds
        except (OSError, FormatError, ValueError):
            return False
        if whole:
            self._first, self._last = first, last
        return whole

    def open_for_append(self, *, publish: bool = True) -> RepairReport:
        """Scan the ``.remotelogindex``, cut a torn/corrupt tail, make the derived files agree
        (``publish=False``: left to :meth:`publish`, the caller stages its changes)."""
        path = self.log_index_path
        with mapped(path) as buf:
            scan = scan_entries(buf)
            total = len(buf)
            if scan.error is not None:  # its traceback's frames hold views of the map (BufferError)
                traceback.clear_frames(scan.error.__traceback__)
        report = RepairReport()
        if scan.valid_length < total:
            log.warning(
                "repairing %s: truncating %d bytes at byte %d (%s)",
                path,
                total - scan.valid_length,
                scan.valid_length,
                scan.error,
            )
            with path.open("r+b") as fh:
                fh.truncate(scan.valid_length)
                os.fsync(fh.fileno())
            report = RepairReport(total - scan.valid_length, False, str(scan.error))
        with mapped(path) as buf:
            self._builder = RemoteIndexSetBuilder.from_log_index(buf, self.base_offset)
        self._first = scan.entries[0].entry if scan.entries else None
        self._last = scan.entries[-1].entry if scan.entries else None
        if publish and scan.entries and self.publish(only_changed=True):
            report = RepairReport(report.truncated_bytes, True, report.error)
        return report

    def publish(self, *, only_changed: bool = False) -> bool:
        """Write the derived files of the entries appended so far, each renamed into place, the
        ``.remoteoffsetindex`` last: it is the gate readers go by (rlm.logdir.index_sets.load_set),
        so they see the set as it was or as it is now, never a mix. Returns whether a file was
        written (``only_changed``: files already right are left alone)."""
        builder = self._builder
        if builder is None:  # sealed (closed) since its entries were written
            with mapped(self.log_index_path) as buf:
                builder = RemoteIndexSetBuilder.from_log_index(buf, self.base_offset)
        wrote = False
        for suffix, expected in (
            (naming.REMOTE_TIME_INDEX, builder.time_index_bytes()),
            (naming.REMOTE_OFFSET_INDEX, builder.offset_index_bytes()),
        ):
            target = self.path(suffix)
            if only_changed:
                try:
                    if target.read_bytes() == expected:
                        continue
                except FileNotFoundError:
                    pass
            atomic_write(target, expected)
            wrote = True
        return wrote

    def hide(self) -> None:
        """Remove the gate: readers stop seeing the set before its entries change in place."""
        self.path(naming.REMOTE_OFFSET_INDEX).unlink(missing_ok=True)

    def fits(self, entry: RemoteLogIndexEntry) -> bool:
        assert self._builder is not None
        return self._builder.fits(entry) and (self._builder.log_index_size + entry.encoded_size <= INT32_MAX)

    def append(self, entries: Sequence[RemoteLogIndexEntry], *, derived: bool = True) -> None:
        """Append entries (all must :meth:`fits`); durable when this returns. The derived files are
        appended after the entries, the gate (``.remoteoffsetindex``) last; ``derived=False``
        writes the entries only: readers see them once :meth:`publish` ran."""
        assert self._builder is not None, "open_for_append() first"
        parts = [self._builder.append(e) for e in entries]
        blobs = [(naming.REMOTE_LOG_INDEX, b"".join(p.log_index for p in parts))]
        if derived:
            blobs.append((naming.REMOTE_TIME_INDEX, b"".join(p.time_index for p in parts)))
            blobs.append((naming.REMOTE_OFFSET_INDEX, b"".join(p.offset_index for p in parts)))
        created = not self.log_index_path.exists()
        handles = []
        try:
            for suffix, blob in blobs:
                fh = self.path(suffix).open("ab")
                handles.append(fh)
                if suffix == naming.REMOTE_LOG_INDEX and parts:
                    # Crash tests: all entries but the last written, the last one torn mid-entry.
                    cut = len(blob) - max(1, len(parts[-1].log_index) // 2)
                    fh.write(blob[:cut])
                    fh.flush()
                    crash_point("mid_local_append")
                    blob = blob[cut:]
                fh.write(blob)
                fh.flush()
            crash_point("before_fsync")
            for fh in handles:
                os.fsync(fh.fileno())
        finally:
            for fh in handles:
                fh.close()
        if created:
            fsync_dir(self.directory)
        if self._first is None and entries:
            self._first = entries[0]
        if entries:
            self._last = entries[-1]

    def close(self) -> None:
        """Seal the set: it is complete and fsynced; drop the in-memory builder."""
        for suffix in SET_SUFFIXES:
            if self.path(suffix).exists():
                fsync_file(self.path(suffix))
        self._builder = None

    def delete(self) -> None:
        self.hide()  # the gate first: a reader never finds the set without its entries
        for suffix in (naming.REMOTE_TIME_INDEX, naming.REMOTE_LOG_INDEX):
            self.path(suffix).unlink(missing_ok=True)


class RemoteIndexFamily:
    """All remote index sets of one partition directory, oldest first.

    ``meta_path`` stores each set's creation time (for rotation by age across restarts).
    """

    def __init__(
        self,
        directory: Path,
        meta_path: Path,
        *,
        rotate_bytes: int,
        rotate_ms: int,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self.directory = directory
        self.meta_path = meta_path
        self.rotate_bytes = rotate_bytes
        self.rotate_ms = rotate_ms
        self._clock = clock_ms or (lambda: int(time.time() * 1000))
        self.sets: list[RemoteIndexSet] = []
        self.last_repair = RepairReport()
        self._active_unopened = False  # open_trusted(): the active set is opened on first append
        self._staged: list[RemoteIndexSet] | None = None  # staged(): sets whose gates wait

    # -- opening --------------------------------------------------------------------------------

    def _load_meta(self) -> dict[int, int]:
        try:
            doc = loads_or_none(self.meta_path.read_bytes())
        except FileNotFoundError:
            return {}
        # Unreadable entries are absent: that set's age restarts now (statefiles).
        return {
            int(k): v
            for k in (doc if isinstance(doc, dict) else {})
            if k.isascii() and k.isdigit() and len(k) <= 20 and (v := int_field(doc, k)) is not None
        }

    def _save_meta(self) -> None:
        self.meta_path.parent.mkdir(parents=True, exist_ok=True)
        doc = {str(s.base_offset): s.created_ms for s in self.sets}
        atomic_write(self.meta_path, json.dumps(doc).encode())

    def open_trusted(self) -> bool:
        """Find the sets without scanning the active one (a restart that trusts the local state,
        rlm.tiering.resume): True when every set has its three files and the active set's tail
        is whole (:meth:`RemoteIndexSet.tail_is_whole`); its append state is rebuilt on the first
        append. False changes nothing: :meth:`open` then finds and repairs what is wrong."""
        bases = find_sets(self.directory)
        if any(found != set(SET_SUFFIXES) for found in bases.values()):
            return False
        meta = self._load_meta()
        sets = [RemoteIndexSet(self.directory, base, meta.get(base, self._clock())) for base in sorted(bases)]
        if sets and not sets[-1].tail_is_whole():
            return False
        self.sets, self.last_repair, self._active_unopened = sets, RepairReport(), bool(sets)
        return True

    def open(self) -> RepairReport:
        """Find the sets, remove stray derived files, repair the active set."""
        self._active_unopened = False
        bases = find_sets(self.directory)
        meta = self._load_meta()
        self.sets = []
        for base in sorted(bases):
            index_set = RemoteIndexSet(self.directory, base, meta.get(base, self._clock()))
            if naming.REMOTE_LOG_INDEX not in bases[base] or index_set.size_bytes == 0:
                # Derived files without entries (a crash while a set was being created).
                index_set.delete()
                continue
            self.sets.append(index_set)
        for sealed in self.sets[:-1]:
            if not sealed.tail_is_whole():  # its gate lags its entries (a staged change cut short)
                sealed.open_for_append()
                sealed.close()
        self.last_repair = self.sets[-1].open_for_append() if self.sets else RepairReport()
        if self.sets and self.sets[-1].last_entry is None:
            self.sets.pop().delete()
            if self.sets:  # the previous set is active again: appends need its builder
                self.sets[-1].open_for_append()
        return self.last_repair

    # -- queries --------------------------------------------------------------------------------

    @property
    def active(self) -> RemoteIndexSet | None:
        return self.sets[-1] if self.sets else None

    @property
    def last_offset(self) -> int:
        """Highest offset indexed locally, -1 when nothing is."""
        for index_set in reversed(self.sets):
            last = index_set.last_entry
            if last is not None:
                return last.last_offset
        return -1

    @property
    def first_offset(self) -> int | None:
        for index_set in self.sets:
            first = index_set.first_entry
            if first is not None:
                return first.first_offset
        return None

    # -- writing --------------------------------------------------------------------------------

    @contextmanager
    def staged(self) -> Iterator[None]:
        """Stage the appends and truncations made inside: entries are written at once, but each
        changed set's derived files — its gate last — are renamed into place only when the block
        ends cleanly, oldest set first. Until then readers see every set as it was (a set cut
        back is hidden, never shown torn). A rebuild therefore publishes whole sets; a reader
        that finds fewer than the progress claims answers from the store (docs/read-path.md).
        A block that raises publishes nothing: :meth:`open` makes the gates agree again."""
        if self._staged is not None:
            yield
            return
        self._staged = []
        try:
            yield
            for index_set in self._staged:
                index_set.publish()
            if self._staged:
                fsync_dir(self.directory)
        finally:
            self._staged = None

    def _stage(self, index_set: RemoteIndexSet) -> bool:
        """Note ``index_set`` changed inside :meth:`staged`; False outside (publish now)."""
        if self._staged is None:
            return False
        if index_set not in self._staged:
            self._staged.append(index_set)
        return True

    def _must_rotate(self, active: RemoteIndexSet) -> bool:
        return active.size_bytes >= self.rotate_bytes or self._clock() - active.created_ms >= self.rotate_ms

    def _new_set(self, base_offset: int) -> RemoteIndexSet:
        if self.sets:
            self.sets[-1].close()
        index_set = RemoteIndexSet(self.directory, base_offset, self._clock())
        index_set.open_for_append()  # no file yet: the set appears with its first entries
        self.sets.append(index_set)
        self._save_meta()
        return index_set

    def append_segment(self, entries: Sequence[RemoteLogIndexEntry]) -> None:
        """Append one segment's entries, rotating before it (size/age) and before an overflow."""
        if not entries:
            return
        if self._active_unopened and self.sets:
            self._active_unopened = False
            self.last_repair = self.sets[-1].open_for_append()
        active = self.active
        if active is None or (active.size_bytes > 0 and self._must_rotate(active)):
            active = self._new_set(entries[0].first_offset)
        pending: list[RemoteLogIndexEntry] = []
        for entry in entries:
            if not active.fits(entry):
                active.append(pending, derived=not self._stage(active))
                pending = []
                active = self._new_set(entry.first_offset)
            pending.append(entry)
        active.append(pending, derived=not self._stage(active))

    def remove_below(self, offset: int) -> list[Path]:
        """Delete sets whose every entry ends below ``offset``; return the removed index paths."""
        removed: list[Path] = []
        keep: list[RemoteIndexSet] = []
        for index_set in self.sets:
            last = index_set.last_entry
            if last is not None and last.last_offset < offset:
                index_set.delete()
                removed.append(index_set.log_index_path)
            else:
                keep.append(index_set)
        if removed:
            fsync_dir(self.directory)
            self.sets = keep
            if self.sets and self.sets[-1]._builder is None:
                self.sets[-1].open_for_append()
            self._save_meta()
        return removed

    def truncate_after(self, offset: int) -> int:
        """Drop entries whose last offset > ``offset`` (local ahead of remote); return how many."""
        dropped = 0
        while self.sets:
            active = self.sets[-1]
            decoded = active.entries()
            keep = [d for d in decoded if d.entry.last_offset <= offset]
            if len(keep) == len(decoded):
                break
            dropped += len(decoded) - len(keep)
            if not keep:
                active.delete()
                self.sets.pop()
                continue
            active.hide()  # readers see the set whole or not at all, never cut short
            with active.log_index_path.open("r+b") as fh:
                fh.truncate(keep[-1].end_position)
                os.fsync(fh.fileno())
            active._builder = None
            active._last = None
            active.open_for_append(publish=not self._stage(active))
            break
        if self.sets and self.sets[-1]._builder is None:
            self.sets[-1].open_for_append()
        fsync_dir(self.directory)
        self._save_meta()
        return dropped

    def delete_all(self) -> None:
        for index_set in self.sets:
            index_set.delete()
        self.sets = []
        fsync_dir(self.directory)
        self._save_meta()
