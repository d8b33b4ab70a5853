"""Fetch sessions (KIP-227) and topic ids (KIP-516) on the wire, against the daemon's listener
(docs/kafka-listener.md §5.2, §5.3): a full Fetch opens a session, incremental Fetches name only
what changed and are answered only where something changed, and every answer equals a sessionless
Fetch of the same positions. kafka-python's protocol classes are the independent codec."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from rlm.testing.kafka_wire import fetch_request
from tests.kafka.conftest import Tiered
from tests.kafka.helpers import call

pytestmark = pytest.mark.integration

UNKNOWN_TOPIC_ID, SESSION_ID_NOT_FOUND, INVALID_SESSION_EPOCH, SESSION_TOPIC_ID_ERROR = 100, 70, 71, 106
Key = tuple[str, int]


def _ids(port: int) -> dict[str, uuid.UUID]:
    """Every served topic with a topic id (from its partition.metadata), by Metadata v12."""
    resp = call(port, MetadataRequest[12](topics=None, allow_auto_topic_creation=False), 12, MetadataResponse)
    return {t.name: t.topic_id for t in resp.topics if t.topic_id and t.topic_id.int}


def _fetch(port: int, version: int, parts: list[tuple[str, int, int]], **kw: Any) -> Any:
    req = fetch_request(parts, max_bytes=64 << 20, partition_max_bytes=2048, **kw)
    resp = call(port, req, version, FetchResponse)
    assert resp is not None
    return resp


def _answers(resp: Any, names: dict[uuid.UUID, str]) -> dict[Key, Any]:
    return {
        (t.topic or names[t.topic_id], p.partition_index): p for t in resp.responses for p in t.partitions
    }


def _shape(p: Any) -> tuple[Any, ...]:
    return (p.error_code, p.high_watermark, p.last_stable_offset, p.log_start_offset, bytes(p.records or b""))


class _Consumer:
    """One session driven at random, and the model of what its answers must be: ``positions`` in
    the session's order (Kafka's rule: a new partition joins at the end, one that answered records
    moves there), ``told`` the offsets each partition last reported."""

    def __init__(self, tiered: Tiered, version: int, pool: list[Key], ids: dict[str, uuid.UUID]) -> None:
        self.port, self.version, self.pool = tiered.daemon.port, version, pool
        self.expected = tiered.expected
        self.kw: dict[str, Any] = {"topic_ids": ids} if version >= 13 else {}
        self.names = {v: k for k, v in ids.items()}
        self.rng = random.Random(version)
        self.positions: dict[Key, int] = {}
        self.told: dict[Key, tuple[int, int, int]] = {}
        first = self.rng.sample(pool, 3)
        self.positions.update({k: self.pick(k) for k in first})
        opened = _fetch(
            self.port, version, [(*k, self.positions[k]) for k in first], session_epoch=0, **self.kw
        )
        assert opened.session_id != 0 and opened.error_code == 0
        self.session, self.epoch = opened.session_id, 1
        for k, part in _answers(opened, self.names).items():
            self.told[k] = (part.high_watermark, part.last_stable_offset, part.log_start_offset)

    def pick(self, key: Key) -> int:
        e, roll = self.expected[key], self.rng.random()
        if roll < 0.05:
            return e.high_watermark + 5  # out of range: an error answers, always
        return e.high_watermark if roll < 0.35 else self.rng.randint(e.log_start, e.high_watermark)

    def round(self) -> None:
        """Change, add and forget some partitions; the incremental answer lists exactly those that
        must respond, each equal to the sessionless read of the same position."""
        changed = self.rng.sample(self.pool, self.rng.randint(0, 3))
        forgotten = [k for k in self.positions if k not in changed and self.rng.random() < 0.1]
        forgotten = forgotten[: len(self.positions) - 1]
        for k in forgotten:
            del self.positions[k]
            self.told.pop(k, None)
        for k in changed:
            self.positions[k] = self.pick(k)
        # the same reads, sessionless and in the session's order, before the session's answer
        asked = [(*k, at) for k, at in self.positions.items()]
        alone = _answers(_fetch(self.port, self.version, asked, **self.kw), self.names)
        resp = _fetch(
            self.port,
            self.version,
            [(*k, self.positions[k]) for k in changed],
            session_id=self.session,
            session_epoch=self.epoch,
            forgotten=forgotten,
            **self.kw,
        )
        assert (resp.error_code, resp.session_id) == (0, self.session)
        self.epoch += 1
        got = _answers(resp, self.names)
        assert list(got) == [k for k in alone if k in got]  # in the session's order
        for key, want in alone.items():
            offsets = (want.high_watermark, want.last_stable_offset, want.log_start_offset)
            must = bool(want.records) or want.error_code != 0 or self.told.get(key) != offsets
            assert (key in got) == must, (key, _shape(want)[:4], self.told.get(key))
            if key in got:
                assert _shape(got[key]) == _shape(want), key
                self.told[key] = offsets if not want.error_code else (-1, -1, -1)
                if want.records:
                    self.positions[key] = self.positions.pop(key)


@pytest.mark.parametrize("version", [12, 17])
def test_incremental_rounds_equal_sessionless_fetches(tiered: Tiered, version: int) -> None:
    """200 rounds of one session: partitions added, moved and forgotten at random; each answer
    lists exactly the partitions with records, an error or offsets not yet told, each equal to a
    sessionless Fetch at the same position."""
    ids = _ids(tiered.daemon.port)
    pool = sorted(
        k for k in tiered.expected if k[0] != "__cluster_metadata" and (version < 13 or k[0] in ids)
    )
    assert len(pool) >= 4
    consumer = _Consumer(tiered, version, pool, ids)
    for _ in range(200):
        consumer.round()


def test_session_errors_and_closing(tiered: Tiered) -> None:
    port = tiered.daemon.port
    e = tiered.expected[("gen", 0)]
    opened = _fetch(port, 12, [("gen", 0, e.log_start)], session_epoch=0)
    sid = opened.session_id
    assert sid != 0
    assert _fetch(port, 12, [], session_id=sid + 1, session_epoch=1).error_code == SESSION_ID_NOT_FOUND
    wrong = _fetch(port, 12, [], session_id=sid, session_epoch=5)
    assert (wrong.error_code, wrong.session_id, wrong.responses) == (INVALID_SESSION_EPOCH, 0, [])
    ids = _ids(port)
    by_id = _fetch(port, 13, [], session_id=sid, session_epoch=1, topic_ids=ids)
    assert by_id.error_code == SESSION_TOPIC_ID_ERROR  # opened naming topics, used by id
    again = _fetch(port, 12, [], session_id=sid, session_epoch=1)
    assert again.error_code == 0 and again.session_id == sid  # the errors changed nothing
    closed = _fetch(port, 12, [("gen", 0, e.log_start)], session_id=sid, session_epoch=-1)
    assert closed.session_id == 0 and _answers(closed, {})[("gen", 0)].records
    assert _fetch(port, 12, [], session_id=sid, session_epoch=2).error_code == SESSION_ID_NOT_FOUND
    # an incremental Fetch forgetting its last partition ends the session: answered without one
    sid = _fetch(port, 12, [("gen", 0, e.log_start)], session_epoch=0).session_id
    emptied = _fetch(port, 12, [], session_id=sid, session_epoch=1, forgotten=[("gen", 0)])
    assert (emptied.error_code, emptied.session_id, emptied.responses) == (0, 0, [])
    assert _fetch(port, 12, [("gen", 0, e.log_start)], session_epoch=0).session_id != 0  # left open
    assert tiered.daemon.metric("rlm_kafka_fetch_sessions") >= 1
    assert tiered.daemon.metric("rlm_kafka_fetch_session_partitions") >= 1


def test_topic_ids_in_fetch_and_metadata(tiered: Tiered) -> None:
    """Fetch v13+ and Metadata v12 by id answer as by name; an id no served topic has answers
    UNKNOWN_TOPIC_ID (the partition in a Fetch, the topic with a null name in Metadata)."""
    port = tiered.daemon.port
    ids = _ids(port)
    name = next(k[0] for k in sorted(tiered.expected) if k[0] in ids and tiered.expected[k].rows)
    part = next(k[1] for k in sorted(tiered.expected) if k[0] == name and tiered.expected[k].rows)
    start = tiered.expected[(name, part)].log_start
    by_name = _answers(_fetch(port, 12, [(name, part, start)]), {})[(name, part)]
    for version in (13, 15, 16, 17):
        resp = _fetch(port, version, [(name, part, start)], topic_ids=ids)
        [topic] = resp.responses
        assert topic.topic_id == ids[name] and _shape(topic.partitions[0]) == _shape(by_name)
    stranger = uuid.uuid4()
    unknown = _fetch(port, 17, [("ghost", 0, 0)], topic_ids={"ghost": stranger})
    assert [(t.topic_id, [p.error_code for p in t.partitions]) for t in unknown.responses] == [
        (stranger, [UNKNOWN_TOPIC_ID])
    ]
    topic = MetadataRequest.MetadataRequestTopic
    for version in (12, 13):
        asked = MetadataRequest(
            topics=[topic(topic_id=ids[name], name=None), topic(topic_id=stranger, name=None)],
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        resp = call(port, asked, version, MetadataResponse)
        known, missing = resp.topics
        assert (known.name, known.topic_id, known.error_code) == (name, ids[name], 0)
        assert known.partitions
        assert (missing.name, missing.topic_id, missing.error_code) == (None, stranger, UNKNOWN_TOPIC_ID)
