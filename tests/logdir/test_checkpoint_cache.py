"""The checkpoint cache (rlm/logdir/checkpoint_cache.py) never keeps a parse that a same-signature
successor could hide: a broker's rename can reuse the freed inode, keep the size and land in the
same timestamp tick."""

from __future__ import annotations

import os
import time
from pathlib import Path

from rlm.formats.checkpoint import format_offset_checkpoint
from rlm.fsutil import SETTLE_NS
from rlm.logdir.checkpoint_cache import CheckpointCache
from rlm.logdir.discovery import REPLICATION_OFFSET_CHECKPOINT
from rlm.logdir.segment import log_end_offset


def _write_hw(log_dir: Path, hw: int, mtime_ns: int) -> Path:
    path = log_dir / REPLICATION_OFFSET_CHECKPOINT
    path.write_text(format_offset_checkpoint({("orders", 0): hw}))  # in place: same inode
    os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


def test_a_fresh_checkpoint_is_not_cached_so_a_same_signature_successor_is_read(tmp_path: Path) -> None:
    cache = CheckpointCache()
    now = time.time_ns()
    _write_hw(tmp_path, 100, now)
    assert cache.get(tmp_path).high_watermarks[("orders", 0)] == 100
    _write_hw(tmp_path, 200, now)  # same inode, size and mtime: the stat signature cannot tell
    assert cache.get(tmp_path).high_watermarks[("orders", 0)] == 200


def test_a_hint_takes_an_unsettled_parse_only_within_the_settle_window(tmp_path: Path) -> None:
    """The idle fingerprint asks for a hint: while the files keep their signature, a parse of
    files that had not settled serves it until SETTLE_NS after their mtime (not a parse per
    partition pass), then the file is read again; strict callers never take that parse."""
    cache = CheckpointCache()
    later = time.time_ns() + 60 * 10**9  # unsettled for a minute: no slow host ends the window early
    _write_hw(tmp_path, 100, later)
    first = cache.get(tmp_path, hint=True)
    assert cache.get(tmp_path, hint=True) is first  # the same moment: no second parse
    _write_hw(tmp_path, 200, later)  # a same-signature successor
    assert cache.get(tmp_path).high_watermarks[("orders", 0)] == 200  # strict: read again
    cache = CheckpointCache()
    soon = time.time_ns() + 2 * 10**9  # unsettled for 2 s, then the window ends
    _write_hw(tmp_path, 300, soon)
    assert cache.get(tmp_path, hint=True).high_watermarks[("orders", 0)] == 300
    _write_hw(tmp_path, 400, soon)
    while time.time_ns() < soon + SETTLE_NS:
        time.sleep(0.1)
    assert cache.get(tmp_path, hint=True).high_watermarks[("orders", 0)] == 400  # window over


def test_a_settled_checkpoint_is_cached_until_it_changes(tmp_path: Path) -> None:
    cache = CheckpointCache()
    old = time.time_ns() - 10 * SETTLE_NS
    path = _write_hw(tmp_path, 100, old)
    first = cache.get(tmp_path)
    assert cache.get(tmp_path) is first  # kept: no re-parse
    _write_hw(tmp_path, 300, old + 1)
    assert cache.get(tmp_path).high_watermarks[("orders", 0)] == 300
    assert path.exists()


def test_log_end_offset_of_a_segment_rewritten_in_the_same_tick(tmp_path: Path) -> None:
    from rlm.formats.records import RecordSpec, build_batch
    from rlm.logdir.discovery import SegmentFiles

    log = tmp_path / "00000000000000000000.log"
    one = build_batch([RecordSpec(1, b"k", b"v")], base_offset=0)
    two = build_batch([RecordSpec(1, b"k", b"v")], base_offset=5)  # same size, other offset
    assert len(one) == len(two)
    now = time.time_ns()
    log.write_bytes(one)
    os.utime(log, ns=(now, now))
    files = SegmentFiles(base_offset=0, log=log, size=len(one))
    assert log_end_offset([files]) == 1
    log.write_bytes(two)
    os.utime(log, ns=(now, now))
    assert log_end_offset([files]) == 6


def _replace_hw(log_dir: Path, hw: int, mtime_ns: int) -> None:
    """As a broker does: a temp file renamed over the checkpoint (a new inode)."""
    tmp = log_dir / (REPLICATION_OFFSET_CHECKPOINT + ".tmp")
    tmp.write_text(format_offset_checkpoint({("orders", 0): hw}))
    os.utime(tmp, ns=(mtime_ns, mtime_ns))
    os.replace(tmp, log_dir / REPLICATION_OFFSET_CHECKPOINT)


def test_a_rewrite_with_the_same_content_is_not_parsed_again_and_a_new_content_is(tmp_path: Path) -> None:
    """An idle broker rewrites the same high watermarks every 5 s: the entries parsed before are
    kept (the same object), while a rewrite with other values is parsed."""
    cache = CheckpointCache()
    old = time.time_ns() - 10 * SETTLE_NS
    _replace_hw(tmp_path, 100, old)
    first = cache.get(tmp_path).high_watermarks
    _replace_hw(tmp_path, 100, old + 1)  # a new signature, the same content
    assert cache.get(tmp_path).high_watermarks is first
    _replace_hw(tmp_path, 101, old + 2)  # the same size, another value
    assert cache.get(tmp_path).high_watermarks == {("orders", 0): 101}


def test_a_hint_sees_a_change_once_its_restat_window_is_over(tmp_path: Path) -> None:
    """A hint is served without a stat for HINT_RESTAT_NS only, far less than the settle window
    that bounds how stale a hint may be: past it, the change is seen."""
    cache = CheckpointCache()
    old = time.time_ns() - 10 * SETTLE_NS
    _replace_hw(tmp_path, 100, old)
    assert cache.get(tmp_path, hint=True).high_watermarks[("orders", 0)] == 100
    _replace_hw(tmp_path, 200, old + 1)
    time.sleep(SETTLE_NS / 1e9)
    assert cache.get(tmp_path, hint=True).high_watermarks[("orders", 0)] == 200
    assert cache.get(tmp_path).high_watermarks[("orders", 0)] == 200  # strict: never the window
