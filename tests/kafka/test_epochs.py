"""OffsetForLeaderEpoch's answer (rlm/kafka/epochs.py) against Kafka's endOffsetFor cases."""

from __future__ import annotations

from rlm.formats.checkpoint import EpochEntry
from rlm.kafka.epochs import UNDEFINED, end_offset_for

LINEAGE = [EpochEntry(2, 0), EpochEntry(5, 100), EpochEntry(7, 250)]


def test_the_latest_epoch_ends_at_the_log_end() -> None:
    assert end_offset_for(LINEAGE, 7, 400) == (7, 400)


def test_an_older_epoch_ends_where_the_next_higher_starts() -> None:
    assert end_offset_for(LINEAGE, 5, 400) == (5, 250)
    assert end_offset_for(LINEAGE, 2, 400) == (2, 100)


def test_an_unknown_epoch_between_entries_answers_the_floor_epoch() -> None:
    assert end_offset_for(LINEAGE, 6, 400) == (5, 250)
    assert end_offset_for(LINEAGE, 3, 400) == (2, 100)


def test_an_epoch_older_than_every_entry_ends_at_the_first_start() -> None:
    assert end_offset_for(LINEAGE, 1, 400) == (1, 0)


def test_undefined_for_minus_one_for_a_newer_epoch_and_for_no_lineage() -> None:
    assert end_offset_for(LINEAGE, -1, 400) == UNDEFINED
    assert end_offset_for(LINEAGE, 8, 400) == UNDEFINED
    assert end_offset_for([], 3, 400) == UNDEFINED
