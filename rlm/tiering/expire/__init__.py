"""The expire room: what is deleted, and when — the topic policy deciding which topics are tiered
with which retention (`policy`, `retention_sources`), remote retention (`retention`), garbage
collection of abandoned attempts (`gc`) and when it is due (`gc_schedule`), the model of when the
broker deletes its local segments (`deadlines`, `deadline_watch`) and deleted topics' remote data
(`deleted_topics`)
(docs/topic-policy.md). Imports converge, local and store; never copy or read.

This module is the room's public face: packages outside the room import from here, never from
its modules (tests/ops/test_rooms.py).
"""

from __future__ import annotations

from rlm.tiering.expire.deadline_watch import deadline_fields, estimate, forget_deadline, note_deadline
from rlm.tiering.expire.deadlines import by_deadline
from rlm.tiering.expire.deleted_topics import DeletedTopics
from rlm.tiering.expire.gc import collect_garbage, collect_partition
from rlm.tiering.expire.gc_schedule import GcSchedule, gc_interval_s
from rlm.tiering.expire.policy import Setting, TopicPolicy, TopicPolicyResolver, retention_limits
from rlm.tiering.expire.retention import apply_retention, retention_due, retention_pass

__all__ = [
    "DeletedTopics",
    "GcSchedule",
    "Setting",
    "TopicPolicy",
    "TopicPolicyResolver",
    "apply_retention",
    "by_deadline",
    "collect_garbage",
    "collect_partition",
    "deadline_fields",
    "estimate",
    "forget_deadline",
    "gc_interval_s",
    "note_deadline",
    "retention_due",
    "retention_limits",
    "retention_pass",
]
