"""Reading a partition's local remote-index sets (docs/formats.md §5): the one reader of the
``<base>.remotelogindex`` / ``.remoteoffsetindex`` / ``.remotetimeindex`` files on disk.

Lookups (:class:`SetCache` → :class:`SetView`), the jobs' planner (:func:`read_local_entries`) and
the family that appends and repairs the sets (rlm/tiering/local/index_family.py: :func:`find_sets`,
:func:`mapped`, :func:`set_bounds`) all read through here. Everything here is read-only and
tolerant: the daemon may be appending, so a set is what its ``.remoteoffsetindex`` (the gate,
docs/formats.md §5.4) lists, up to its last whole 12-byte entry — entries appended after it, or a
torn tail, are simply not visible yet. :func:`views_of_entries` builds the same views in memory
from entries the store holds (rlm/tiering/read/served_sets.py).
"""

from __future__ import annotations

import mmap
import os
import threading
import traceback
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rlm.errors import RlmError
from rlm.formats import naming
from rlm.formats.indexes.offset_index import INT32_MAX, OffsetIndex
from rlm.formats.indexes.remote_index import DecodedEntry, RemoteLogIndexEntry, decode_entry, scan_entries
from rlm.formats.indexes.remote_index_derived import RemoteIndexSetBuilder, find_entry_for_offset
from rlm.formats.indexes.time_index import TimeIndex
from rlm.formats.records import Buffer
from rlm.logdir.segment_layout import layout_of

__all__ = [
    "SET_SUFFIXES",
    "SetCache",
    "SetView",
    "find_sets",
    "load_set",
    "mapped",
    "read_local_entries",
    "set_bounds",
    "view_of",
    "views_of_entries",
]

#: The three files of one set, by suffix: the entries (the source of truth) and the two derived.
SET_SUFFIXES = (naming.REMOTE_LOG_INDEX, naming.REMOTE_OFFSET_INDEX, naming.REMOTE_TIME_INDEX)
_SUFFIX_SET = frozenset(SET_SUFFIXES)


def find_sets(directory: Path, names: Iterable[str] | None = None) -> dict[int, set[str]]:
    """The sets in ``directory``: base offset → the suffixes of :data:`SET_SUFFIXES` present.
    Names whose base does not parse are not sets and are left out. ``names``: the directory's
    listing when the caller has one (rlm/logdir/discovery.py ``list_names``)."""
    if names is None:
        with os.scandir(directory) as it:
            names = [entry.name for entry in it]
    bases: dict[int, set[str]] = {}
    for name in names:  # a partition dir holds 3+ files per segment: one set lookup each
        dot = name.rfind(".")
        suffix = name[dot:] if dot >= 0 else ""
        if suffix in _SUFFIX_SET:
            try:
                base = naming.parse_base_offset(name)
            except RlmError:
                continue
            bases.setdefault(base, set()).add(suffix)
    return bases


@contextmanager
def mapped(path: Path) -> Iterator[bytes | mmap.mmap]:
    """Map a file read-only; an empty or missing file reads as ``b""``."""
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        yield b""
        return
    with fh:
        if fh.seek(0, 2) == 0:
            yield b""
            return
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            try:
                yield mm
            except BaseException as exc:
                # The failed decoder's frames hold memoryviews of the map: without this, closing it
                # raises BufferError, which replaces the real error.
                traceback.clear_frames(exc.__traceback__)
                raise


def set_bounds(offsets: OffsetIndex, log_index: Buffer) -> tuple[DecodedEntry, DecodedEntry] | None:
    """A set's first entry (at byte 0) and last (where the offset index's last entry points),
    decoded and CRC-checked without reading what lies between; None when either file is empty.
    Raises :class:`~rlm.errors.FormatError` for a bad entry at either place."""
    if len(offsets) == 0 or len(log_index) == 0:
        return None
    return decode_entry(log_index, 0), decode_entry(log_index, offsets[len(offsets) - 1].position)


