"""The leader's idle note (docs/formats.md §6.9): what it says round-trips, a malformed or oversized
one is named (key and field) and never trusted, and what "covers" a follower's replica means."""

from __future__ import annotations

import pytest

from rlm.errors import FormatError
from rlm.storage.local import LocalBackend
from rlm.tiering.store import IdleNote, RemoteState
from rlm.tiering.store.manifest import MAX_MANIFEST_BYTES

NOTE = IdleNote(
    epoch=7, node_id=2, highest_offset=5072, high_watermark=5110, log_start_offset=10, written_ms=1
)


def test_a_note_round_trips_and_says_the_same_whenever_it_was_written() -> None:
    assert IdleNote.from_json(NOTE.to_json(), key="k") == NOTE
    later = IdleNote(7, 2, 5072, 5110, 10, written_ms=99)
    assert NOTE.says_same(later) and not NOTE.says_same(None)
    assert not NOTE.says_same(IdleNote(7, 2, 5073, 5110, 10, 1))


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            b'{"epoch": 7, "node_id": "2", "highest_offset": 1, "high_watermark": 1, '
            b'"log_start_offset": 0, "written_ms": 1}',
            "node_id",
        ),
        (
            b'{"epoch": 7, "node_id": 2, "highest_offset": 1, "high_watermark": true, '
            b'"log_start_offset": 0, "written_ms": 1}',
            "high_watermark",
        ),
        (
            b'{"epoch": 7, "node_id": 2, "highest_offset": 1, "high_watermark": 1, "written_ms": 1}',
            "log_start_offset",
        ),
        (b"[1, 2]", "not a JSON object"),
        (b"{" * 100_000, "malformed idle note"),
    ],
)
def test_a_malformed_note_names_its_key_and_field(body: bytes, field: str) -> None:
    with pytest.raises(FormatError, match="the-key") as err:
        IdleNote.from_json(body, key="the-key")
    assert field in str(err.value)


def test_an_oversized_note_is_refused_without_being_buffered(tmp_path: object) -> None:
    backend = LocalBackend(root=str(tmp_path))
    remote = RemoteState(backend, "t", 0)
    remote.write_idle_note(NOTE)
    key = next(iter(backend.list(""))).key
    assert remote.read_idle_note(key) == NOTE
    backend.put(key, b" " * (MAX_MANIFEST_BYTES + 1))
    with pytest.raises(FormatError, match="larger than"):
        remote.read_idle_note(key)


@pytest.mark.parametrize(
    ("leader", "epoch", "highest", "state", "covered"),
    [
        (2, 7, 5072, (5110, 10, 0), True),
        (2, 7, 5072, (5000, 0, 0), True),  # a follower behind the leader: nothing it lacks was committed
        (2, 7, 5072, (5111, 10, 0), False),  # its replica moved past the note: the leader may commit
        (2, 7, 5072, (5110, 11, 0), False),  # a DeleteRecords the leader has not applied yet
        (2, 7, 5071, (5110, 10, 0), False),  # the follower has not seen every commit the note counts
        (3, 7, 5072, (5110, 10, 0), False),  # another leader
        (2, 8, 5072, (5110, 10, 0), False),  # another epoch
        (2, 7, 5072, (None, 10, 0), False),  # no high watermark known
    ],
)
def test_what_a_note_covers(
    leader: int, epoch: int, highest: int, state: tuple[int | None, ...], covered: bool
) -> None:
    assert NOTE.covers(leader, epoch, highest, state) is covered
