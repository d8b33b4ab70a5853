"""Broker ``.index`` / ``.timeindex`` files are checked before rlm uses or uploads them, and a
failed one is rebuilt from the ``.log`` the way Kafka's ``LogSegment.recover`` does
(docs/broker-files.md).

* :func:`parse_checked` parses an index and applies Kafka's ``sanityCheck`` plus the structural
  checks of :mod:`rlm.formats.indexes.offset_index` / :mod:`rlm.formats.indexes.time_index`; with
  the segment's batches it also applies :func:`rlm.formats.indexes.segment_index.check_offset_index` /
  :func:`~rlm.formats.indexes.segment_index.check_time_index`.
* :func:`note_rebuilt` is the one place a rebuild is reported: a warning naming the file and the
  reason, logged once per file version (device, inode, size, mtime), and a per-partition count
  that :class:`rlm.tiering.local.metrics.TieringMetrics` exports as ``rlm_local_index_rebuilds_total``.
* :func:`read_index_file` reads a broker index file up to the end of its written part: Kafka
  preallocates the active segment's indexes (``segment.index.bytes``, 10 MiB) as sparse files.
* :func:`cached_rebuild` keeps the rebuilt bytes of recently broken files (bounded LRU keyed by
  the file versions of the index and its ``.log``), so lookups do not rebuild on every open.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal, TypeAlias

from rlm.errors import RlmError
from rlm.formats.indexes.offset_index import OffsetIndex
from rlm.formats.indexes.segment_index import check_offset_index, check_time_index
from rlm.formats.indexes.time_index import TimeIndex
from rlm.formats.records import RecordBatch

__all__ = [
    "FileVersion",
    "IndexKind",
    "cached_rebuild",
    "file_version",
    "fstat_version",
    "note_rebuilt",
    "parse_checked",
    "read_index_file",
    "rebuild_counts",
]

log = logging.getLogger(__name__)

IndexKind: TypeAlias = Literal["index", "timeindex"]
#: (device, inode, size, mtime in ns): a broker replaces or rewrites a file → a new version.
FileVersion: TypeAlias = tuple[int, int, int, int]

_CACHE_ENTRIES = 64  # rebuilt index images kept; each is ~size/4096 * 12 bytes of a segment

_lock = threading.Lock()
_noted: OrderedDict[tuple[str, FileVersion | None], None] = OrderedDict()
_counts: dict[tuple[str, int, str], int] = {}
_rebuilt: OrderedDict[tuple[object, ...], bytes] = OrderedDict()


def file_version(path: Path | None) -> FileVersion | None:
    """The version of ``path`` (None when absent)."""
    if path is None:
        return None
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def read_index_file(path: Path | None, entry_size: int) -> bytes:
    """The bytes of a broker index file whose entries are ``entry_size`` bytes; ``b""`` when there
    is none (absent, vanished, empty).

    Kafka preallocates the active segment's ``.index``/``.timeindex`` (``segment.index.bytes``,
    10 MiB) with ``setLength`` — a sparse file — and writes entries from the front. Only the part
    up to the end of the file's last data region is read, rounded up to whole entries: the rest is
    a hole, all zeros, which the parser strips as Kafka's zero tail anyway. Without that, every
    read near the end of a log (a consumer at the tail, a timestamp lookup, ListOffsets -3) read
    and scanned 20 MiB. A length that is not a multiple of ``entry_size`` is read whole, so the
    check reports it as before; a file system that cannot tell holes (no ``SEEK_DATA``) too.
    """
    if path is None:
        return b""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            used = size if size % entry_size else _data_end(fh.fileno(), size)
            used = min(size, -(-used // entry_size) * entry_size)
            fh.seek(0)
            return fh.read(used)
    except FileNotFoundError:
        return b""


def _data_end(fd: int, size: int) -> int:
    """Where the last data region of the open file ``fd`` ends (bytes); ``size`` when the file
    system does not report holes."""
    end = pos = 0
    try:
        while pos < size:
            pos = os.lseek(fd, os.lseek(fd, pos, os.SEEK_DATA), os.SEEK_HOLE)
            end = pos
    except OSError as err:
        if err.errno != errno.ENXIO:  # ENXIO: no data after pos
            return size
    return end


def parse_checked(
    kind: IndexKind, base_offset: int, raw: bytes, batches: Sequence[RecordBatch] | None = None
) -> OffsetIndex | TimeIndex:
    """Parse ``raw`` (a broker file, zero tail allowed) and check it; with ``batches`` (every batch
    of the segment) check it against the ``.log`` too. Raises :class:`rlm.errors.CorruptIndexError`."""
    if kind == "index":
        offsets = OffsetIndex(base_offset, raw)
        if batches is not None:
            check_offset_index(offsets, batches)
        return offsets
    times = TimeIndex(base_offset, raw)
    if batches is not None:
        check_time_index(times, batches)
    return times


def _counted_as(path: Path) -> tuple[str, int, str] | None:
    """(topic, partition, ``index``/``timeindex``) of a broker index file path."""
    topic, _, number = path.parent.name.rpartition("-")
    kind = path.suffix.lstrip(".")
    return (topic, int(number), kind) if topic and number.isdigit() else None


def note_rebuilt(path: Path, err: RlmError, version: FileVersion | None) -> None:
    """Report that the broker file ``path`` (version ``version``) failed ``err`` and was rebuilt:
    once per version, a warning naming the file, byte and reason, and one more in the count."""
    key = (str(path), version)
    with _lock:
        if key in _noted:
            return
        _noted[key] = None
        while len(_noted) > 4096:
            _noted.popitem(last=False)
        counted = _counted_as(path)
        if counted is not None:
            _counts[counted] = _counts.get(counted, 0) + 1
    log.warning("%s; rebuilding it from the .log (rlm uses and uploads the rebuilt index)", err.in_file(path))


def rebuild_counts() -> dict[tuple[str, int, str], int]:
    """Broken broker index file versions found so far in this process, per (topic, partition,
    ``index``/``timeindex``)."""
    with _lock:
        return dict(_counts)


def cached_rebuild(key: tuple[object, ...], build: Callable[[], bytes]) -> bytes:
    """The rebuilt bytes for ``key`` (file versions + parameters), built at most once while cached."""
    with _lock:
        hit = _rebuilt.get(key)
        if hit is not None:
            _rebuilt.move_to_end(key)
            return hit
    data = build()
    with _lock:
        _rebuilt[key] = data
        while len(_rebuilt) > _CACHE_ENTRIES:
            _rebuilt.popitem(last=False)
    return data


def fstat_version(fd: int) -> FileVersion:
    """The version of an open file."""
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
