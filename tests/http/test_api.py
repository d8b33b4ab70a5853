"""The HTTP API over a real socket: ApiServer (uvicorn, port 0) serving a tiered log dir, queried
with httpx / RlmClient. Answers are checked against a brute-force scan of the records."""

from __future__ import annotations

import csv
import io
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from rlm.cli.wiring import build_api
from rlm.errors import RlmHttpError
from rlm.formats.records import decode_records, iter_batches
from rlm.http.client import RlmClient
from rlm.http.server import ApiServer
from rlm.logdir.discovery import list_segments
from rlm.storage.local import LocalBackend
from rlm.testing.daemon import rlm_cli
from rlm.tiering.manager import RemoteLogManager
from tests.lookup.helpers import (
    BruteLog,
    delete_local_segments,
    expected_fetch,
    settings_for,
    write_config,
    write_generated,
)

TOKEN = "s3cret-token"


@dataclass
class Api:
    url: str
    config: Path
    brute: dict[str, BruteLog]
    local_start: dict[str, int]
    registry: CollectorRegistry

    def client(self, token: str | None = TOKEN) -> RlmClient:
        return RlmClient(self.url, token=token)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp("http")
    logs, store = tmp / "logs", tmp / "store"
    write_generated(logs, "orders", 0, batches=250, seed=1)
    write_generated(logs, "orders", 1, batches=60, seed=2)
    write_generated(logs, "audit.events_v2", 3, batches=40, seed=3, segment_bytes=1 << 30)  # one segment
    brute = {p.name: BruteLog.scan(p) for p in sorted(logs.iterdir()) if p.is_dir()}
    config = write_config(tmp / "rlm.toml", [logs], store=store, index_entry_bytes=4_000)
    settings = settings_for(
        [logs],
        options={"root": str(store)},
        index_entry_bytes=4_000,
        server={"host": "127.0.0.1", "port": 0, "token": TOKEN},
    )
    backend = LocalBackend(root=str(store))
    manager = RemoteLogManager(settings, backend)
    assert all(r.error is None for r in manager.run_once())
    delete_local_segments(logs / "orders-0", keep_last=2)  # orders-0: remote + local; others: local too
    local_start = {name: list_segments(logs / name)[0].base_offset for name in brute}
    parts = build_api(settings, manager)  # wired as `rlm run` wires it
    registry = parts.registry
    server = ApiServer(parts.app, "127.0.0.1", 0).start()
    try:
        yield Api(server.url, config, brute, local_start, registry)
    finally:
        server.stop()


