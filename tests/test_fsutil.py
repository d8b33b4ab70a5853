"""``FileMemo``: a small file parsed again only when its stat signature changed, and trusted only
once it had settled (a same-inode, same-size, same-mtime successor must never be missed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlm.fsutil import SETTLE_NS, FileMemo


def _counting(calls: list[Path]) -> FileMemo[bytes]:
    def parse(path: Path) -> bytes:
        calls.append(path)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return b"<missing>"

    return FileMemo(parse)


def _age(path: Path, ns: int = 2 * SETTLE_NS) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - ns))


def test_a_settled_file_is_parsed_once_until_it_changes(tmp_path: Path) -> None:
    calls: list[Path] = []
    memo, f = _counting(calls), tmp_path / "progress.json"
    f.write_bytes(b"one")
    _age(f)
    assert memo.get(f) == b"one" and memo.get(f) == b"one" and len(calls) == 1
    f.write_bytes(b"two!")  # another size: a new signature
    assert memo.get(f) == b"two!" and len(calls) == 2


def test_a_successor_with_the_same_signature_is_read_while_the_file_is_fresh(tmp_path: Path) -> None:
    calls: list[Path] = []
    memo, f = _counting(calls), tmp_path / "partition.metadata"
    f.write_bytes(b"aaa")
    mtime = f.stat().st_mtime_ns
    assert memo.get(f) == b"aaa"  # fresh: parsed, not remembered
    with f.open("r+b") as fh:  # same inode, same size ...
        fh.write(b"bbb")
    os.utime(f, ns=(mtime, mtime))  # ... and the same mtime tick
    assert memo.get(f) == b"bbb" and len(calls) == 2


def test_a_missing_file_is_parsed_every_time(tmp_path: Path) -> None:
    calls: list[Path] = []
    memo, f = _counting(calls), tmp_path / "absent"
    assert memo.get(f) == b"<missing>" and memo.get(f) == b"<missing>" and len(calls) == 2
    f.write_bytes(b"here")
    assert memo.get(f) == b"here"


def test_a_value_past_its_max_age_is_parsed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``max_age_s``: for a directory on a share whose client caches its attributes, the
    signature alone is not trusted for longer."""
    import rlm.fsutil as fsutil

    calls: list[Path] = []
    f = tmp_path / "root"
    f.write_bytes(b"one")
    _age(f)
    memo = FileMemo(lambda p: (calls.append(p), p.read_bytes())[1], max_age_s=1.0)
    clock = [100.0]
    monkeypatch.setattr(fsutil.time, "monotonic", lambda: clock[0])
    assert memo.get(f) == b"one" and memo.get(f) == b"one" and len(calls) == 1
    clock[0] += 0.99
    assert memo.get(f) == b"one" and len(calls) == 1
    clock[0] += 0.01
    assert memo.get(f) == b"one" and len(calls) == 2  # re-parsed, and kept again from now
    assert memo.get(f) == b"one" and len(calls) == 2
