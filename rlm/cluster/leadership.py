"""Leadership sources: does this broker lead ``<topic>-<partition>``? (docs/cluster.md)

Only the leader's sidecar copies a partition, applies retention and collects garbage; every other
sidecar only follows the store. The manager asks a :class:`LeadershipSource` before each pass and
each segment, built once at startup by :func:`rlm.cluster.factory.leadership_source` from
``[cluster]``:

* ``always`` — every partition is led here (a single broker, rlm's behaviour before cluster mode);
* ``static`` — ``[cluster.leaders]`` maps ``"<topic>-<partition>"`` to a node id; unlisted
  partitions are not led here;
* ``kraft`` — ``PartitionImage.leader`` / ``leader_epoch`` from the broker's own replica of the
  KRaft metadata log, read incrementally by :class:`rlm.logdir.kraft.KraftMetadataLog` (the
  manager hands in the image the topic-policy resolver already polls; no second reader);
* ``kafka-admin`` — Metadata responses from the cluster (:mod:`rlm.cluster.kafka_admin`);
* ``auto`` — ``kraft`` when a ``__cluster_metadata-0`` directory is in the log dirs or
  ``[topics] metadata_log_dir`` is set, else ``always``; decided once, at startup.

A source never raises into the manager once built: what it cannot tell is role ``unknown`` with
the reason in :attr:`Leadership.detail` (and the source's error in :meth:`describe`), and an
unknown partition is never copied. Configuration problems are :class:`ConfigError` at startup.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from rlm.config import Settings
from rlm.errors import ConfigError, RlmError
from rlm.logdir.kraft import KraftMetadataLog, MetadataImage, find_metadata_log, read_node_id

__all__ = [
    "AlwaysSource",
    "KraftSource",
    "Leadership",
    "LeadershipSource",
    "Role",
    "StaticSource",
    "leadership_mode",
    "metadata_log_dir",
    "resolve_node_id",
]

log = logging.getLogger(__name__)

Role = Literal["leader", "follower", "unknown"]
Mode = Literal["always", "static", "kraft", "kafka-admin"]


@dataclass(frozen=True, slots=True)
class Leadership:
    """Who leads one partition, as one source sees it now."""

    role: Role  # unknown = the source cannot tell (never copy then)
    leader: int | None  # node id of the leader, None = unknown / no leader
    leader_epoch: int | None  # from KRaft / admin metadata; None when the source has none
    source: str  # "always" | "static" | "kraft" | "kafka-admin"
    detail: str | None = None  # why unknown (or why there is no leader)
    sole: bool = False  # this node holds the partition's only replica (no other sidecar follows it)

    @property
    def is_leader(self) -> bool:
        return self.role == "leader"

    def as_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "leader": self.leader,
            "leader_epoch": self.leader_epoch,
            "source": self.source,
            "detail": self.detail,
        }


class LeadershipSource(Protocol):
    """What the manager uses; implementations are thread-safe."""

    name: str
    node_id: int | None

    def refresh(self) -> None:
        """Re-read what is new (cheap; called per pass and per segment; never raises)."""

    def leadership(self, topic: str, partition: int) -> Leadership:
        """The answer from what was last read (no I/O)."""

    def describe(self) -> dict[str, Any]:
        """For status output: ``source``, ``node_id``, ``error`` (None when healthy) and more."""


def from_leader(
    source: str, node_id: int | None, leader: int, epoch: int | None, replicas: tuple[int, ...] | None = None
) -> Leadership:
    """The role of ``node_id`` when ``leader`` leads (-1 or below: nobody leads, e.g. offline).

    A partition without a leader whose only replica is this node (a single broker that is down,
    or shut down cleanly: the controller then records leader -1) is led here: no other replica,
    so no other sidecar, exists to copy it, and its data cannot change until the broker is back.
    """
    if leader < 0:
        if node_id is not None and replicas == (node_id,):
            return Leadership(
                "leader",
                None,
                epoch,
                source,
                "the partition has no leader; this node holds its only replica",
                True,
            )
        return Leadership("follower", None, epoch, source, "the partition has no leader (offline)")
    sole = node_id is not None and replicas == (node_id,)
    return Leadership("leader" if leader == node_id else "follower", leader, epoch, source, sole=sole)


class AlwaysSource:
    """Every partition is led here: a single broker."""

    name = "always"

    def __init__(self, node_id: int | None) -> None:
        self.node_id: int | None = node_id

    def refresh(self) -> None:
        return None

    def leadership(self, topic: str, partition: int) -> Leadership:
        return Leadership("leader", self.node_id, None, self.name)

    def describe(self) -> dict[str, Any]:
        return {"source": self.name, "node_id": self.node_id, "error": None}


class StaticSource:
    """``[cluster.leaders]``: ``"<topic>-<partition>" = node_id``, read once at startup."""

    name = "static"

    def __init__(self, node_id: int, leaders: Mapping[str, int]) -> None:
        self.node_id: int | None = node_id
        self.leaders = dict(leaders)

    def refresh(self) -> None:
        return None

    def leadership(self, topic: str, partition: int) -> Leadership:
        key = f"{topic}-{partition}"
        leader = self.leaders.get(key)
        if leader is None:
            return Leadership("follower", None, None, self.name, f"{key} is not in [cluster.leaders]")
        return from_leader(self.name, self.node_id, leader, None)

    def describe(self) -> dict[str, Any]:
        return {
            "source": self.name,
            "node_id": self.node_id,
            "error": None,
            "partitions": len(self.leaders),
            "led_here": sum(1 for n in self.leaders.values() if n == self.node_id),
        }


class KraftSource:
    """Leaders and leader epochs from a KRaft metadata image.

    ``image`` returns the newest image (``None`` before the first successful read) and
    ``refresh_image`` reads what is new: the topic-policy resolver's, so one reader follows the log.
    Without them this source runs its own :class:`KraftMetadataLog` on ``directory``.
    """

    name = "kraft"

    def __init__(
        self,
        node_id: int,
        directory: Path,
        *,
        image: Callable[[], MetadataImage | None] | None = None,
        refresh_image: Callable[[], None] | None = None,
    ) -> None:
        self.node_id: int | None = node_id
        self.directory = directory
        self.error: str | None = None
        self._own: KraftMetadataLog | None = None
        self._own_image: MetadataImage | None = None
        if image is None:
            self._own = KraftMetadataLog(directory)
            image, refresh_image = (lambda: self._own_image), self._poll
        self._image = image
        self._refresh_image = refresh_image

    def _poll(self) -> None:
        assert self._own is not None
        try:
            self._own_image, self.error = self._own.poll(), None
        except RlmError as err:  # the reader keeps nothing half-read; the last image stays in use
            if self.error != str(err):
                log.error("KRaft metadata log: %s (keeping the last image read)", err)
            self.error = str(err)

    def refresh(self) -> None:
        if self._refresh_image is not None:
            self._refresh_image()

    def leadership(self, topic: str, partition: int) -> Leadership:
        image = self._image()
        if image is None:
            why = f": {self.error}" if self.error else ""
            return Leadership(
                "unknown", None, None, self.name, f"the KRaft metadata log has not been read{why}"
            )
        found = image.topics_by_name.get(topic)
        part = found.partitions.get(partition) if found is not None else None
        if part is None:
            what = "topic" if found is None else "partition"
            return Leadership(
                "unknown", None, None, self.name, f"{what} not in the metadata image (offset {image.offset})"
            )
        return from_leader(self.name, self.node_id, part.leader, part.leader_epoch, part.replicas)

    def describe(self) -> dict[str, Any]:
        image = self._image()
        return {
            "source": self.name,
            "node_id": self.node_id,
            "metadata_log": str(self.directory),
            "metadata_offset": image.offset if image is not None else None,
            "error": self.error or (None if image is not None else "the metadata log has not been read"),
        }


def metadata_log_dir(settings: Settings) -> Path | None:
    """The KRaft metadata directory: ``[topics] metadata_log_dir``, else the first
    ``<log dir>/__cluster_metadata-0`` (the same rule as the topic-policy resolver)."""
    return settings.topics.metadata_log_dir or find_metadata_log(settings.log.dirs)


def leadership_mode(settings: Settings) -> Mode:
    """``[cluster] leadership`` with ``auto`` resolved (a configured ``metadata_log_dir`` counts
    even before it exists: a KRaft broker's sidecar must never fall back to "always")."""
    mode = settings.cluster.leadership
    if mode != "auto":
        return mode
    return "kraft" if metadata_log_dir(settings) is not None else "always"


def resolve_node_id(settings: Settings, *, required: bool) -> int | None:
    """``[cluster] node_id``, else ``node.id`` / ``broker.id`` from ``meta.properties`` in the log
    dirs; a :class:`ConfigError` naming ``cluster.node_id`` when ``required`` and not found."""
    if settings.cluster.node_id is not None:
        return settings.cluster.node_id
    text = read_node_id(settings.log.dirs)
    if text is not None and text.isdigit() and int(text) < 2**31:
        return int(text)
    if not required:
        return None
    where = ", ".join(str(d) for d in settings.log.dirs)
    found = (
        f"meta.properties has node id {text!r}, not an integer"
        if text is not None
        else (f"no meta.properties with node.id or broker.id in {where}")
    )
    raise ConfigError(
        f"config key cluster.node_id is unset and {found}: leadership = "
        f"{leadership_mode(settings)!r} needs this broker's node id"
    )
