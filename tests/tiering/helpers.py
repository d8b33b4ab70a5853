"""Shared helpers of the tiering acceptance tests: the CLI as a subprocess, broker-like rolls and
partition copies, the local index files. The config writer and the store checker, which the benches
use too, are :mod:`rlm.testing.configs` and :mod:`rlm.testing.store_check`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from rlm.formats import naming
from rlm.formats.records import RecordSpec, iter_batches
from rlm.logdir.discovery import list_segments
from rlm.logdir.writer import LogWriter

REPO = Path(__file__).resolve().parents[2]


def roll_after_last(partition_dir: Path) -> int:
    """Add the empty next segment a broker roll leaves: ``<last offset + 1>.log``; return its base."""
    segments = list_segments(partition_dir)
    data = segments[-1].log.read_bytes()
    last = None
    for batch in iter_batches(data):
        last = batch
    assert last is not None, partition_dir
    base = last.last_offset + 1
    (partition_dir / naming.segment_file_name(base, naming.LOG)).write_bytes(b"")
    return base


def append_rolled(writers: Iterable[LogWriter], segments: int, ts: int, value_bytes: int) -> int:
    """Append ``segments`` rolled segments (5 batches of 4 random records of ``value_bytes`` each,
    timestamps 10 ms apart after ``ts``) to every partition and move its high watermark to the log
    end, as a broker does; return the last timestamp used."""
    for w in writers:
        for _ in range(segments):
            for _ in range(5):
                ts += 10
                w.append([RecordSpec(ts, f"k{i}".encode(), os.urandom(value_bytes)) for i in range(4)])
            w.roll()
        w.write_checkpoints()
    return ts


def copy_partition_as(log_dir: Path, source: str, target: str) -> Path:
    """Copy partition dir ``source`` of ``log_dir`` to ``target`` (another topic's name), with its
    entries in the log dir's offset checkpoints; e.g. a compacted internal log as a user topic."""
    src_topic, _, partition = source.rpartition("-")
    dst_topic, _, dst_partition = target.rpartition("-")
    assert partition == dst_partition, (source, target)
    shutil.copytree(log_dir / source, log_dir / target)
    for name in (
        "replication-offset-checkpoint",
        "recovery-point-offset-checkpoint",
        "log-start-offset-checkpoint",
    ):
        path = log_dir / name
        if not path.exists():
            continue
        lines = path.read_text().splitlines()
        if len(lines) < 2:
            continue
        copies = [
            f"{dst_topic} {rest}"
            for line in lines[2:]
            for topic, _, rest in [line.partition(" ")]
            if topic == src_topic and rest.split(" ")[0] == partition
        ]
        body = lines[2:] + copies
        path.write_text("\n".join([lines[0], str(len(body)), *body]) + "\n")
    return log_dir / target


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def local_index_files(log_dirs: list[Path]) -> dict[str, bytes]:
    """Every ``*.remote*`` file of the log dirs: relative path → bytes."""
    out = {}
    for d in log_dirs:
        for path in sorted(d.glob("*/*.remote*")):
            out[str(path.relative_to(d.parent))] = path.read_bytes()
    return out
