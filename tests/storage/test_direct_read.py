"""rlm.storage.direct_read and the local backend's reads with ``direct_io``: exact bytes for ranges
around every alignment edge and past the end, large ranges read without filling the page cache
(``mincore`` on a real file), small ones buffered, a file system refusing ``O_DIRECT`` read
buffered with the same bytes, and the aligned buffers reused within their bound."""

from __future__ import annotations

import errno
import mmap
import os
import random
from pathlib import Path
from typing import Any

import pytest

from rlm.storage import direct_read
from rlm.storage.direct_read import MIN_BYTES, read_direct
from rlm.storage.direct_write import ALIGN
from rlm.storage.local import LocalBackend
from tests.storage.test_direct_write import _refuses_direct, _resident_pages

MIB = 1 << 20
DATA = random.Random(35).randbytes(3 * MIB + 777)
RANGES = [
    (0, MIB),
    (1, MIB + 1),
    (ALIGN - 1, 2 * MIB + 3),
    (ALIGN, 2 * MIB),
    (5, len(DATA)),
    (MIB + 9, len(DATA) + 5000),  # past the end: clipped
    (len(DATA) - 3, len(DATA) + MIB),
    (len(DATA), len(DATA) + MIB),  # at the end: nothing
]


@pytest.mark.parametrize(("start", "end"), RANGES)
def test_every_range_reads_exactly(tmp_path: Path, start: int, end: int) -> None:
    path = tmp_path / "object"
    path.write_bytes(DATA)
    if _refuses_direct(tmp_path):
        pytest.fail(f"{tmp_path} refuses O_DIRECT: these tests need a file system that takes it")
    assert read_direct(path, start, end) == DATA[start:end]


def _backend(root: Path, **options: Any) -> LocalBackend:
    return LocalBackend(root=str(root), **options)


def test_large_ranges_are_read_past_the_page_cache_small_ones_are_not(tmp_path: Path) -> None:
    backend = _backend(tmp_path / "store")
    backend.put("seg/0.log", DATA)  # written direct: nothing of it in the page cache
    path = tmp_path / "store" / "seg" / "0.log"
    assert _resident_pages(path) == 0
    assert backend.read("seg/0.log", 7, 2 * MIB + 7) == DATA[7 : 2 * MIB + 7]
    assert _resident_pages(path) == 0
    assert backend.read("seg/0.log", 0, MIN_BYTES - 1) == DATA[: MIN_BYTES - 1]
    assert _resident_pages(path) > 0  # a small range is read buffered and stays cached
    off = _backend(tmp_path / "store", direct_io=False)
    assert off.read("seg/0.log", 3 * ALIGN, len(DATA)) == DATA[3 * ALIGN :]
    assert _resident_pages(path) >= (len(DATA) - 3 * ALIGN) // ALIGN  # direct_io = false: buffered


@pytest.mark.parametrize("where", ["open", "read"])
def test_a_refused_direct_read_is_read_buffered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    backend = _backend(tmp_path / "store")
    backend.put("seg/0.log", DATA)
    real_open, real_preadv = os.open, os.preadv
    refused: list[str] = []

    def open_(path: Any, flags: int, *args: Any) -> int:
        if where == "open" and flags & os.O_DIRECT:
            refused.append(where)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    def preadv(fd: int, buffers: Any, offset: int) -> int:
        if where == "read":
            refused.append(where)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_preadv(fd, buffers, offset)

    monkeypatch.setattr(direct_read.os, "open", open_)
    monkeypatch.setattr(direct_read.os, "preadv", preadv)
    assert read_direct(tmp_path / "store" / "seg" / "0.log", 0, 2 * MIB) is None
    assert backend.read("seg/0.log", 11, 3 * MIB) == DATA[11 : 3 * MIB]
    assert refused == [where, where]


def test_a_missing_object_is_not_found(tmp_path: Path) -> None:
    from rlm.errors import ObjectNotFoundError

    with pytest.raises(ObjectNotFoundError):
        _backend(tmp_path / "store").read("seg/none.log", 0, 2 * MIB)


def test_buffers_are_reused_within_their_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    small, large = tmp_path / "small", tmp_path / "large"
    small.write_bytes(DATA)
    large.write_bytes(random.Random(36).randbytes(direct_read.KEEP_BYTES + 3 * ALIGN))
    monkeypatch.setattr(direct_read, "_kept", [])
    maps: list[int] = []
    real_mmap = direct_read.mmap.mmap

    def counted(*args: Any) -> Any:
        maps.append(args[1])
        return real_mmap(*args)

    monkeypatch.setattr(direct_read.mmap, "mmap", counted)
    for start, end in RANGES:  # one buffer serves them all, each read exact (no earlier bytes)
        assert read_direct(small, start, end) == DATA[start:end]
    assert len(maps) == 1 and len(direct_read._kept) == 1
    big = large.read_bytes()
    assert read_direct(large, 5, len(big)) == big[5:]  # larger than KEEP_BYTES: mapped, not kept
    assert len(maps) == 2 and [len(b) for b in direct_read._kept] == [direct_read.KEEP_BYTES]
    with direct_read._aligned(MIB) as a, direct_read._aligned(MIB) as b, direct_read._aligned(MIB) as c:
        assert len({id(a.obj), id(b.obj), id(c.obj)}) == 3  # concurrent reads: a buffer each
    assert len(direct_read._kept) == direct_read.KEPT
    assert all(not b.closed for b in direct_read._kept)


@pytest.mark.parametrize("interpreter_api", [True, False])
def test_copy_out_is_the_slice_and_leaves_the_buffer_free(
    monkeypatch: pytest.MonkeyPatch, interpreter_api: bool
) -> None:
    """The copy out of the read's buffer (made without the GIL where CPython's C API is there,
    else as ``bytes``): the exact slice, a ``bytes`` of its own, and no export of the mapping left
    behind (a mapping with views cannot be closed or reused)."""
    if not interpreter_api:
        monkeypatch.setattr(direct_read, "_BYTES_API", None)
    buf = mmap.mmap(-1, 2 * MIB)
    buf[: len(DATA[: 2 * MIB])] = DATA[: 2 * MIB]
    view = memoryview(buf)
    for lo, hi in [(0, 2 * MIB), (1, MIB + 3), (ALIGN - 1, ALIGN + 1), (7, 7), (2 * MIB, 2 * MIB)]:
        got = direct_read.copy_out(view, lo, hi)
        assert type(got) is bytes and got == DATA[lo:hi]
    copied = direct_read.copy_out(view, 0, 16)
    buf[:16] = bytes(16)  # the buffer is reused by the next read: the copy must not change
    assert copied == DATA[:16]
    for lo, hi in [(-1, 5), (5, 4), (0, 2 * MIB + 1)]:
        with pytest.raises(ValueError, match="not within"):
            direct_read.copy_out(view, lo, hi)
    view.release()
    buf.close()  # BufferError if a copy had left an export of it
