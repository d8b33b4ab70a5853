"""A partition directory's listing is kept while the directory is unchanged (rlm/logdir/listing_cache.py):
a settled directory is listed once, its active segment's growth is still seen, and every change of
its entries (a roll, a retention rename, a vanished segment) is listed again. Directories are real;
"settled" is made by moving the directory's mtime back, as time would."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rlm.fsutil import SETTLE_NS
from rlm.logdir.listing_cache import ListingCache


def _segment(part: Path, base: int, size: int) -> Path:
    log = part / f"{base:020d}.log"
    log.write_bytes(b"x" * size)
    (part / f"{base:020d}.index").write_bytes(b"")
    return log


def _settle(part: Path, mtime_ns: int | None = None) -> int:
    """The directory's mtime moved back past the settle time (or to ``mtime_ns``); returns it."""
    then = mtime_ns if mtime_ns is not None else time.time_ns() - 2 * SETTLE_NS
    os.utime(part, ns=(then, then))
    return then


@pytest.fixture
def part(tmp_path: Path) -> Path:
    part = tmp_path / "orders-0"
    part.mkdir()
    _segment(part, 0, 100)
    _segment(part, 10, 40)
    return part


@pytest.fixture
def listed(part: Path, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times ``part`` was listed (one counter, read as ``listed[0]``)."""
    count = [0]
    real: Callable[..., Any] = os.listdir

    def counted(path: Any = ".") -> Any:
        if os.path.realpath(os.fspath(path)) == os.path.realpath(part):
            count[0] += 1
        return real(path)

    monkeypatch.setattr(os, "listdir", counted)
    return count


def _bases_and_sizes(cache: ListingCache, part: Path) -> list[tuple[int, int]]:
    return [(s.base_offset, s.size) for s in cache.get(part).segments]


def test_a_settled_directory_is_listed_once(part: Path, listed: list[int]) -> None:
    _settle(part)
    cache = ListingCache()
    first = cache.get(part)
    assert [s.base_offset for s in first.segments] == [0, 10]
    assert sorted(first.names) == sorted(os.listdir(part))
    listed[0] = 0
    for _ in range(3):
        assert cache.get(part) == first
    assert listed[0] == 0


def test_the_active_segment_grows_without_a_listing(part: Path, listed: list[int]) -> None:
    _settle(part)
    cache = ListingCache()
    assert _bases_and_sizes(cache, part) == [(0, 100), (10, 40)]
    with (part / f"{10:020d}.log").open("ab") as fh:  # an append: the directory is unchanged
        fh.write(b"y" * 25)
    listed[0] = 0
    assert _bases_and_sizes(cache, part) == [(0, 100), (10, 65)]
    assert listed[0] == 0


def test_a_roll_and_a_retention_rename_are_listed_again(part: Path, listed: list[int]) -> None:
    _settle(part)
    cache = ListingCache()
    cache.get(part)
    _segment(part, 20, 5)  # a roll
    assert _bases_and_sizes(cache, part) == [(0, 100), (10, 40), (20, 5)]
    _settle(part)
    cache.get(part)
    os.rename(part / f"{0:020d}.log", part / f"{0:020d}.log.deleted")  # retention
    listed[0] = 0
    assert _bases_and_sizes(cache, part) == [(10, 40), (20, 5)]
    assert listed[0] == 1


def test_an_unsettled_directory_is_listed_every_time(part: Path, listed: list[int]) -> None:
    os.utime(part)  # changed just now: the same timestamp tick may hold a change not yet listed
    cache = ListingCache()
    for _ in range(3):
        cache.get(part)
    assert listed[0] == 3


def test_a_vanished_active_segment_is_listed_again(part: Path, listed: list[int]) -> None:
    then = _settle(part)
    cache = ListingCache()
    cache.get(part)
    (part / f"{10:020d}.log").unlink()
    _settle(part, then)  # as if the change kept the old mtime: the stat of the active segment sees it
    listed[0] = 0
    assert _bases_and_sizes(cache, part) == [(0, 100)]
    assert listed[0] == 1


def test_a_vanished_directory_lists_nothing(part: Path, listed: list[int]) -> None:
    cache = ListingCache()
    _settle(part)
    cache.get(part)
    for child in part.iterdir():
        child.unlink()
    part.rmdir()
    assert cache.get(part).segments == []
