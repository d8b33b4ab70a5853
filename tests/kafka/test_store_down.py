"""The remote store failing under the listener: a Fetch or ListOffsets that needs it answers
KAFKA_STORAGE_ERROR (retriable: clients back off and ask again) for that partition only; local
data, other requests and other connections are served as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from rlm.cli.generate import generate_log_dir
from rlm.testing.kafka_wire import fetch_request
from tests.kafka.helpers import Daemon, call, oracle, tier_then_delete, toml_config

pytestmark = pytest.mark.integration

KAFKA_STORAGE_ERROR = 56


def test_a_failing_store_is_a_retriable_partition_error(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    generate_log_dir(logs, [("down", 1)], seed=7, records=800, segment_bytes=8 * 1024)
    part = logs / "down-0"
    expected = oracle(part, "down", 0)
    store = tmp_path / "store"
    tiered = toml_config(tmp_path / "tier.toml", [logs], store, {"listen": "127.0.0.1:0"})
    deleted = tier_then_delete(tiered, {("down", 0): part})[("down", 0)]
    local_start = min(int(p.stem) for p in part.glob("*.log"))
    assert deleted and local_start > expected.rows[0][0]
    # The same data, the store now refusing every read (faulty wrapper, docs/storage.md).
    remote = [
        "[remote]",
        'backend = "faulty"',
        "[remote.options]",
        'inner = "local"',
        f"inner_options = {{ root = {json.dumps(str(store))} }}",
        "error_rate = 1.0",
        'operations = ["read"]',
    ]
    daemon = Daemon(
        toml_config(tmp_path / "down.toml", [logs], store, {"listen": "127.0.0.1:0"}, remote=remote)
    )
    try:

        def fetch(offset: int) -> object:
            resp = call(daemon.port, fetch_request([("down", 0, offset)]), 12, FetchResponse)
            assert resp is not None
            return resp.responses[0].partitions[0]

        remote = fetch(expected.rows[0][0])
        assert remote.error_code == KAFKA_STORAGE_ERROR and not remote.records  # type: ignore[attr-defined]
        local = fetch(local_start)
        assert local.error_code == 0 and local.records  # type: ignore[attr-defined]
        assert call(daemon.port, ApiVersionsRequest(), 0, ApiVersionsResponse).error_code == 0
        assert daemon.alive()
    finally:
        daemon.stop()
