"""The layout of a partition directory's listing is kept per exact listing (rlm/logdir/segment_layout.py):
what list_segments answers never differs from a fresh listing's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlm.formats.naming import segment_file_name
from rlm.logdir import segment_layout
from rlm.logdir.discovery import list_segments


def _segment(part: Path, base: int, size: int = 10, *, companions: bool = True) -> None:
    (part / segment_file_name(base, ".log")).write_bytes(b"x" * size)
    if companions:
        (part / segment_file_name(base, ".index")).write_bytes(b"")
        (part / segment_file_name(base, ".timeindex")).write_bytes(b"")


@pytest.fixture
def part(tmp_path: Path) -> Path:
    d = tmp_path / "t-0"
    d.mkdir()
    for base in (0, 100, 200):
        _segment(d, base)
    return d


def test_the_same_listing_is_laid_out_once(part: Path) -> None:
    names = os.listdir(part)
    assert segment_layout.layout_of(part, names) is segment_layout.layout_of(part, list(names))


def test_a_rolled_segment_and_a_deleted_one_are_seen_at_once(part: Path) -> None:
    assert [s.base_offset for s in list_segments(part)] == [0, 100, 200]
    _segment(part, 300, companions=False)
    (part / segment_file_name(0, ".log")).rename(part / (segment_file_name(0, ".log") + ".deleted"))
    got = list_segments(part)
    assert [s.base_offset for s in got] == [100, 200, 300]
    assert got[-1].index is None and got[0].index == part / segment_file_name(100, ".index")


def test_a_companion_that_appears_is_attached(part: Path) -> None:
    _segment(part, 300, companions=False)
    assert list_segments(part)[-1].time_index is None
    (part / segment_file_name(300, ".timeindex")).write_bytes(b"")
    assert list_segments(part)[-1].time_index == part / segment_file_name(300, ".timeindex")


def test_sizes_are_read_on_every_listing(part: Path) -> None:
    assert list_segments(part)[-1].size == 10
    with open(part / segment_file_name(200, ".log"), "ab") as f:
        f.write(b"y" * 5)
    assert list_segments(part)[-1].size == 15
    # replaced under the same name (the cleaner's swap): the new file's size
    (part / "swap.tmp").write_bytes(b"z" * 3)
    os.replace(part / "swap.tmp", part / segment_file_name(100, ".log"))
    assert [s.size for s in list_segments(part)] == [10, 3, 15]


def test_a_log_gone_before_its_stat_is_skipped_even_when_the_layout_is_kept(part: Path) -> None:
    names = os.listdir(part)
    list_segments(part, names=names)
    (part / segment_file_name(100, ".log")).unlink()
    skipped: list[tuple[Path, str]] = []
    got = list_segments(part, names=names, on_skip=lambda p, why: skipped.append((p, why)))
    assert [s.base_offset for s in got] == [0, 200]
    assert skipped and skipped[0][0] == part / segment_file_name(100, ".log")


def test_a_name_without_a_base_offset_is_reported_on_every_listing(part: Path) -> None:
    (part / "junk.log").write_bytes(b"")
    skipped: list[Path] = []
    for _ in range(2):
        list_segments(part, on_skip=lambda p, why: skipped.append(p))
    assert skipped == [part / "junk.log"] * 2


def test_the_kept_layouts_are_bounded_by_segments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(segment_layout, "MAX_SEGMENTS_KEPT", 4)
    monkeypatch.setattr(segment_layout, "_kept", type(segment_layout._kept)())
    monkeypatch.setattr(segment_layout, "_kept_segments", 0)
    dirs = []
    for i in range(3):
        d = tmp_path / f"t-{i}"
        d.mkdir()
        _segment(d, 0)
        _segment(d, 100)
        dirs.append(d)
    first = segment_layout.layout_of(dirs[0], os.listdir(dirs[0]))
    for d in dirs[1:]:
        segment_layout.layout_of(d, os.listdir(d))
    assert segment_layout._kept_segments <= 4 and len(segment_layout._kept) == 2
    assert segment_layout.layout_of(dirs[0], os.listdir(dirs[0])) is not first  # dropped, laid out anew
    big = tmp_path / "t-big"
    big.mkdir()
    for base in range(0, 500, 100):
        _segment(big, base)
    segment_layout.layout_of(big, os.listdir(big))
    assert all(key[0] != str(big) for key in segment_layout._kept)  # more than the bound: not kept


def test_the_layout_names_the_set_gates_of_its_listing(part: Path) -> None:
    for base in (0, 100):
        (part / segment_file_name(base, ".remotelogindex")).write_bytes(b"")
    (part / segment_file_name(100, ".remoteoffsetindex")).write_bytes(b"")
    (part / "junk.remoteoffsetindex").write_bytes(b"")  # no base offset: no set
    assert segment_layout.layout_of(part, os.listdir(part)).set_gates == (100,)
    (part / segment_file_name(0, ".remoteoffsetindex")).write_bytes(b"")
    assert segment_layout.layout_of(part, os.listdir(part)).set_gates == (0, 100)


def test_a_listing_of_no_segment_counts_against_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(segment_layout, "MAX_SEGMENTS_KEPT", 3)
    monkeypatch.setattr(segment_layout, "_kept", type(segment_layout._kept)())
    monkeypatch.setattr(segment_layout, "_kept_segments", 0)
    for i in range(10):
        d = tmp_path / f"e-{i}"
        d.mkdir()
        segment_layout.layout_of(d, [])
    assert len(segment_layout._kept) == 3