def read_local_entries(directory: Path) -> list[RemoteLogIndexEntry]:
    """Every readable entry of the partition's ``.remotelogindex`` files, oldest set first; each
    set up to its first bad, torn or out-of-order entry (:func:`scan_entries`)."""
    out: list[RemoteLogIndexEntry] = []
    for base, suffixes in sorted(find_sets(directory).items()):
        if naming.REMOTE_LOG_INDEX not in suffixes:
            continue
        try:
            buf = (directory / naming.segment_file_name(base, naming.REMOTE_LOG_INDEX)).read_bytes()
        except FileNotFoundError:
            continue  # removed by retention meanwhile
        out.extend(d.entry for d in scan_entries(buf).entries)
    return out


#: Decoded entries a :class:`SetView` keeps (then it starts over: a bound, not an LRU). ~660 bytes
#: each: with a SetCache's 256 views at most ~11 MB. Consecutive Fetches reuse a few entries, so a
#: sequential reader loses one or two decodes each time it starts over.
_DECODED_PER_VIEW = 64


@dataclass
class SetView:
    """One set as a lookup reads it: both derived indexes and the entries' bytes, with the first
    and last entry decoded (None for a set with no whole entry yet).

    Its bytes never change (a set that changed is read into a new view), so the entries decoded
    from them are kept, up to :data:`_DECODED_PER_VIEW`: consecutive Fetches of a partition find
    and walk the same few entries, each decode a CRC check and several objects."""

    base_offset: int
    offsets: OffsetIndex
    times: TimeIndex
    log_index: bytes  # immutable: what it decodes to is kept
    first: DecodedEntry | None
    last: DecodedEntry | None
    _decoded: dict[int, DecodedEntry] = field(default_factory=dict, repr=False, compare=False)

    def entry_at(self, position: int) -> DecodedEntry:
        """The entry starting at byte ``position`` of :attr:`log_index` (:func:`decode_entry`:
        raises for bytes that are no entry, which are not kept)."""
        found = self._decoded.get(position)
        if found is None:
            found = decode_entry(self.log_index, position)
            if len(self._decoded) >= _DECODED_PER_VIEW:
                self._decoded.clear()
            self._decoded[position] = found  # racing threads store equal entries
        return found

    def _decode(self, buf: Buffer, position: int) -> DecodedEntry:
        assert buf is self.log_index
        return self.entry_at(position)

    def find_entry(self, offset: int) -> DecodedEntry | None:
        """:func:`find_entry_for_offset` in this set, decoding through :meth:`entry_at`."""
        return find_entry_for_offset(self.offsets, self.log_index, offset, self._decode)

    def entry_after(self, entry: DecodedEntry) -> DecodedEntry | None:
        if entry.end_position >= len(self.log_index):
            return None
        return self.entry_at(entry.end_position)

    def entries_from(self, entry: DecodedEntry) -> Iterator[DecodedEntry]:
        current: DecodedEntry | None = entry
        while current is not None:
            yield current
            current = self.entry_after(current)


