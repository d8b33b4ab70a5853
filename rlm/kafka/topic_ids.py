"""Topic ids on the wire (Fetch v13+, Metadata v12 topics asked by id): Kafka's UUID of a topic
as its partitions' ``partition.metadata`` name it (base64url there, a UUID on the wire), and the
way back from an id to the topic name rlm reads by (docs/kafka-listener.md §5.3).

An id is the topic's *current* incarnation's: a topic deleted and created again under the same name
has a new id, and the old one names nothing (UNKNOWN_TOPIC_ID), as on a broker.
"""

from __future__ import annotations

import base64
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from rlm.logdir.discovery import read_topic_id
from rlm.tiering.read import TieredReaders

__all__ = ["NO_TOPIC_ID", "TopicIds", "topic_uuid"]

#: Kafka's "no id" (Uuid.ZERO_UUID): a topic without ``partition.metadata`` cannot be asked by id.
NO_TOPIC_ID = uuid.UUID(int=0)


def topic_uuid(topic_id: str | None) -> uuid.UUID:
    """``partition.metadata``'s base64url topic id as a UUID; :data:`NO_TOPIC_ID` when there is
    none or it does not decode to 16 bytes."""
    if not topic_id:
        return NO_TOPIC_ID
    try:
        return uuid.UUID(bytes=base64.urlsafe_b64decode(topic_id + "=" * (-len(topic_id) % 4)))
    except ValueError:
        return NO_TOPIC_ID


class TopicIds:
    """id → name over the served partitions, remembered. A remembered id is checked against its
    partition's ``partition.metadata`` at every use (a stat: the file is parsed again only when it
    changed); an id not known, or no longer current, lists the log dirs again — at most once per
    ``relist_s`` seconds, so a client asking for an unknown id cannot make every request a listing."""

    def __init__(
        self, readers: TieredReaders, relist_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._readers = readers
        self._relist_s = relist_s
        self._clock = clock
        self._known: dict[uuid.UUID, tuple[str, Path]] = {}
        self._listed_at: float | None = None
        self._lock = threading.Lock()

    def name_of(self, topic_id: uuid.UUID) -> str | None:
        """The served topic whose current id is ``topic_id``; None when none is."""
        if topic_id == NO_TOPIC_ID:
            return None
        name = self._current(topic_id)
        if name is not None or not self._relist():
            return name
        return self._current(topic_id)

    def _current(self, topic_id: uuid.UUID) -> str | None:
        with self._lock:
            known = self._known.get(topic_id)
        if known is None:
            return None
        name, path = known
        return name if topic_uuid(read_topic_id(path)) == topic_id else None

    def _relist(self) -> bool:
        """List the log dirs again unless that was done within ``relist_s``; whether it was."""
        now = self._clock()
        with self._lock:
            if self._listed_at is not None and now - self._listed_at < self._relist_s:
                return False
            self._listed_at = now
        found = {
            topic_uuid(p.topic_id): (p.topic, p.path)
            for p in self._readers.partitions()
            if topic_uuid(p.topic_id) != NO_TOPIC_ID
        }
        with self._lock:
            self._known = found
        return True
