"""A live broker's active segment has its ``.index`` and ``.timeindex`` preallocated: 10 MiB sparse
files (``segment.index.bytes``), entries written from the front. Beside a live Kafka (issue #29) a
consumer reading at the tail through rlm's listener cost ~350 ms per Fetch on 2 cores, and a
ListOffsets -3 ~500 ms: every open of the active segment read and scanned both files whole. The
reader now reads only the written part (rlm.logdir.indexcheck.read_index_file) and must parse
exactly the same entries as from the whole file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlm.formats.indexes.offset_index import OffsetIndex
from rlm.formats.indexes.time_index import TimeIndex
from rlm.formats.records import RecordSpec
from rlm.logdir.discovery import list_segments
from rlm.logdir.indexcheck import read_index_file
from rlm.logdir.segment import LogSegment
from rlm.logdir.writer import LogWriter

PREALLOCATED = 10 * 1024 * 1024  # Kafka's segment.index.bytes default


def _segment(tmp_path: Path) -> Path:
    """A partition whose one segment has a few dozen index entries (written by LogWriter)."""
    with LogWriter(tmp_path, "t", 0, index_interval_bytes=256) as w:
        for i in range(200):
            w.append([RecordSpec(1_700_000_000_000 + i, f"k{i}".encode(), os.urandom(100))])
    return tmp_path / "t-0"


def _preallocate(path: Path, size: int, *, sparse: bool) -> None:
    """Extend an index file as Kafka preallocates the active segment's: to ``size`` bytes of zeros
    after its entries, as a hole (``setLength``) or written out."""
    if sparse:
        os.truncate(path, size)
    else:
        with open(path, "ab") as f:
            f.write(bytes(size - path.stat().st_size))


def _entries(part: Path) -> tuple[list[object], list[object]]:
    (files,) = list_segments(part)
    with LogSegment.open(files) as seg:
        assert seg.offset_index is not None and seg.time_index is not None
        return list(seg.offset_index), list(seg.time_index)


@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "zeros-written"])
def test_a_preallocated_index_reads_the_same_entries(tmp_path: Path, sparse: bool) -> None:
    part = _segment(tmp_path)
    trimmed = _entries(part)
    assert len(trimmed[0]) > 10 and len(trimmed[1]) > 10
    (files,) = list_segments(part)
    assert files.index is not None and files.time_index is not None
    _preallocate(files.index, PREALLOCATED, sparse=sparse)
    _preallocate(files.time_index, PREALLOCATED - PREALLOCATED % TimeIndex.ENTRY_SIZE, sparse=sparse)
    assert _entries(part) == trimmed


def test_only_the_written_part_of_a_sparse_index_is_read(tmp_path: Path) -> None:
    part = _segment(tmp_path)
    (files,) = list_segments(part)
    assert files.index is not None and files.time_index is not None
    entries = files.index.stat().st_size
    _preallocate(files.index, PREALLOCATED, sparse=True)
    raw = read_index_file(files.index, OffsetIndex.ENTRY_SIZE)
    if os.stat(files.index).st_blocks * 512 >= PREALLOCATED:
        pytest.fail("this file system does not keep the preallocated tail sparse")
    assert entries <= len(raw) <= 64 * 1024, len(raw)  # the written blocks, not 10 MiB
    assert raw[:entries] == files.index.read_bytes()[:entries]


def test_a_partial_entry_is_still_reported(tmp_path: Path) -> None:
    """A length that is not a multiple of the entry size is read whole: the check still fails it
    (and the index is rebuilt), as before."""
    part = _segment(tmp_path)
    (files,) = list_segments(part)
    assert files.index is not None
    _preallocate(files.index, PREALLOCATED + 3, sparse=True)
    assert len(read_index_file(files.index, OffsetIndex.ENTRY_SIZE)) == PREALLOCATED + 3
    assert read_index_file(tmp_path / "absent.index", OffsetIndex.ENTRY_SIZE) == b""
