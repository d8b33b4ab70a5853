"""The leadership factory: the :class:`~rlm.cluster.leadership.LeadershipSource` that ``[cluster]``
asks for, built once at startup (docs/cluster.md).

The sources build on the leadership model (:mod:`rlm.cluster.leadership`: ``always``, ``static``,
``kraft``; :mod:`rlm.cluster.kafka_admin`: ``kafka-admin``), and only this module knows them all,
so no source module imports another's. ``kafka_admin`` imports kafka-python (an optional extra)
only when a source talks to the cluster, so importing it here costs nothing without the extra.
"""

from __future__ import annotations

from collections.abc import Callable

from rlm.cluster.kafka_admin import KafkaAdminSource
from rlm.cluster.leadership import (
    AlwaysSource,
    KraftSource,
    LeadershipSource,
    StaticSource,
    leadership_mode,
    metadata_log_dir,
    resolve_node_id,
)
from rlm.config import Settings
from rlm.errors import ConfigError
from rlm.logdir.kraft import MetadataImage

__all__ = ["leadership_source"]


def leadership_source(
    settings: Settings,
    *,
    image: Callable[[], MetadataImage | None] | None = None,
    refresh_image: Callable[[], None] | None = None,
) -> LeadershipSource:
    """The source ``[cluster]`` asks for. ``image`` / ``refresh_image``: the KRaft reader already
    polled elsewhere (the manager passes the topic-policy resolver's); used by ``kraft`` only.
    Raises :class:`ConfigError` (naming the key) when the source cannot work at all."""
    mode = leadership_mode(settings)
    node_id = resolve_node_id(settings, required=mode != "always")
    if mode == "always":
        return AlwaysSource(node_id)
    assert node_id is not None
    if mode == "static":
        return StaticSource(node_id, settings.cluster.leaders)
    if mode == "kraft":
        directory = metadata_log_dir(settings)
        if directory is None:
            raise ConfigError(
                'config key cluster.leadership = "kraft": no __cluster_metadata-0 directory '
                "in log.dirs; set topics.metadata_log_dir (Kafka's metadata.log.dir)"
            )
        return KraftSource(node_id, directory, image=image, refresh_image=refresh_image)
    return KafkaAdminSource(settings.cluster, node_id)