def _read_or_empty(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


#: How often :func:`load_set` reads a set again that was republished while it read it.
_READ_TRIES = 3


def load_set(directory: Path, base: int) -> SetView | None:
    """The set at ``base`` as it is now; None when it has no indexed entry (yet, or any more), or
    it was republished every time it was read.

    The ``.remoteoffsetindex`` is the set's gate (docs/formats.md §5.4): the set holds exactly the
    entries it lists; it is read first and is the same file (inode) after the other two were read,
    so the three files are one version — a writer replacing a set removes or renames its gate.
    """
    gate = directory / naming.segment_file_name(base, naming.REMOTE_OFFSET_INDEX)
    for _ in range(_READ_TRIES):
        try:
            with gate.open("rb") as fh:
                inode = os.fstat(fh.fileno()).st_ino
                offsets_raw = fh.read()
        except FileNotFoundError:
            return None
        times_raw = _read_or_empty(directory / naming.segment_file_name(base, naming.REMOTE_TIME_INDEX))
        log_raw = _read_or_empty(directory / naming.segment_file_name(base, naming.REMOTE_LOG_INDEX))
        if _inode(gate) == inode:
            return view_of(base, offsets_raw, times_raw, log_raw)
    return None


def view_of(base: int, offsets_raw: bytes, times_raw: bytes, log_raw: bytes) -> SetView | None:
    """A set's view from its three files' bytes: the entries the offset index lists (entries
    appended after them are not the set's yet); None when it lists none."""
    # A concurrent append may have left partial trailing entries in any file: keep whole ones.
    offsets_raw = offsets_raw[: len(offsets_raw) - len(offsets_raw) % OffsetIndex.ENTRY_SIZE]
    times_raw = times_raw[: len(times_raw) - len(times_raw) % TimeIndex.ENTRY_SIZE]
    offsets = OffsetIndex(base, offsets_raw, preallocated=False)
    bounds = set_bounds(offsets, log_raw)
    if bounds is None:
        return None
    end = bounds[1].end_position
    if end < len(log_raw):
        log_raw = log_raw[:end]
    return SetView(base, offsets, TimeIndex(base, times_raw, preallocated=False), log_raw, *bounds)


def views_of_entries(entries: Iterable[RemoteLogIndexEntry]) -> list[SetView]:
    """Sets built in memory from ``entries`` (increasing offsets), as the family would write them:
    a new set whenever the next entry would overflow an int32 field of the current one."""
    built: list[tuple[RemoteIndexSetBuilder, list[bytes]]] = []
    for entry in entries:
        if not built or not _fits(built[-1][0], entry):
            built.append((RemoteIndexSetBuilder(entry.first_offset), []))
        builder, parts = built[-1]
        parts.append(builder.append(entry).log_index)
    views = [
        view_of(b.base_offset, b.offset_index_bytes(), b.time_index_bytes(), b"".join(parts))
        for b, parts in built
    ]
    return [v for v in views if v is not None]


def _fits(builder: RemoteIndexSetBuilder, entry: RemoteLogIndexEntry) -> bool:
    return builder.fits(entry) and builder.log_index_size + entry.encoded_size <= INT32_MAX


class SetCache:
    """Parsed sets keyed by their gate's (path, inode, size, mtime): a set that changed is parsed
    again. At most ``max_sets`` views (least recently used first out)."""

    def __init__(self, max_sets: int = 256) -> None:
        self._views: OrderedDict[tuple[str, int, int, int], SetView | None] = OrderedDict()
        self._lock = threading.Lock()
        self.max_sets = max_sets

    def sets(self, directory: Path, names: Iterable[str] | None = None) -> list[SetView]:
        """Every set of the partition ``directory`` with an indexed entry, oldest first
        (``names``: its listing, as :func:`find_sets`)."""
        root = os.fspath(directory)
        views = [self.get(directory, b, root) for b in self._gated(directory, names)]
        return [v for v in views if v is not None]

    def _gated(self, directory: Path, names: Iterable[str] | None) -> Iterable[int]:
        """The bases of the sets ``names`` list a gate of, in offset order: from the listing's
        layout, kept per exact listing with its segments (rlm/logdir/segment_layout.py)."""
        if names is None:
            found = find_sets(directory)
            return sorted(b for b, suffixes in found.items() if naming.REMOTE_OFFSET_INDEX in suffixes)
        return layout_of(directory, list(names)).set_gates

    def get(self, directory: Path, base: int, root: str | None = None) -> SetView | None:
        """The set at ``base`` (``root``: ``directory`` as a string, when the caller has it)."""
        path = os.path.join(
            os.fspath(directory) if root is None else root,
            naming.segment_file_name(base, naming.REMOTE_OFFSET_INDEX),
        )
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        # The inode tells a set published again (renamed into place) from the one it replaced.
        key = (path, st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            if key in self._views:
                self._views.move_to_end(key)
                return self._views[key]
        view = load_set(directory, base)
        with self._lock:
            self._views[key] = view
            while len(self._views) > self.max_sets:
                self._views.popitem(last=False)
        return view
