from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlm.errors import CheckpointError, InvalidArgumentError
from rlm.formats.checkpoint import (
    EpochEntry,
    format_leader_epoch_checkpoint,
    format_offset_checkpoint,
    parse_leader_epoch_checkpoint,
    parse_offset_checkpoint,
)


def test_parse_offset_checkpoint() -> None:
    cp = parse_offset_checkpoint("0\n2\noms_order_created 3 95134\n__consumer_offsets 19 330479\n")
    assert cp.version == 0
    assert cp.entries == {("oms_order_created", 3): 95134, ("__consumer_offsets", 19): 330479}


def test_empty_file_has_no_entries() -> None:
    # Kafka writes an empty cleaner-offset-checkpoint; its reader returns no entries.
    assert parse_offset_checkpoint("").entries == {}
    assert parse_leader_epoch_checkpoint(b"").entries == []


def test_zero_entries_and_bytes_input() -> None:
    assert parse_offset_checkpoint(b"0\n0\n").entries == {}


def test_crlf_lines() -> None:
    assert parse_leader_epoch_checkpoint("0\r\n1\r\n3 7\r\n").entries == [EpochEntry(3, 7)]


def test_parse_leader_epoch_checkpoint() -> None:
    cp = parse_leader_epoch_checkpoint("0\n3\n10 81908\n12 91078\n14 94005\n")
    assert cp.entries == [EpochEntry(10, 81908), EpochEntry(12, 91078), EpochEntry(14, 94005)]


def test_unknown_version() -> None:
    with pytest.raises(CheckpointError, match=r"line 1: unsupported checkpoint version 1") as err:
        parse_offset_checkpoint("1\n0\n")
    assert err.value.position == 0
    with pytest.raises(CheckpointError, match="line 1"):
        parse_leader_epoch_checkpoint("x\n0\n")


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("0\n2\nt 0 5\n", "line 4: expected 2 entries but found only 1"),
        ("0\n1\nt 0 5\nt 1 6\n", "line 4: expected 1 entries but found more"),
        ("0\n", "line 2: missing entry count"),
        ("0\n-1\n", "line 2: entry count"),
        ("0\nabc\n", "line 2"),
    ],
)
def test_count_mismatch(text: str, line: str) -> None:
    with pytest.raises(CheckpointError, match=line):
        parse_offset_checkpoint(text)


@pytest.mark.parametrize(
    "entry_line",
    ["t 0", "t 0 5 9", "t x 5", "t 0 5.0", "t 0 +5", " t 0 5", "t 0 99999999999999999999", "t 0 ５"],
)
def test_malformed_offset_line(entry_line: str) -> None:
    text = f"0\n2\nt 1 1\n{entry_line}\n"
    with pytest.raises(CheckpointError, match="line 4: malformed") as err:
        parse_offset_checkpoint(text)
    assert err.value.position == len("0\n2\nt 1 1\n")


@pytest.mark.parametrize("entry_line", ["1", "1 2 3", "a 2", "2147483648 0"])
def test_malformed_epoch_line(entry_line: str) -> None:
    with pytest.raises(CheckpointError, match="line 3: malformed"):
        parse_leader_epoch_checkpoint(f"0\n1\n{entry_line}\n")


def test_format_matches_kafka_text() -> None:
    assert format_offset_checkpoint({("a.b-c", 3): 17, ("x", 0): 0}) == "0\n2\na.b-c 3 17\nx 0 0\n"
    assert format_offset_checkpoint({}) == "0\n0\n"
    assert format_leader_epoch_checkpoint([EpochEntry(10, 81908)]) == "0\n1\n10 81908\n"
    with pytest.raises(InvalidArgumentError):
        format_offset_checkpoint({("a b", 0): 1})


topics = st.text("abcXYZ019._-", min_size=1, max_size=20)


@given(st.dictionaries(st.tuples(topics, st.integers(0, 2**31 - 1)), st.integers(-1, 2**63 - 1), max_size=20))
def test_offset_round_trip(entries: dict[tuple[str, int], int]) -> None:
    assert parse_offset_checkpoint(format_offset_checkpoint(entries)).entries == entries


@given(st.lists(st.builds(EpochEntry, st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1)), max_size=20))
def test_epoch_round_trip(entries: list[EpochEntry]) -> None:
    assert parse_leader_epoch_checkpoint(format_leader_epoch_checkpoint(entries)).entries == entries
