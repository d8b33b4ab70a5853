"""A topic deleted on a live broker (docs/topic-identity.md "Deleted topics"): rlm learns it from the
KRaft metadata log and the ``-delete`` directory, marks the root, lists it in
``/v1/deleted-topics``, and deletes its remote data only after ``tiering.deleted_topic_grace_ms``."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from rlm.storage.local import LocalBackend
from rlm.testing.kafka_cluster import KafkaCluster, wait_until
from rlm.testing.sidecar import run_sidecar, segment_bases
from rlm.tiering.store import object_keys
from tests.live.helpers import produce, wait_tiered

pytestmark = [pytest.mark.kafka_live, pytest.mark.integration]

SEGMENT = 1024 * 1024  # Kafka 4 refuses a smaller segment.bytes
GRACE_MS = 3000


def _deleted_topics(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(url + "/v1/deleted-topics", timeout=10) as resp:
        rows = json.load(resp)
    assert isinstance(rows, list)
    return rows


def _topic_id(part: Path) -> str:
    """The id in the broker's ``partition.metadata`` (``topic_id: <id>``)."""
    text = (part / "partition.metadata").read_text()
    found = re.search(r"topic_id:\s*(\S+)", text)
    assert found is not None, text
    return found.group(1)


def test_deleted_topic_data_goes_after_the_grace_not_before(
    kafka_single: KafkaCluster, tmp_path: Path
) -> None:
    topic = "deleted-after-grace"
    node = kafka_single.nodes[0]
    kafka_single.create_topic(topic, configs={"segment.bytes": SEGMENT})
    produce(kafka_single.bootstrap, topic, 3000, value_bytes=1000)  # ~3 segments
    part = node.log_dir / f"{topic}-0"
    topic_id = _topic_id(part)
    store = LocalBackend(root=str(tmp_path / "store"))
    root = object_keys.root(topic, 0, topic_id)
    marker = object_keys.marker_key(topic, 0, object_keys.RETIRED_MARKER, topic_id)
    with run_sidecar(
        node,
        tmp_path / "store",
        tmp_path / "rlm",
        tiering={"deleted_topic_grace_ms": GRACE_MS},
        topics={"include": [topic]},
    ) as rlm:
        wait_tiered(rlm.url, topic, 0, segment_bases(part)[-1] - 1)
        tiered = [i.key for i in store.list(root)]
        assert any("/manifests/" in k for k in tiered) and _deleted_topics(rlm.url) == []

        with kafka_single.admin() as admin:
            admin.delete_topics([topic])
        wait_until(lambda: store.exists(marker), timeout=120, what="rlm marking the deleted topic")
        retired_ms = json.loads(store.read(marker))["retired_ms"]
        left = [i.key for i in store.list(root)]
        if time.time() * 1000 < retired_ms + GRACE_MS:  # still inside the grace: nothing deleted
            assert set(tiered) <= set(left)
        waiting = wait_until(
            lambda: _deleted_topics(rlm.url) or (None if store.exists(marker) else [{"gone": True}]),
            timeout=60,
            what="/v1/deleted-topics listing it (or the data already gone)",
        )
        if "gone" not in waiting[0]:
            [row] = waiting
            assert (row["topic"], row["topic_id"], row["delete_after_ms"]) == (
                topic,
                topic_id,
                retired_ms + GRACE_MS,
            )

        wait_until(lambda: not list(store.list(root)), timeout=120, what="the remote data deleted")
        wait_until(lambda: _deleted_topics(rlm.url) == [], timeout=60, what="/v1/deleted-topics emptied")
        text = rlm.daemon.log_text()
    found = re.search(rf"deleted topic {re.escape(topic)}-0 .* at (\d+) ms \(marked at (\d+) ms\)", text)
    assert found is not None, text[-3000:]
    deleted_at, marked_at = int(found.group(1)), int(found.group(2))
    assert marked_at == retired_ms and deleted_at >= marked_at + GRACE_MS
