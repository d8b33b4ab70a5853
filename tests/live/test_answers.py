"""The visibility comparison's judgement of offsets the broker deleted (tests/live/answers.py), on
made-up answers: no broker needed. The case of a loaded host's failure — rlm's log start below an
offset the broker deleted before rlm tiered it (a gap), answered OFFSET_OUT_OF_RANGE by both —
passes; rlm refusing an offset it had tiered still fails the comparison."""

from __future__ import annotations

import pytest

from tests.live.answers import EARLIEST, LATEST, OUT_OF_RANGE, Answers, Moment, fetch_differences
from tests.live.wire import UNCOMMITTED, Batch, Fetched, Listed

BROKER_START, HW, OFFSET = 1246, 1500, 1245  # the broker's log start, its HW, the offset asked
OUT = Fetched(OUT_OF_RANGE, -1, -1, -1, None, (), 0)
BATCH = Batch(1240, 1250, -1, False, False, b"")
SERVED = Fetched(0, HW, HW, 0, None, (BATCH,), 0)
EMPTY = Fetched(0, HW, HW, 0, None, (), 0)


def _moment(rlm_answer: Fetched, tiered: int, gaps: tuple[tuple[int, int], ...]) -> Moment:
    q = (OFFSET, UNCOMMITTED, 1)
    broker = Answers({q: OUT}, {(LATEST, UNCOMMITTED): Listed(0, HW, -1, 0)})
    broker.listed[(EARLIEST, UNCOMMITTED)] = Listed(0, BROKER_START, -1, 0)
    rlm = Answers({q: rlm_answer}, {(EARLIEST, UNCOMMITTED): Listed(0, 0, -1, -1)})
    return Moment(broker, rlm, tiered, gaps)


@pytest.mark.parametrize(
    ("rlm_answer", "tiered", "gaps", "wrong"),
    [
        (SERVED, 1300, (), False),  # tiered: served (rlm's remote tier, on purpose)
        (OUT, 1300, (), True),  # tiered, yet refused
        (EMPTY, 1300, (), True),  # tiered, yet no records
        (OUT, 1300, ((1201, 1245),), False),  # a gap: out of range as a broker answers it
        (SERVED, 1300, ((1201, 1245),), True),  # a gap never has records
        (OUT, 1200, (), False),  # deleted before rlm tiered it, the gap not recorded yet
        (SERVED, 1200, (), False),  # tiered after the question was asked
        (EMPTY, 1200, (), True),  # neither records nor out of range
    ],
)
def test_an_offset_the_broker_deleted_is_served_by_rlm_only_once_tiered_and_outside_its_gaps(
    rlm_answer: Fetched, tiered: int, gaps: tuple[tuple[int, int], ...], wrong: bool
) -> None:
    found = list(fetch_differences(_moment(rlm_answer, tiered, gaps)))
    assert bool(found) == wrong, found
