"""Every read surface of an ``rlm run`` beside a live broker, asked about one offset: the Kafka
listener (Fetch, ListOffsets earliest/latest), the HTTP API (lookup, records) and the ``rlm lookup``
CLI. The DeleteRecords and re-create suites compare each with what the broker answers."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka.protocol.consumer import FetchResponse

from rlm.testing.daemon import rlm_cli
from rlm.testing.kafka_wire import fetch_request
from rlm.testing.sidecar import Sidecar
from tests.kafka.helpers import call

OFFSET_OUT_OF_RANGE = 1
FETCH_VERSION = 11


@dataclass(frozen=True)
class ListenerFetch:
    """One partition of a Fetch answered by rlm's listener (or a broker)."""

    error: int
    high_watermark: int
    log_start_offset: int
    records: bytes


def listener_fetch(bootstrap: str, topic: str, offset: int, partition: int = 0) -> ListenerFetch:
    """A raw Fetch of ``topic-partition`` at ``offset`` (read_uncommitted, 1 MiB) to ``host:port``."""
    port = int(bootstrap.rsplit(":", 1)[1])
    resp = call(port, fetch_request([(topic, partition, offset)]), FETCH_VERSION, FetchResponse)
    assert resp is not None, f"{bootstrap} closed the connection on a Fetch"
    p = resp.responses[0].partitions[0]
    return ListenerFetch(p.error_code, p.high_watermark, p.log_start_offset, bytes(p.records or b""))


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            body = resp.read()
            kind = resp.headers.get("content-type", "")
            return resp.status, json.loads(body) if kind.startswith("application/json") else body
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def http_lookup(rlm: Sidecar, topic: str, offset: int, partition: int = 0) -> dict[str, Any]:
    """``GET …/offsets/{offset}``: the lookup object (always 200 for an offset of a known partition)."""
    status, body = _get(f"{rlm.url}/v1/topics/{topic}/partitions/{partition}/offsets/{offset}")
    assert status == 200, (status, body)
    return dict(body)


def http_records(rlm: Sidecar, topic: str, offset: int, partition: int = 0) -> tuple[int, Any]:
    """``GET …/records?offset=&format=json``: (HTTP status, JSON body)."""
    return _get(f"{rlm.url}/v1/topics/{topic}/partitions/{partition}/records?offset={offset}&format=json")


def cli_lookup(rlm: Sidecar, topic: str, offset: int, partition: int = 0) -> dict[str, Any]:
    """``rlm lookup --offset`` with the sidecar's own config, as an operator runs it beside it."""
    done = rlm_cli(
        "lookup", "--config", rlm.config, "--topic", topic, "--partition", partition, "--offset", offset
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def assert_not_served(rlm: Sidecar, topic: str, offset: int, log_start: int) -> None:
    """No surface of rlm serves ``offset`` (below the log start ``log_start``): the listener answers
    OFFSET_OUT_OF_RANGE with every offset -1, as the live broker does (clients reset with
    ListOffsets), the HTTP lookup and the CLI ``found: false`` naming ``log_start``, the HTTP fetch 416."""
    fetched = listener_fetch(rlm.kafka_bootstrap, topic, offset)
    answer = (fetched.error, fetched.log_start_offset, len(fetched.records))
    assert answer == (OFFSET_OUT_OF_RANGE, -1, 0), (
        f"the listener served offset {offset} below the log start {log_start}: "
        f"(error, log start, record bytes) = {answer}"
    )
    looked = http_lookup(rlm, topic, offset)
    assert not looked["found"], f"HTTP lookup found offset {offset} below the log start {log_start}: {looked}"
    assert looked["valid_ranges"]["log_start_offset"] == log_start, looked
    status, body = http_records(rlm, topic, offset)
    assert status == 416, f"HTTP records served offset {offset} below the log start {log_start}: {status}"
    assert body["error"]["field"] == "offset", body
    by_cli = cli_lookup(rlm, topic, offset)
    assert not by_cli["found"], f"rlm lookup found offset {offset} below the log start {log_start}: {by_cli}"


def first_served(rlm: Sidecar, topic: str, offset: int) -> int:
    """The first record offset the HTTP fetch decodes from ``offset`` (records below the log start
    of a boundary batch are dropped by the decoded view)."""
    status, body = http_records(rlm, topic, offset)
    assert status == 200, (status, body)
    return int(body["batches"][0]["records"][0]["offset"])


def log_start_entries(log_dir: Path) -> dict[tuple[str, int], int]:
    """The broker's ``log-start-offset-checkpoint`` entries as they are on disk now."""
    lines = (log_dir / "log-start-offset-checkpoint").read_text().splitlines()[2:]
    entries = (line.split() for line in lines if line.strip())
    return {(t, int(p)): int(o) for t, p, o in entries}
