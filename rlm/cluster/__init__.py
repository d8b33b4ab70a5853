"""Cluster mode: which broker leads each partition, so that only the leader's sidecar copies it
(docs/cluster.md). Sits between :mod:`rlm.tiering` (which asks) and :mod:`rlm.config`."""

from rlm.cluster.factory import leadership_source
from rlm.cluster.leadership import Leadership, LeadershipSource, Role, leadership_mode, resolve_node_id

__all__ = [
    "Leadership",
    "LeadershipSource",
    "Role",
    "leadership_mode",
    "leadership_source",
    "resolve_node_id",
]