def _get(api: Api, path: str, token: str | None = TOKEN, **params: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(api.url + path, headers=headers, params=params or None, timeout=30)


def _assert_error(resp: httpx.Response, status: int, field: str | None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    err: dict[str, Any] = resp.json()["error"]
    assert set(err) == {"field", "reason"} and err["reason"], err
    assert err["field"] == field, err
    return err


# --- routes -----------------------------------------------------------------------------------------


def test_offsets_route_answers_from_both_tiers(api: Api) -> None:
    brute = api.brute["orders-0"]
    start = api.local_start["orders-0"]
    assert start > 0
    with api.client() as c:
        for rec in brute.records[:: max(1, len(brute.records) // 60)]:
            doc = c.lookup_offset("orders", 0, rec.offset)
            assert doc["found"] and doc["offset"] == rec.offset and doc["timestamp"] == rec.timestamp
            assert doc["batch"] == {"base_offset": rec.batch_base, "last_offset": rec.batch_last}
            assert doc["tier"] == ("local" if rec.offset >= start else "remote")
            assert ("rdi" in doc["location"]) == (doc["tier"] == "remote")
        end = brute.records[-1].offset + 1
        past = c.lookup_offset("orders", 0, end)
        assert past["found"] is False and past["valid_ranges"]["log_end_offset"] == end


def test_timestamps_route_and_special_values(api: Api) -> None:
    brute = api.brute["orders-0"]
    stamps = sorted({r.timestamp for r in brute.records})
    with api.client() as c:
        for ts in [stamps[0] - 1, *stamps[:: max(1, len(stamps) // 40)], stamps[-1]]:
            doc = c.lookup_timestamp("orders", 0, ts)
            want = brute.first_ts_ge(ts)
            assert want is not None and doc["found"] and doc["offset"] == want.offset, (ts, doc)
        assert c.lookup_timestamp("orders", 0, stamps[-1] + 1)["found"] is False
        assert c.lookup_timestamp("orders", 0, -1)["offset"] == brute.records[-1].offset + 1
        earliest = c.lookup_timestamp("orders", 0, -2)
        assert (earliest["offset"], earliest["tier"]) == (0, "remote")
        earliest_local = c.lookup_timestamp("orders", 0, -4)
        assert (earliest_local["offset"], earliest_local["tier"]) == (api.local_start["orders-0"], "local")
        top = c.lookup_timestamp("orders", 0, -3)
        assert top["timestamp"] == stamps[-1]
        with pytest.raises(RlmHttpError) as err:
            c.lookup_timestamp("orders", 0, -6)
        assert (err.value.status, err.value.field) == (400, "timestamp")


def test_records_route_raw_and_json(api: Api) -> None:
    brute = api.brute["orders-0"]
    with api.client() as c:
        for rec, max_bytes in [
            (brute.records[3], 1),
            (brute.records[len(brute.records) // 3], 5_000),
            (brute.records[-2], 1 << 20),
        ]:
            data, headers = c.fetch_raw("orders", 0, rec.offset, max_bytes)
            want = expected_fetch(brute, rec.offset, max_bytes)
            assert data == b"".join(b.data for b in want)
            batches = list(iter_batches(data))
            tier = "local" if rec.offset >= api.local_start["orders-0"] else "remote"
            assert headers["x-rlm-tier"] == tier
            assert int(headers["x-rlm-next-offset"]) == batches[-1].last_offset + 1
            assert int(headers["x-rlm-batches"]) == len(batches)
            doc = c.fetch_json("orders", 0, rec.offset, max_bytes)
            offsets = [r["offset"] for b in doc["batches"] for r in b["records"]]
            assert offsets == [r.offset for b in batches for r in decode_records(data, b)]
            assert doc["tier"] == headers["x-rlm-tier"]


def test_partitions_and_offsets_for_times_routes(api: Api) -> None:
    with api.client() as c:
        rows = {(r["topic"], r["partition"]): r for r in c.partitions()}
        assert set(rows) == {("orders", 0), ("orders", 1), ("audit.events_v2", 3)}
        assert rows[("orders", 0)]["local_log_start_offset"] == api.local_start["orders-0"]
        assert rows[("orders", 0)]["remote_log_start_offset"] == 0
        ts = api.brute["orders-1"].records[100].timestamp
        got = {(r["topic"], r["partition"]): r for r in c.offsets_for_times(ts, minus_ms=1_000)}
        for name, brute in api.brute.items():
            topic, _, p = name.rpartition("-")
            want = brute.first_ts_ge(ts - 1_000)
            expect = want.offset if want else brute.records[-1].offset + 1
            assert got[(topic, int(p))]["offset"] == expect, name
        only = c.offsets_for_times(-2, topics=["orders"])
        assert {(r["topic"], r["offset"]) for r in only} == {("orders", 0)}


def test_pins_route_answers_per_log_dir_from_memory(api: Api) -> None:
    """``GET /v1/pins`` (docs/http-api.md §2): one row per configured log dir; everything eligible
    is tiered, so nothing is pinned; the partition rows carry their own pin fields."""
    with api.client() as c:
        (row,) = c.pins()
        assert row == {
            "log_dir": str(api.config.parent / "logs"),
            "pinned_bytes": 0,
            "pinned_segments": 0,
            "max_pinned_bytes": 4 << 30,
            "bound_reached": False,
            "bound_reached_since_ms": None,
            "partitions_refused": 0,
        }
        for part in c.partitions():
            assert (part["pinned_segments"], part["pinned_bytes"], part["pin_refused_offset"]) == (0, 0, None)
        assert f'rlm_pin_bound_reached{{log_dir="{row["log_dir"]}"}} 0.0' in c.metrics()
    _assert_error(_get(api, "/v1/pins", token=None), 401, "authorization")


def test_cli_offsets_for_times_csv_matches_brute_force(api: Api) -> None:
    ts = api.brute["orders-0"].records[700].timestamp + 15 * 60_000
    proc = rlm_cli("offsets-for-times", "--config", api.config, "--timestamp", ts, "--minus", "15m")
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.reader(io.StringIO(proc.stdout)))
    assert len(rows) == 3 and all(len(r) == 3 for r in rows)
    got = {(t, int(p)): int(o) for t, p, o in rows}
    for name, brute in api.brute.items():
        topic, _, p = name.rpartition("-")
        want = brute.first_ts_ge(ts - 15 * 60_000)
        assert got[(topic, int(p))] == (want.offset if want else brute.records[-1].offset + 1), name
    proc = rlm_cli("offsets-for-times", "--config", api.config, "--timestamp", ts, "--minus", "15 parsecs")
    assert proc.returncode == 2


def test_metrics_have_kafka_names(api: Api) -> None:
    with api.client() as c:
        c.lookup_offset("orders", 0, 0)  # a remote read
        text = c.metrics()
    for name in (
        "rlm_remote_copy_bytes_total",
        "rlm_remote_copy_requests_total",
        "rlm_remote_copy_lag_bytes",
        "rlm_remote_copy_lag_segments",
        "rlm_remote_log_size_bytes",
        "rlm_remote_fetch_requests_total",
        "rlm_remote_fetch_errors_total",
        "rlm_remote_cache_hits_total",
    ):
        assert f"\n{name}" in text, name
    for kafka in (
        "RemoteCopyBytesPerSec",
        "RemoteCopyLagBytes",
        "RemoteFetchErrorsPerSec",
        "RemoteFetchRequestsPerSec",
        "RemoteLogSizeBytes",
    ):
        assert kafka in text, kafka
    copied = [
        line
        for line in text.splitlines()
        if line.startswith('rlm_remote_copy_bytes_total{partition="0",topic="orders"}')
    ]
    assert copied and float(copied[0].split()[-1]) > 0


# --- auth, docs -------------------------------------------------------------------------------------


def test_token_is_required_except_for_healthz_and_docs(api: Api) -> None:
    for path in (
        "/v1/partitions",
        "/v1/topics/orders/partitions/0/offsets/0",
        "/metrics",
        "/v1/topics/orders/partitions/0/records",
    ):
        for token in (None, "wrong", TOKEN + "x", ""):
            resp = _get(api, path, token=token, offset=0)
            _assert_error(resp, 401, "authorization")
            assert resp.headers["www-authenticate"] == "Bearer"
    resp = httpx.get(api.url + "/v1/partitions", headers={"Authorization": f"Basic {TOKEN}"})
    _assert_error(resp, 401, "authorization")
    resp = httpx.post(api.url + "/v1/offsets-for-times", json={"timestamp": -1})
    _assert_error(resp, 401, "authorization")
    assert httpx.get(api.url + "/healthz").json()["status"] == "ok"
    docs = httpx.get(api.url + "/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
    spec = httpx.get(api.url + "/openapi.json").json()
    for route in (
        "/v1/partitions",
        "/v1/topics/{topic}/partitions/{partition}/offsets/{offset}",
        "/v1/topics/{topic}/partitions/{partition}/timestamps/{timestamp}",
        "/v1/topics/{topic}/partitions/{partition}/records",
        "/v1/offsets-for-times",
        "/metrics",
        "/healthz",
    ):
        assert route in spec["paths"], route


# --- bad input --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "params", "status", "field"),
    [
        ("/v1/topics/orders/partitions/abc/offsets/0", {}, 400, "partition"),
        ("/v1/topics/orders/partitions/-1/offsets/0", {}, 400, "partition"),
        ("/v1/topics/orders/partitions/0/offsets/-1", {}, 400, "offset"),
        ("/v1/topics/orders/partitions/0/offsets/1.5", {}, 400, "offset"),
        ("/v1/topics/orders/partitions/0/timestamps/soon", {}, 400, "timestamp"),
        ("/v1/topics/%2E%2E/partitions/0/offsets/0", {}, 400, "topic"),
        ("/v1/topics/..%2F..%2Fetc/partitions/0/offsets/0", {}, 404, None),  # "/" never reaches a route
        ("/v1/topics/orders/partitions/0/offsets/0%2F", {}, 404, None),  # a 404, not a redirect to a guess
        ("/v1/partitions/", {}, 404, None),
        ("/v1/topics/" + "t" * 250 + "/partitions/0/offsets/0", {}, 400, "topic"),
        ("/v1/topics/bad%20name/partitions/0/offsets/0", {}, 400, "topic"),
        ("/v1/topics/orders/partitions/9/offsets/0", {}, 404, "partition"),
        ("/v1/topics/nosuch/partitions/0/timestamps/0", {}, 404, "partition"),
        ("/v1/topics/orders/partitions/0/records", {"offset": 0, "max_bytes": 0}, 400, "max_bytes"),
        ("/v1/topics/orders/partitions/0/records", {"offset": 0, "max_bytes": -5}, 400, "max_bytes"),
        ("/v1/topics/orders/partitions/0/records", {"offset": -1}, 400, "offset"),
        ("/v1/topics/orders/partitions/0/records", {}, 400, "offset"),
        ("/v1/topics/orders/partitions/0/records", {"offset": 10**9}, 416, "offset"),
        ("/v1/topics/orders/partitions/0/records", {"offset": 0, "format": "xml"}, 400, "format"),
    ],
)
def test_bad_input_is_a_json_4xx_naming_the_field(
    api: Api, path: str, params: dict[str, Any], status: int, field: str | None
) -> None:
    _assert_error(_get(api, path, **params), status, field)


def test_bad_offsets_for_times_bodies(api: Api) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for body, field in [
        ({"timestamp": 0, "topics": [".."]}, "topic"),
        ({"timestamp": 0, "topics": ["a/b"]}, "topic"),
        ({"timestamp": 0, "topics": ["x" * 250]}, "topic"),
        ({"timestamp": "now"}, "timestamp"),
        ({"timestamp": 0, "minus_ms": -1}, "minus_ms"),
        ({}, "timestamp"),
    ]:
        resp = httpx.post(api.url + "/v1/offsets-for-times", json=body, headers=headers)
        _assert_error(resp, 400, field)
    resp = httpx.post(api.url + "/v1/offsets-for-times", content=b"{not json", headers=headers)
    assert resp.status_code == 400 and "error" in resp.json()


# --- concurrency ------------------------------------------------------------------------------------


def test_concurrent_clients_all_get_correct_answers(api: Api) -> None:
    brute = api.brute["orders-0"]
    records = brute.records
    errors: list[str] = []

    def worker(n: int) -> None:
        with api.client() as c:
            for i in range(50):
                rec = records[(n * 7919 + i * 104729) % len(records)]
                try:
                    if i % 3 == 2:
                        doc = c.lookup_timestamp("orders", 0, rec.timestamp)
                        want = brute.first_ts_ge(rec.timestamp)
                        ok = want is not None and doc["offset"] == want.offset
                    else:
                        doc = c.lookup_offset("orders", 0, rec.offset)
                        ok = doc["offset"] == rec.offset and doc["batch"]["base_offset"] == rec.batch_base
                    if not ok:
                        errors.append(f"{n}/{i}: {rec} -> {json.dumps(doc)}")
                except Exception as err:
                    errors.append(f"{n}/{i}: {err!r}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
