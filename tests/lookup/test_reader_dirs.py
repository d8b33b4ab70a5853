"""A reader service finds a partition's directory on every request without reading its
``partition.metadata`` again while the file is unchanged (rlm/tiering/read/readers.py,
logdir.known_partition_dir): a new topic id, a file that appears or a directory that vanishes is
seen by the next request."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from rlm.errors import PartitionNotFoundError
from rlm.storage.local import LocalBackend
from rlm.tiering.converge.identity import DIR_MARKER, read_dir_token
from rlm.tiering.read.readers import TieredReaders
from tests.logdir.test_discovery import ID_A, ID_B, _write_topic_id
from tests.lookup.helpers import settings_for, write_generated


def test_each_request_sees_the_partition_directory_as_it_is_now(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_generated(logs, "t", 0, batches=5, seed=1)
    readers = TieredReaders(settings_for([logs]), LocalBackend(root=str(tmp_path / "store")))
    part = logs / "t-0"
    assert readers.reader("t", 0).part.topic_id is None  # no file: a name-only identity
    old = time.time_ns() - 10**9  # settled: kept under its signature from now on
    _write_topic_id(part, ID_A, old)
    first = readers.reader("t", 0).part
    assert first.topic_id == ID_A and first.path == part and first.log_dir == logs
    assert readers.reader("t", 0).part is first  # kept
    _write_topic_id(part, ID_B, old + 1)  # re-created: the same size, only the signature tells
    assert readers.reader("t", 0).part.topic_id == ID_B
    (part / "partition.metadata").write_text("not a partition.metadata\n")
    assert readers.reader("t", 0).part.identity_error is not None
    shutil.rmtree(part)
    with pytest.raises(PartitionNotFoundError):
        readers.reader("t", 0)


def test_the_directory_token_is_the_marker_as_it_is_now(tmp_path: Path) -> None:
    """served_progress asks every Fetch for the directory's token (its marker's path is kept)."""
    part = tmp_path / "t-0"
    part.mkdir()
    assert read_dir_token(part) is None
    old = time.time_ns() - 10**9  # settled: kept under its signature
    for n, token in enumerate(["aaaa", "bbbb"]):
        (part / DIR_MARKER).write_text(token)
        os.utime(part / DIR_MARKER, ns=(old + n, old + n))
        assert read_dir_token(part) == read_dir_token(part) == token
        shutil.rmtree(part)  # the directory deleted and created again: a new marker
        part.mkdir()
    assert read_dir_token(part) is None
