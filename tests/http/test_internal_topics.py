"""Kafka's internal logs are never served (docs/visibility.md, "Internal topics"): the KRaft metadata
log (``__cluster_metadata``, whose records hold SCRAM salts and keys) on no surface ever, the other
internal logs only with ``[server] serve_internal_topics``. Every read surface is asked about a
real metadata log (written with rlm.testing.kraft) and a ``__consumer_offsets`` partition (written
with LogWriter) beside an ordinary topic: the HTTP routes over a real socket, the Kafka listener's
handlers, the CLI in a subprocess and the export's read plan. (The status rows still list them, as
excluded by the topic policy: an operator's view, no data.)"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from kafka.protocol.metadata import MetadataRequest

from rlm.cli.wiring import build_api
from rlm.config import Settings, settings_from_mapping
from rlm.http.server import ApiServer
from rlm.jobs.reading.plan import plan_read
from rlm.kafka.api import KafkaApi
from rlm.kafka.protocol import Codes
from rlm.kafka.reads import offsets_only
from rlm.storage.local import LocalBackend
from rlm.testing.kraft import metadata_writer, new_topic_id, topic_records, write_records
from rlm.tiering.manager import RemoteLogManager
from tests.lookup.helpers import write_generated

METADATA = "__cluster_metadata"
OFFSETS = "__consumer_offsets"


@dataclass
class Served:
    url: str
    settings: Settings
    config: Path
    api: KafkaApi


def _logs(tmp: Path) -> Path:
    logs = tmp / "logs"
    write_generated(logs, "orders", 0, batches=30, seed=3)
    write_generated(logs, OFFSETS, 0, batches=30, seed=4)
    with metadata_writer(logs, segment_bytes=4096) as w:  # several segments: some rolled
        for i in range(40):
            write_records(w, [topic_records(f"t{i}", new_topic_id(), [[0]])])
    return logs


def _settings(tmp: Path, logs: Path, internal: bool) -> tuple[Settings, Path]:
    raw: dict[str, Any] = {
        "log": {"dirs": [str(logs)], "eligibility": "rolled"},
        "remote": {"backend": "local", "options": {"root": str(tmp / "store")}},
        "tiering": {"gc_grace_ms": 0},
        "topics": {"include": ["*", "__*"]},  # tier the internal logs too: serving is what is refused
        "cluster": {"leadership": "always"},
        "server": {"host": "127.0.0.1", "port": 0, "serve_internal_topics": internal},
    }
    config = tmp / "rlm.toml"
    lines = []
    for section, values in raw.items():
        lines.append(f"[{section}]")
        for k, v in values.items():
            if isinstance(v, dict):
                lines.append(f"{k} = {{ " + ", ".join(f'{a} = "{b}"' for a, b in v.items()) + " }")
            else:
                lines.append(f"{k} = {_toml(v)}")
    config.write_text("\n".join(lines) + "\n")
    return settings_from_mapping(raw), config


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return f'"{v}"' if isinstance(v, str) else str(v)


@pytest.fixture(scope="module", params=[False, True], ids=["default", "serve_internal_topics"])
def served(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("internal")
    settings, config = _settings(tmp, _logs(tmp), request.param)
    manager = RemoteLogManager(settings, LocalBackend(root=str(tmp / "store")))
    assert all(r.error is None for r in manager.run_once())
    parts = build_api(settings, manager)
    server = ApiServer(parts.app, "127.0.0.1", 0).start()
    try:
        yield Served(server.url, settings, config, KafkaApi(parts.readers, node_id=0))
    finally:
        server.stop()
        parts.readers.close()


def _http_answers(url: str, topic: str) -> dict[str, int]:
    base = f"/v1/topics/{topic}/partitions/0"
    with httpx.Client(base_url=url, timeout=30) as http:
        return {
            "offsets": http.get(f"{base}/offsets/0").status_code,
            "timestamps": http.get(f"{base}/timestamps/-2").status_code,
            "records": http.get(f"{base}/records", params={"offset": 0}).status_code,
            "json": http.get(f"{base}/records", params={"offset": 0, "format": "json"}).status_code,
            "stream": http.get(f"{base}/records/stream", params={"offset": 0}).status_code,
        }


def _http_listed(url: str) -> set[str]:
    with httpx.Client(base_url=url, timeout=30) as http:
        times = http.post("/v1/offsets-for-times", json={"timestamp": -2}).json()
        asked = http.post("/v1/offsets-for-times", json={"timestamp": -2, "topics": [METADATA]}).json()
    assert asked == []  # named explicitly: still nothing
    return {r["topic"] for r in times}


def test_the_metadata_log_is_never_served_over_http(served: Served) -> None:
    assert set(_http_answers(served.url, METADATA).values()) == {404}
    assert set(_http_answers(served.url, "orders").values()) == {200}
    times = _http_listed(served.url)
    assert "orders" in times and METADATA not in times


def test_other_internal_logs_are_served_over_http_only_when_allowed(served: Served) -> None:
    allowed = served.settings.server.serve_internal_topics
    assert set(_http_answers(served.url, OFFSETS).values()) == ({200} if allowed else {404})
    assert (OFFSETS in _http_listed(served.url)) is allowed


def test_the_kafka_listener_hides_them_alike(served: Served) -> None:
    allowed = served.settings.server.serve_internal_topics
    meta = served.api.metadata(MetadataRequest(topics=None), 1, "127.0.0.1", 9092)
    names = {t.name for t in meta.topics}
    assert "orders" in names and METADATA not in names and (OFFSETS in names) is allowed
    asked = served.api.metadata(
        MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=METADATA)]), 1, "127.0.0.1", 9092
    )
    assert [t.error_code for t in asked.topics] == [Codes.UNKNOWN_TOPIC_OR_PARTITION]
    readers = served.api.readers
    assert offsets_only(readers, METADATA, 0).error == Codes.UNKNOWN_TOPIC_OR_PARTITION
    assert offsets_only(readers, OFFSETS, 0).error == (
        Codes.NONE if allowed else Codes.UNKNOWN_TOPIC_OR_PARTITION
    )


def _cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "rlm", *args, "--config", str(config), "--partition", "0"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_cli_reads_refuse_the_metadata_log(served: Served) -> None:
    for topic, refused in ((METADATA, True), (OFFSETS, not served.settings.server.serve_internal_topics)):
        lookup = _cli(served.config, "lookup", "--topic", topic, "--offset", "0")
        fetch = _cli(served.config, "fetch", "--topic", topic, "--offset", "0")
        for done in (lookup, fetch):
            if refused:
                assert done.returncode == 1 and "not served" in done.stderr, done.stderr
                assert done.stdout == ""
            else:
                assert done.returncode == 0, done.stderr


def test_an_export_plans_no_metadata_log(served: Served) -> None:
    plan = plan_read(served.settings, None)
    topics = {p.topic for p in plan.partitions}
    assert "orders" in topics and METADATA not in topics
    assert (OFFSETS in topics) is served.settings.server.serve_internal_topics
    assert plan_read(served.settings, [METADATA]).partitions == []
