"""Kafka's visibility rule on every read surface (docs/visibility.md): nothing at or above the high
watermark, nothing below a DeleteRecords point — HTTP over a real socket and the CLI as a real
subprocess, on generated partitions:

* ``vis-0``: HW in the middle of a batch of a ROLLED segment, tiered (``log.eligibility = rolled``
  tiers it) and then deleted locally: the records above the HW exist only in the remote tier;
* ``vis-1``: HW at a batch boundary inside the active segment: the local tier;
* ``del-0``: DeleteRecords in the middle of a batch of tiered segment 3, then local retention past
  it (the broker's checkpoint forgets the point; rlm must not).

Expected answers come from a brute-force decode of the original ``.log`` files restricted to the
visible offsets (tests/lookup/edges.py).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from rlm.formats.records import decode_records, iter_batches
from rlm.http.app import create_app
from rlm.http.server import ApiServer
from rlm.logdir.discovery import list_segments
from rlm.storage.local import LocalBackend
from rlm.testing.daemon import rlm_cli
from rlm.tiering.local.state import Progress, default_state_dir
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read.readers import TieredReaders
from rlm.tiering.store import object_keys
from tests.lookup.edges import HOT_TS, EdgeLogs, build_edge_logs
from tests.lookup.helpers import write_config


@dataclass
class Edge:
    url: str
    config: Path
    built: EdgeLogs

    def __getattr__(self, name: str) -> Any:
        return getattr(self.built, name)

    def get(self, path: str, **params: Any) -> httpx.Response:
        return httpx.get(self.url + path, params=params or None, timeout=30)

    def lookup(self, name: str, kind: str, value: int) -> dict[str, Any]:
        topic, _, p = name.rpartition("-")
        resp = self.get(f"/v1/topics/{topic}/partitions/{p}/{kind}/{value}")
        assert resp.status_code == 200, resp.text
        doc: dict[str, Any] = resp.json()
        return doc

    def records(self, name: str, offset: int, **params: Any) -> httpx.Response:
        topic, _, p = name.rpartition("-")
        return self.get(f"/v1/topics/{topic}/partitions/{p}/records", offset=offset, **params)


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    tmp = tmp_path_factory.mktemp("visibility")
    built = build_edge_logs(tmp)
    # A fresh reader side (persisted progress only), as `rlm run` serves after a restart.
    readers = TieredReaders(built.settings, LocalBackend(root=str(built.store)))
    status_manager = RemoteLogManager(built.settings, LocalBackend(root=str(built.store)))
    app = create_app(
        readers,
        built.settings.server,
        status=status_manager.status,
        registry=status_manager.shared.metrics.registry,
    )
    server = ApiServer(app, "127.0.0.1", 0).start()
    config = write_config(tmp / "rlm.toml", [built.logs], store=built.store, eligibility="rolled")
    try:
        yield Edge(server.url, config, built)
    finally:
        server.stop()


def _part(manager: RemoteLogManager, name: str) -> Any:
    return next(p for p in manager.discover() if p.name == name)


def _probe_offsets(edge: Edge, name: str) -> list[int]:
    """Offsets all over the log: below/at/above both bounds, and a spread in between."""
    vis = edge.visible[name]
    end = edge.log_end[name]
    spread = list(range(0, end, max(1, end // 40)))
    return sorted(
        {
            *spread,
            0,
            max(0, vis.start - 1),
            vis.start,
            vis.end - 1,
            vis.end,
            vis.end + 1,
            end - 1,
            end,
            end + 5,
        }
    )


# --- HTTP -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["vis-0", "vis-1", "del-0"])
def test_offset_lookups_answer_only_visible_records(edge: Edge, name: str) -> None:
    vis = edge.visible[name]
    for offset in _probe_offsets(edge, name):
        doc = edge.lookup(name, "offsets", offset)
        want = vis.first_offset_ge(offset) if offset >= vis.start else None
        if want is None:
            assert doc["found"] is False, (offset, doc)
            assert doc["valid_ranges"]["visible"] == [vis.start, vis.end]
        else:
            assert doc["found"] and (doc["offset"], doc["timestamp"]) == (want.offset, want.timestamp), offset


@pytest.mark.parametrize("name", ["vis-0", "vis-1", "del-0"])
def test_timestamp_lookups_answer_only_visible_records(edge: Edge, name: str) -> None:
    vis = edge.visible[name]
    stamps = sorted({r.timestamp for r in vis.log.records})
    for ts in [*stamps[:: max(1, len(stamps) // 50)], *stamps[-5:], HOT_TS]:
        doc = edge.lookup(name, "timestamps", ts)
        want = vis.first_ts_ge(ts)
        if want is None:
            assert doc["found"] is False, (ts, doc)
        else:
            assert doc["found"] and doc["offset"] == want.offset, (ts, doc, want)
    assert max(stamps) > max(r.timestamp for r in vis.records)  # invisible records are the newest


@pytest.mark.parametrize("name", ["vis-0", "vis-1", "del-0"])
def test_list_offsets_specs_follow_kafka(edge: Edge, name: str) -> None:
    vis = edge.visible[name]
    latest = edge.lookup(name, "timestamps", -1)
    assert latest["found"] and latest["offset"] == vis.end
    earliest = edge.lookup(name, "timestamps", -2)
    assert earliest["found"] and earliest["offset"] == vis.start
    top = edge.lookup(name, "timestamps", -3)
    want = vis.max_ts_record()
    assert (top["offset"], top["timestamp"]) == (want.offset, want.timestamp)
    local_start = list_segments(edge.logs / name)[0].base_offset
    earliest_local = edge.lookup(name, "timestamps", -4)
    assert earliest_local["offset"] == min(local_start, vis.end)  # clamped to the HW
    tiered = edge.lookup(name, "timestamps", -5)
    last_tiered = min(edge.highest_tiered[name], vis.end - 1)
    assert tiered["found"] and tiered["tier"] == "remote"
    assert tiered["offset"] == vis.first_offset_ge(last_tiered).offset  # type: ignore[union-attr]
    assert tiered["offset"] < vis.end


@pytest.mark.parametrize("name", ["vis-0", "vis-1", "del-0"])
def test_fetch_returns_whole_visible_batches_and_nothing_at_the_hw(edge: Edge, name: str) -> None:
    vis = edge.visible[name]
    for offset in [
        vis.start,
        *(r.offset for r in vis.records[:: max(1, len(vis.records) // 12)]),
        vis.end - 3,
        vis.end - 1,
    ]:
        for max_bytes in (1, 4_000, 1 << 20):
            resp = edge.records(name, offset, max_bytes=max_bytes)
            assert resp.status_code == 200, (offset, resp.text)
            want = vis.fetch(offset, max_bytes)
            assert resp.content == b"".join(b.data for b in want), (offset, max_bytes)
            assert all(b.last_offset < vis.end for b in iter_batches(resp.content))
            assert int(resp.headers["x-rlm-high-watermark"]) == vis.end
            doc = edge.records(name, offset, max_bytes=max_bytes, format="json").json()
            offsets = [r["offset"] for b in doc["batches"] for r in b["records"]]
            raw = [r.offset for b in iter_batches(resp.content) for r in decode_records(resp.content, b)]
            assert offsets == [o for o in raw if o >= vis.start]  # never a deleted record
    at_hw = edge.records(name, vis.end)
    assert (at_hw.status_code, at_hw.content) == (200, b"")
    assert (at_hw.headers["x-rlm-batches"], at_hw.headers["x-rlm-next-offset"]) == ("0", str(vis.end))
    assert edge.records(name, vis.end, format="json").json()["batches"] == []
    for beyond in {vis.end + 1, edge.log_end[name]} - {vis.end}:
        resp = edge.records(name, beyond)
        assert resp.status_code == 416 and resp.json()["error"]["field"] == "offset", resp.text


def test_fetch_below_the_delete_records_point_is_out_of_range(edge: Edge) -> None:
    for offset in (0, edge.point - 1):
        resp = edge.records("del-0", offset)
        assert resp.status_code == 416, resp.text
    # At the point: the whole batch holding it, as Kafka returns it (it starts below the point).
    resp = edge.records("del-0", edge.point)
    first = next(iter_batches(resp.content))
    assert first.base_offset < edge.point <= first.last_offset
    assert resp.headers["x-rlm-tier"] == "remote"


def test_offsets_for_times_resumes_at_the_hw_not_the_log_end(edge: Edge) -> None:
    resp = httpx.post(edge.url + "/v1/offsets-for-times", json={"timestamp": HOT_TS}, timeout=30)
    assert resp.status_code == 200, resp.text
    got = {f"{r['topic']}-{r['partition']}": r["offset"] for r in resp.json()}
    assert got == {name: vis.end for name, vis in edge.visible.items()}
    early = httpx.post(edge.url + "/v1/offsets-for-times", json={"timestamp": 0}, timeout=30).json()
    assert {f"{r['topic']}-{r['partition']}": r["offset"] for r in early} == {
        name: vis.start for name, vis in edge.visible.items()
    }


def test_status_says_which_bound_applies(edge: Edge) -> None:
    rows = {f"{r['topic']}-{r['partition']}": r for r in edge.get("/v1/partitions").json()}
    for name, vis in edge.visible.items():
        row = rows[name]
        assert row["high_watermark_source"] == "checkpoint"
        assert row["high_watermark"] == row["visible_end_offset"] == vis.end
        assert row["log_start_offset"] == vis.start
        assert row["log_end_offset"] == edge.log_end[name]
    assert rows["del-0"]["delete_records_offset"] == edge.point
    assert rows["del-0"]["remote_log_start_offset"] == edge.point
    assert rows["vis-0"]["delete_records_offset"] == -1


# --- DeleteRecords: the store and the persisted point -----------------------------------------------


def test_delete_records_removes_wholly_deleted_remote_segments(edge: Edge) -> None:
    assert edge.delete_pass.error is None
    assert edge.delete_pass.deleted == edge.records_deleted  # exactly the segments wholly below
    backend = edge.manager.shared.backend
    remaining = sorted(
        b
        for info in backend.list(object_keys.manifests_prefix("del", 0))
        if (b := object_keys.parse_manifest_key("del", 0, info.key)) is not None
    )
    assert remaining and not set(remaining) & set(edge.records_deleted)
    assert remaining[0] < edge.point  # the boundary segment stays (its earlier records unserved)
    for base in edge.records_deleted:  # data objects too
        assert not list(backend.list(f"{object_keys.data_prefix('del', 0)}{base:020d}-"))
    ctx = edge.manager.context(_part(edge.manager, "del-0"))  # the manager that ran the passes
    finished = [e.base_offset for e in ctx.journal.events() if e.type == "DELETE_FINISHED"]
    assert finished == edge.records_deleted


def test_the_delete_records_point_survives_the_checkpoint_and_a_rebuild(edge: Edge) -> None:
    state = default_state_dir(edge.logs) / "del-0" / "progress.json"
    assert Progress.load(state).delete_records_offset == edge.point
    assert "del 0" not in (edge.logs / "log-start-offset-checkpoint").read_text()
    edge.manager.rebuild_index()
    assert Progress.load(state).delete_records_offset == edge.point
    assert edge.lookup("del-0", "offsets", edge.point - 1)["found"] is False
    assert edge.lookup("del-0", "timestamps", -2)["offset"] == edge.point


# --- the CLI (real subprocesses) ---------------------------------------------------------------------


def test_cli_lookup_fetch_and_offsets_for_times(edge: Edge) -> None:
    vis = edge.visible["vis-0"]

    def cli(*args: Any) -> Any:
        proc = rlm_cli(*args, "--config", edge.config)
        return proc

    above = cli("lookup", "--topic", "vis", "--partition", 0, "--offset", vis.end)
    assert above.returncode == 0 and json.loads(above.stdout)["found"] is False
    latest = cli("lookup", "--topic", "vis", "--partition", 0, "--timestamp", -1)
    assert json.loads(latest.stdout)["offset"] == vis.end
    at_hw = cli("fetch", "--topic", "vis", "--partition", 0, "--offset", vis.end)
    assert (at_hw.returncode, at_hw.stdout) == (0, ""), at_hw.stderr
    past = cli("fetch", "--topic", "vis", "--partition", 0, "--offset", vis.end + 1)
    assert past.returncode == 2 and "out of range" in past.stderr and past.stderr.count("\n") == 1
    rows = cli("fetch", "--topic", "vis", "--partition", 0, "--offset", vis.end - 40)
    got = [json.loads(line)["offset"] for line in rows.stdout.splitlines()]
    want = [
        r.offset
        for b in vis.fetch(vis.end - 40, 1 << 20)
        for r in decode_records(b.data, next(iter_batches(b.data)))
        if r.offset >= vis.end - 40
    ]
    assert got == want and got and max(got) < vis.end
    deleted = cli("lookup", "--topic", "del", "--partition", 0, "--offset", 100)
    assert json.loads(deleted.stdout)["found"] is False
    boundary = cli("fetch", "--topic", "del", "--partition", 0, "--offset", edge.point, "--max-bytes", 1)
    values = [json.loads(line) for line in boundary.stdout.splitlines()]
    assert values[0]["offset"] == edge.point and values[0]["tier"] == "remote"
    assert all(base64.b64decode(v["value"]) != b"hot" for v in values)
    csv_rows = cli("offsets-for-times", "--timestamp", HOT_TS)
    assert csv_rows.returncode == 0, csv_rows.stderr
    assert sorted(csv_rows.stdout.split()) == sorted(
        f"{n.rpartition('-')[0]},{n.rpartition('-')[2]},{v.end}" for n, v in edge.visible.items()
    )
