"""One authority for what a consumer may see (docs/visibility.md): the Kafka listener, the HTTP
readers, the jobs' planner and restore all answer from :class:`Visibility`, so they agree on every
bound at one moment — and no other module computes one.

The partition is a transactional log with a transaction left open in its tiered segments (the
layouts of tests/tiering/test_lso.py), so the last stable offset lies below the high watermark and
read_committed answers differ from read_uncommitted ones.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rlm.kafka import reads
from rlm.kafka.protocol import Codes
from rlm.logdir.discovery import list_segments, partition_dir
from rlm.storage.local import LocalBackend
from rlm.tiering.local import remote_view
from rlm.tiering.read import (
    EARLIEST,
    EARLIEST_LOCAL,
    LATEST,
    LATEST_TIERED,
    TieredReaders,
    chain_visibility,
)
from rlm.tiering.read.visibility import Isolation
from tests.tiering.helpers import REPO
from tests.tiering.test_lso import layout

SPECIALS = (LATEST, EARLIEST, EARLIEST_LOCAL, LATEST_TIERED)
ISOLATIONS: tuple[Isolation, ...] = ("read_uncommitted", "read_committed")


@pytest.mark.parametrize("keep", [0, 1, 2])
def test_every_surface_answers_from_one_visibility(tmp_path: Path, keep: int) -> None:
    lay = layout(tmp_path, keep, leave_open=True, snapshots=False)
    backend = LocalBackend(root=str(lay.store))
    readers = TieredReaders(lay.settings, backend)
    vis = readers.reader("txn", 0).visibility()
    lso = vis.last_stable_offset()
    end = vis.offsets.visible_end_offset
    assert lso is not None and end is not None and lso < end  # read_committed stops earlier

    for ts in SPECIALS:  # the Kafka listener's ListOffsets
        for isolation in ISOLATIONS:
            got = reads.list_offset(readers, "txn", 0, ts, isolation == "read_committed", version=9)
            assert got.error == Codes.NONE, (ts, isolation)
            assert got.offset == vis.special_offset(ts, isolation), (ts, isolation)
    assert vis.special_offset(LATEST, "read_committed") == lso

    reader = readers.reader("txn", 0)  # the HTTP API's and the CLI's lookups
    for ts in SPECIALS:
        found = reader.lookup_timestamp(ts)
        expected = vis.special_offset(ts)
        assert (found.offset if found.found else -1) == expected, ts

    start = vis.offsets.log_start_offset
    assert start is not None  # a read_committed Kafka fetch bounds itself by the same LSO
    fetched = reads.fetch_partition(readers, "txn", 0, start, 1 << 20, True, "k")
    assert (fetched.error, fetched.high_watermark, fetched.last_stable_offset) == (Codes.NONE, end, lso)

    part = partition_dir(lay.part.parent, "txn", 0)  # the planner and restore: the store's chain
    state = remote_view(lay.settings.tiering, part).state(backend, part)
    chain = chain_visibility(
        part, state.chain().links, list_segments(part), backend, state.protection, policy="rolled"
    )
    assert chain.offsets == vis.offsets
    assert chain.last_stable_offset() == lso


def _calls(tree: ast.AST, name: str, args: int | None = None) -> list[int]:
    """Lines calling ``name`` (a function or a method) with ``args`` positional arguments."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        if called == name and (args is None or len(node.args) == args):
            found.append(node.lineno)
    return found


#: What only the authority computes: (function or method, positional arguments or None for any).
COMPUTED_ONLY_THERE = {
    "PartitionOffsets": None,  # the offsets of a moment
    "delete_records_point": None,  # a DeleteRecords point from the checkpoints
    "broker_delete_point": None,  # ... or from the broker's live log start
    "visible_end": None,  # the high watermark or what is assumed without it
    "last_stable_offset": 1,  # PartitionTxns' replay (Visibility's own takes none)
}


def test_no_module_but_the_authority_computes_a_bound() -> None:
    authority = REPO / "rlm" / "tiering" / "read" / "visibility.py"
    found = []
    for path in sorted((REPO / "rlm").rglob("*.py")):
        if path == authority:
            continue
        tree = ast.parse(path.read_text())
        for name, args in COMPUTED_ONLY_THERE.items():
            found += [f"{path.relative_to(REPO)}:{line}: {name}" for line in _calls(tree, name, args)]
    assert not found, "computed outside rlm/tiering/read/visibility.py:\n" + "\n".join(found)


def test_no_reader_builds_a_progress_to_ask_for_offsets() -> None:
    """The jobs' planner and restore once built a fake daemon ``Progress`` to get a visible range;
    they ask :func:`chain_visibility` now."""
    for name in ("reading/plan.py", "restore/partitions.py", "tables/export_local.py", "tables/iceberg.py"):
        tree = ast.parse((REPO / "rlm" / "jobs" / name).read_text())
        assert not _calls(tree, "Progress"), name


def test_the_check_sees_a_bound_computed_elsewhere() -> None:
    tree = ast.parse("lso = txns.last_stable_offset(end)\nvis.last_stable_offset()\n")
    assert _calls(tree, "last_stable_offset", 1) == [1]
