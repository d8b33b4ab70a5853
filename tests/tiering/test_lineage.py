"""The chain of served offsets (rlm/tiering/store/lineage.py): Kafka's epoch rule, overlaps, markers."""

from __future__ import annotations

import itertools

import pytest

from rlm.errors import FormatError
from rlm.tiering.store.lineage import (
    LineageMarker,
    epoch_end,
    epoch_ranges,
    first_diverged,
    replica_diverged,
    resolve_chain,
)
from rlm.tiering.store.manifest import SegmentManifest, StoredObject


def manifest(
    base: int,
    last: int,
    epochs: tuple[tuple[int, int], ...] = ((0, 0),),
    *,
    attempt: str = "a",
    created: int = 0,
) -> SegmentManifest:
    obj = StoredObject(f"t-0/data/{base:020d}-{attempt}/segment.log", 100, 1)
    return SegmentManifest("t", 0, base, last, 0, 0, 100, 1, 1, attempt, created, {"log": obj}, epochs)


def test_epoch_end_is_kafkas_end_offset_for() -> None:
    lineage = ((0, 0), (2, 500), (5, 900))
    assert epoch_end(lineage, 0) == 500
    assert epoch_end(lineage, 1) == 500  # an epoch this lineage never had ends where the next one starts
    assert epoch_end(lineage, 2) == 900
    assert epoch_end(lineage, 5) is None and epoch_end(lineage, 7) is None  # not judged: newer or current


def test_epoch_ranges_split_a_manifest_by_its_epochs() -> None:
    m = manifest(100, 299, ((0, 40), (1, 150), (3, 250)))
    assert epoch_ranges(m) == [(0, 100, 149), (1, 150, 249), (3, 250, 299)]
    assert epoch_ranges(manifest(0, 9, ())) == []


def test_first_diverged_finds_the_first_contradicted_offset() -> None:
    tiered = manifest(4000, 5500, ((0, 3000), (1, 5073)))  # old leader: epoch 1 from 5073
    assert first_diverged(tiered, ((0, 0), (2, 5073))) == 5073  # unclean election: epoch 1 never happened
    assert first_diverged(tiered, ((0, 0), (2, 5200))) == 5073  # epoch 0 ended at 5200, epoch 1 not there
    assert first_diverged(tiered, ((0, 0), (1, 5073), (2, 6000))) is None  # a clean change later
    assert first_diverged(tiered, ((0, 0), (1, 5073))) is None
    # Kafka truncates the cache from the start, moving the first entry up: that never cuts valid data
    assert first_diverged(tiered, ((1, 5100),)) is None
    assert first_diverged(manifest(0, 99, ()), ((5, 0),)) is None  # no epochs recorded: not judged


def test_replica_diverged_finds_where_a_replica_left_the_lineage() -> None:
    marker = ((0, 0), (2, 1200))  # an unclean election: epoch 2 from 1200 (epoch 1 had no data)
    # the old leader: epoch 0 ran on past 1200 on its own log (live: 2500 acks=1 writes)
    assert replica_diverged(((0, 0),), [marker]) == 1200
    assert replica_diverged(((0, 0), (1, 900)), [marker]) == 900  # an epoch the lineage never had
    # the new leader, a replica that rejoined (truncated, then fetched epoch 2) and one lagging
    # behind the election are on the lineage
    assert replica_diverged(marker, [marker]) is None
    assert replica_diverged(((0, 0), (2, 1200), (3, 4000)), [marker]) is None
    assert replica_diverged(((0, 0),), []) is None
    # a trimmed cache and the earliest of several cuts
    assert replica_diverged(((0, 0),), [((2, 1200),)]) == 1200
    assert replica_diverged(((0, 0), (1, 500)), [marker, ((0, 0), (1, 500), (4, 700))]) == 500


def test_divergence_cuts_a_tail_and_drops_wholly_diverged_segments() -> None:
    old = [
        manifest(0, 999, ((0, 0),)),
        manifest(1000, 1999, ((0, 0), (1, 1500))),
        manifest(2000, 2999, ((1, 1500),)),
    ]
    chain = resolve_chain(old, [((0, 0), (2, 1500))])
    assert [(lk.first_offset, lk.last_offset) for lk in chain.links] == [(0, 999), (1000, 1499)]
    assert [(m.base_offset, cut) for m, cut in chain.diverged] == [(2000, 2000)]
    assert chain.highest == 1499 and chain.first_diverged == 1500 and chain.start == 0
    # the new leader's own segment at the divergence point joins the chain
    chain = resolve_chain([*old[:2], manifest(1500, 2500, ((2, 1500),))], [((0, 0), (2, 1500))])
    assert [(lk.manifest.base_offset, lk.first_offset, lk.last_offset) for lk in chain.links] == [
        (0, 0, 999),
        (1000, 1000, 1499),
        (1500, 1500, 2500),
    ]
    # a stale old leader committing epoch-1 data after the marker is diverged too
    late = manifest(2501, 3000, ((1, 1500),), attempt="late")
    assert [m.base_offset for m, _ in resolve_chain([late], [((0, 0), (2, 1500))]).diverged] == [2501]


def test_overlap_keeps_the_lower_base_and_serves_the_rest_once() -> None:
    a = manifest(500, 1200, attempt="a")
    b = manifest(600, 1500, attempt="b")
    c = manifest(700, 1100, attempt="c")
    for perm in itertools.permutations([a, b, c]):
        chain = resolve_chain(perm)
        assert [(lk.manifest.attempt_id, lk.first_offset, lk.last_offset) for lk in chain.links] == [
            ("a", 500, 1200),
            ("b", 1201, 1500),
        ]
        assert [m.attempt_id for m in chain.superseded] == ["c"]
    assert resolve_chain([a]).links[0].whole
    assert resolve_chain([a, b]).links[1].whole is False


def test_gaps_are_kept_and_served_offsets_never_overlap() -> None:
    ms = [manifest(0, 99), manifest(150, 199), manifest(180, 260), manifest(200, 220)]
    chain = resolve_chain(ms)
    spans = [(lk.first_offset, lk.last_offset) for lk in chain.links]
    assert spans == [(0, 99), (150, 199), (200, 260)]
    assert chain.links[2].manifest.base_offset == 180
    assert [m.base_offset for m in chain.superseded] == [200]


def test_marker_round_trip_and_errors_name_the_key() -> None:
    marker = LineageMarker(7, ((0, 0), (7, 5073)), 5073, 2, 1234)
    assert LineageMarker.from_json(marker.to_json(), key="k") == marker
    for bad in (
        b"[]",
        b"{",
        b'{"epoch": "7", "diverged_from": 1, "written_ms": 1}',
        b'{"epoch": 7, "diverged_from": 1, "written_ms": 1, "node_id": true}',
        b'{"epoch": 7, "diverged_from": 1, "written_ms": 1, "lineage": [[1]]}',
    ):
        with pytest.raises(FormatError, match=r"^t-0/manifests/lineage-0000000007\.json: malformed"):
            LineageMarker.from_json(bad, key="t-0/manifests/lineage-0000000007.json")
