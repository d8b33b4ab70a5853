"""The fetch-session cache (rlm/kafka/sessions.py): Kafka's epochs, eviction and incremental
answer rules, on an injected clock."""

from __future__ import annotations

import pytest

from rlm.kafka import sessions
from rlm.kafka.protocol import Codes
from rlm.kafka.sessions import (
    EVICTION_MS,
    CachedPartition,
    FetchSessionCache,
    next_epoch,
    open_context,
)


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


def parts(n: int, topic: str = "t") -> list[tuple[tuple[str, int], CachedPartition]]:
    return [((topic, p), CachedPartition(0, 1 << 20)) for p in range(n)]


def test_epochs_wrap_to_one_never_to_zero_or_final() -> None:
    assert next_epoch(0) == 1 and next_epoch(41) == 42 and next_epoch(2**31 - 1) == 1


def test_a_session_starts_at_epoch_one_with_its_partitions_in_order() -> None:
    cache = FetchSessionCache(10, Clock(), seed=1)
    sid = cache.create(parts(3), uses_topic_ids=False)
    session = cache.get(sid)
    assert 0 < sid < 2**31 - 1 and session is not None and session.epoch == 1
    assert list(session.partitions) == [("t", 0), ("t", 1), ("t", 2)]


def test_no_sessions_when_the_cache_has_no_slots() -> None:
    assert FetchSessionCache(0, Clock()).create(parts(1), uses_topic_ids=False) == 0


def test_incremental_update_keeps_what_the_consumer_was_told_and_forgets() -> None:
    cache = FetchSessionCache(10, Clock())
    session = cache.get(cache.create(parts(2), uses_topic_ids=False))
    assert session is not None
    session.partitions[("t", 0)].must_respond(100, 90, 0, 0, records=False)
    session.update([(("t", 0), CachedPartition(50, 4096, 3)), (("t", 9), CachedPartition(7, 1))], [("t", 1)])
    p0 = session.partitions[("t", 0)]
    assert (p0.fetch_offset, p0.max_bytes, p0.current_leader_epoch, p0.high_watermark) == (50, 4096, 3, 100)
    assert list(session.partitions) == [("t", 0), ("t", 9)]


def test_must_respond_on_records_changes_and_errors_only() -> None:
    p = CachedPartition(0, 1)
    assert p.must_respond(10, 10, 0, 0, records=False)  # first answer: offsets not yet told
    assert not p.must_respond(10, 10, 0, 0, records=False)
    assert p.must_respond(10, 10, 0, 0, records=True)
    assert p.must_respond(11, 10, 0, 0, records=False)  # the high watermark moved
    assert p.must_respond(11, 10, 2, 0, records=False)  # the log start moved (DeleteRecords)
    assert p.must_respond(11, 10, 2, 6, records=False)  # an error
    assert p.must_respond(11, 10, 2, 0, records=False)  # and the offsets are told again after it


def test_answered_partitions_go_to_the_end() -> None:
    cache = FetchSessionCache(10, Clock())
    session = cache.get(cache.create(parts(3), uses_topic_ids=True))
    assert session is not None
    session.answered(("t", 0))
    assert list(session.partitions) == [("t", 1), ("t", 2), ("t", 0)]


def test_a_full_cache_evicts_a_stale_session_first() -> None:
    clock = Clock()
    cache = FetchSessionCache(2, clock)
    old = cache.create(parts(5), uses_topic_ids=False)
    clock.ms += 1000
    young = cache.create(parts(5), uses_topic_ids=False)
    clock.ms += EVICTION_MS  # old idle 121 s: stale; young idle 120 s: not yet
    new = cache.create(parts(1), uses_topic_ids=False)
    assert new and cache.get(old) is None and cache.get(young) is not None and cache.evictions == 1


def test_a_full_cache_without_stale_sessions_evicts_only_for_a_bigger_one() -> None:
    clock = Clock()
    cache = FetchSessionCache(2, clock)
    small, big = cache.create(parts(2), False), cache.create(parts(8), False)
    clock.ms += EVICTION_MS + 1
    for sid in (small, big):  # used recently, and old enough to be evictable
        session = cache.get(sid)
        assert session is not None
        cache.touch(session)
    assert cache.create(parts(2), False) == 0  # as big as the smallest: the old one stays
    bigger = cache.create(parts(3), False)
    assert bigger and cache.get(small) is None and cache.get(big) is not None


def test_young_sessions_are_not_evicted_for_bigger_ones() -> None:
    clock = Clock()
    cache = FetchSessionCache(1, clock)
    first = cache.create(parts(1), False)
    clock.ms += 10
    session = cache.get(first)
    assert session is not None
    cache.touch(session)
    assert cache.create(parts(100), False) == 0 and cache.get(first) is not None


def test_a_full_request_drops_the_session_it_names() -> None:
    cache = FetchSessionCache(10, Clock())
    sid = cache.create(parts(2), False)
    assert open_context(cache, sid, 0, False).kind == "full" and cache.get(sid) is None
    sid = cache.create(parts(2), False)
    assert open_context(cache, sid, -1, False).kind == "sessionless" and cache.get(sid) is None


def test_incremental_requests_advance_the_epoch_and_refuse_a_wrong_one() -> None:
    cache = FetchSessionCache(10, Clock())
    sid = cache.create(parts(2), False)
    ctx = open_context(cache, sid, 1, False, [(("t", 5), CachedPartition(3, 9))])
    assert ctx.kind == "incremental" and ctx.session is not None and ctx.session.epoch == 2
    assert ("t", 5) in ctx.session.partitions
    assert open_context(cache, sid, 1, False).error == Codes.INVALID_FETCH_SESSION_EPOCH  # a replay
    assert (
        open_context(cache, sid, 2, True).error == Codes.FETCH_SESSION_TOPIC_ID_ERROR
    )  # v13+ on a name session
    assert open_context(cache, sid + 1, 1, False).error == Codes.FETCH_SESSION_ID_NOT_FOUND


def test_forgetting_every_partition_closes_the_session() -> None:
    cache = FetchSessionCache(10, Clock())
    sid = cache.create(parts(1), False)
    assert open_context(cache, sid, 1, False, forgotten=[("t", 0)]).kind == "sessionless"
    assert cache.get(sid) is None


def test_a_session_holds_a_bounded_number_of_partitions(monkeypatch: pytest.MonkeyPatch) -> None:
    """A full Fetch naming more than MAX_SESSION_PARTITIONS gets no session; an incremental one
    growing a session past it ends the session (the client starts over with a full Fetch)."""
    monkeypatch.setattr(sessions, "MAX_SESSION_PARTITIONS", 4)
    cache = FetchSessionCache(10, Clock())
    assert cache.create(parts(5), False) == 0
    sid = cache.create(parts(4), False)
    assert sid != 0
    grown = open_context(cache, sid, 1, False, parts(1, topic="u"))
    assert grown.error == Codes.FETCH_SESSION_ID_NOT_FOUND and cache.get(sid) is None
