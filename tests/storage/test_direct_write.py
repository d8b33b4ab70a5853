"""rlm.storage.direct_write and the local backend's ``direct_io``: the bytes are exact at every size
around the buffer and alignment edges, large objects leave nothing in the page cache (checked with
``mincore`` on a real file), and a file system refusing ``O_DIRECT`` gets the same bytes buffered."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import io
import mmap
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, cast

import pytest

from rlm.storage import direct_write
from rlm.storage.direct_write import ALIGN, BUFFER, copy_to_fd
from rlm.storage.filestream import FileStream
from rlm.storage.local import LocalBackend

SIZES = [0, 1, ALIGN - 1, ALIGN, BUFFER - 1, BUFFER, BUFFER + 1, BUFFER + ALIGN, 3 * BUFFER + 5]


class _ReadOnly(io.RawIOBase):
    """A stream with ``read`` only (no ``readinto``), returning fewer bytes than asked."""

    def __init__(self, data: bytes) -> None:
        self._data, self._pos = data, 0

    def read(self, size: int = -1) -> bytes:
        n = min(size if size >= 0 else len(self._data), 70_001)
        out = self._data[self._pos : self._pos + n]
        self._pos += len(out)
        return out

    readinto = None  # type: ignore[assignment]


def _streams(tmp: Path, data: bytes) -> dict[str, Callable[[], BinaryIO]]:
    src = tmp / "src"
    src.write_bytes(data)
    return {
        "bytes": lambda: io.BytesIO(data),
        "file": lambda: cast(BinaryIO, FileStream(src)),
        "read-only": lambda: cast(BinaryIO, _ReadOnly(data)),
    }


def _copy(stream: BinaryIO, path: Path, direct: bool) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        return copy_to_fd(stream, fd, direct=direct)
    finally:
        os.close(fd)


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("size", SIZES)
def test_every_size_and_stream_copies_exactly(tmp_path: Path, size: int, direct: bool) -> None:
    data = os.urandom(size)
    for name, make in _streams(tmp_path, data).items():
        out = tmp_path / f"out-{name}"
        with make() as stream:
            assert _copy(stream, out, direct) == size, name
        assert out.read_bytes() == data, name


def _resident_pages(path: Path) -> int:
    """Pages of ``path`` in the page cache (``mincore`` over a read-only shared map of it)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    size = path.stat().st_size
    vec = (ctypes.c_ubyte * -(-size // mmap.PAGESIZE))()
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        try:
            if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
        finally:
            libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size))
    finally:
        os.close(fd)
    return sum(b & 1 for b in vec)


def _refuses_direct(directory: Path) -> bool:
    try:
        fd = os.open(directory / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT)
    except OSError as e:
        return e.errno == errno.EINVAL
    os.close(fd)
    return False


def test_large_objects_bypass_the_page_cache_small_ones_do_not(tmp_path: Path) -> None:
    store = LocalBackend(root=str(tmp_path / "store"))
    big, small = os.urandom(4 * BUFFER + 123), os.urandom(BUFFER - 1)
    store.put("big", big)
    store.put("small", small)
    unbuffered = LocalBackend(root=str(tmp_path / "store"), direct_io=False)
    unbuffered.put("big-buffered", big)
    assert _resident_pages(tmp_path / "store" / "small") > 0
    assert _resident_pages(tmp_path / "store" / "big-buffered") > 0
    if _refuses_direct(tmp_path):  # this file system writes buffered: the bytes are what counts
        assert _resident_pages(tmp_path / "store" / "big") > 0
    else:
        assert _resident_pages(tmp_path / "store" / "big") == 0
    assert store.read("big") == big and store.read("small") == small


def test_a_refused_direct_write_is_redone_buffered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system accepting ``O_DIRECT`` at ``fcntl`` but refusing a write (EINVAL) still gets
    every byte, buffered from then on; only the direct writes were refused."""
    real_write = os.write
    refused: list[int] = []

    def write(fd: int, data: bytes | memoryview) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(len(data))
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(direct_write.os, "write", write)
    data = os.urandom(2 * BUFFER + 77)
    out = tmp_path / "out"
    assert _copy(io.BytesIO(data), out, True) == len(data)
    assert out.read_bytes() == data
    assert refused == [BUFFER]
