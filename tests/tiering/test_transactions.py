"""read_committed end to end (docs/transactions.md): the uploaded aborted-transaction index, and
every read surface (in-process readers, HTTP json and raw, the CLI, the plan + decode path the
Spark jobs run) against a brute-force oracle that decodes the logs with kafka-python.

Logs are written with rlm's LogWriter: four producers' transactions interleaved, committed and
aborted, straddling small segments, some still open at the end (LSO below the high watermark).
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka.record.memory_records import MemoryRecords

from rlm.errors import CorruptIndexError, RlmHttpError
from rlm.formats.indexes.txn_index import AbortedTxn, collect_aborted, encode_txn_index, parse_txn_index
from rlm.formats.records import iter_batches
from rlm.http.app import create_app
from rlm.http.client import RlmClient
from rlm.http.server import ApiServer
from rlm.jobs.reading.decode import iter_task_records, read_task_bytes
from rlm.jobs.reading.plan import BackendSpec, plan_read
from rlm.logdir.discovery import list_segments
from rlm.storage.local import LocalBackend
from rlm.testing.daemon import rlm_cli
from rlm.tiering.copy.txn_capture import capture_txn_index
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read import isolation as txn
from rlm.tiering.read.readers import TieredReaders
from rlm.tiering.store import object_keys
from rlm.tiering.store.manifest import SegmentManifest
from tests.lookup.helpers import copy_fixture_logs, delete_local_segments, settings_for, write_config
from tests.needs import unavailable
from tests.tiering.txn_helpers import Oracle, kafka_txn_entry, write_broker_txn_indexes, write_txn_log

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path("/work/shared/fixtures")
KSQL = (
    "ItumelengMogase__Real-Time-Data-Pipeline-for-Patient-Admissions",
    "_confluent-ksql-default__command_topic",
)


# --- the format -------------------------------------------------------------------------------------


def test_txn_index_parses_kafkas_layout_and_refuses_damage() -> None:
    raw = kafka_txn_entry(7, 100, 120, 101) + kafka_txn_entry(9, 90, 130, 131)
    entries = parse_txn_index(raw, base_offset=100)
    assert entries == [AbortedTxn(100, 120, 7, 101), AbortedTxn(90, 130, 9, 131)]
    assert encode_txn_index(entries) == raw
    for bad, what in (
        (raw[:-3], "multiple of 34"),
        (kafka_txn_entry(1, 5, 6, 7, version=1), "version"),
        (kafka_txn_entry(1, 9, 6, 7), "firstOffset"),
        (raw[34:] + raw[:34], "increase"),
    ):
        with pytest.raises(CorruptIndexError, match=what):
            parse_txn_index(bad)
    with pytest.raises(CorruptIndexError, match="below the segment"):
        parse_txn_index(raw, base_offset=121)
    # Kafka's search: overlapping entries, complete once an LSO reaches the bound.
    assert collect_aborted(entries, 121, 140) == ([AbortedTxn(90, 130, 9, 131)], False)
    assert collect_aborted(entries, 0, 101) == ([entries[0]], True)


# --- a tiered transactional partition ---------------------------------------------------------------


@dataclass
class Tiered:
    logs: Path
    store: Path
    config: Path
    oracle: dict[str, Oracle]
    readers: TieredReaders
    backend: LocalBackend
    url: str


def _tier(root: Path, *, seeds: dict[int, tuple[int, bool]], keep_last: int = 3) -> tuple[Any, ...]:
    logs, store, state = root / "logs", root / "store", root / "state"
    for partition, (seed, leave_open) in seeds.items():
        write_txn_log(logs, "txn", partition, seed=seed, leave_open=leave_open)
    oracle = {f"txn-{p}": Oracle.of(logs / f"txn-{p}") for p in seeds}
    settings = settings_for(
        [logs],
        options={"root": str(store)},
        index_entry_bytes=2_000,
        state_dir=str(state),
        server={"host": "127.0.0.1", "port": 0},
    )
    backend = LocalBackend(root=str(store))
    manager = RemoteLogManager(settings, backend)
    assert all(r.error is None for r in manager.run_once())
    for p in seeds:
        delete_local_segments(logs / f"txn-{p}", keep_last=keep_last)
    config = write_config(
        root / "rlm.toml", [logs], store=store, index_entry_bytes=2_000, state_dir=str(state)
    )
    return logs, store, config, oracle, settings, backend, manager


@pytest.fixture(scope="module")
def tiered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiered]:
    root = tmp_path_factory.mktemp("txn")
    logs, store, config, oracle, settings, backend, manager = _tier(root, seeds={0: (5, True), 1: (9, False)})
    readers = TieredReaders(settings, backend, progress=manager.live_progress)
    server = ApiServer(
        create_app(readers, settings.server, status=manager.status, registry=manager.shared.metrics.registry),
        "127.0.0.1",
        0,
    ).start()
    try:
        yield Tiered(logs, store, config, oracle, readers, backend, server.url)
    finally:
        server.stop()


def _manifests(store: Path) -> list[tuple[Path, SegmentManifest]]:
    return [(p, SegmentManifest.from_json(p.read_bytes())) for p in sorted(store.rglob("manifests/*.json"))]


def _read_all(fetch: Any, start: int) -> tuple[list[tuple[int, bytes | None, bytes | None]], int]:
    """Fetch from ``start`` until the answer stops advancing; (records, where it stopped)."""
    offset, out = start, []
    while True:
        records, next_offset = fetch(offset)
        out += records
        if next_offset == offset:
            return out, offset
        offset = next_offset


def _in_process(readers: TieredReaders, name: str, isolation: txn.Isolation, max_bytes: int) -> Any:
    topic, _, p = name.rpartition("-")

    def fetch(offset: int) -> tuple[list[Any], int]:
        res = txn.fetch(readers.reader(topic, int(p)), offset, max_bytes, isolation)
        return [
            (r.offset, r.key, r.value)
            for b in res.batches
            if not b.is_control
            for r in res.records(b, from_requested=True)
        ], res.next_offset

    return fetch


def _expected(records: list[Any]) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for r in records]


def test_the_logs_really_interleave_transactions(tiered: Tiered) -> None:
    o = tiered.oracle["txn-0"]
    assert len(o.aborted_txns) > 20 and o.aborted_offsets
    assert o.last_stable_offset < o.high_watermark  # transactions left open
    assert tiered.oracle["txn-1"].last_stable_offset == tiered.oracle["txn-1"].high_watermark
    segments = sorted(int(p.stem) for p in (tiered.store).rglob("manifests/*.json") if "txn-0" in str(p))
    spanning = [t for t in o.aborted_txns if any(t[1] < b <= t[2] for b in segments)]
    assert spanning, "some aborted transaction must straddle a segment boundary"


@pytest.mark.parametrize("max_bytes", [250, 4_000, 1 << 20])
@pytest.mark.parametrize("name", ["txn-0", "txn-1"])
def test_in_process_reads_match_the_oracle(tiered: Tiered, name: str, max_bytes: int) -> None:
    o = tiered.oracle[name]
    got, stop = _read_all(_in_process(tiered.readers, name, "read_committed", max_bytes), 0)
    assert got == _expected(o.committed)
    assert stop == o.last_stable_offset
    got, stop = _read_all(_in_process(tiered.readers, name, "read_uncommitted", max_bytes), 0)
    assert got == _expected(o.uncommitted)
    assert stop == o.high_watermark


def test_uploaded_indexes_hold_exactly_the_aborted_transactions(tiered: Tiered) -> None:
    for name, o in tiered.oracle.items():
        stored: list[tuple[int, int, int]] = []
        for _path, m in _manifests(tiered.store):
            if f"{m.topic}-{m.partition}" != name:
                continue
            assert m.txn_index is not None and m.txn_index["source"] == "rebuilt"  # LogWriter writes none
            obj = m.objects.get("txn_index")
            assert (obj is None) == (m.txn_index["entries"] == 0)
            if obj is not None:
                entries = parse_txn_index(tiered.backend.read(obj.key), m.base_offset)
                assert len(entries) == m.txn_index["entries"]
                assert all(m.base_offset <= e.last_offset <= m.last_offset for e in entries)
                stored += [(e.producer_id, e.first_offset, e.last_offset) for e in entries]
        tiered_upto = max(
            m.last_offset for _p, m in _manifests(tiered.store) if f"{m.topic}-{m.partition}" == name
        )
        assert stored == [t for t in o.aborted_txns if t[2] <= tiered_upto]


def _raw_records(body: bytes) -> list[tuple[int, bytes | None, bytes | None]]:
    records = MemoryRecords(body)
    out = []
    while (batch := records.next_batch()) is not None:
        assert not batch.is_control_batch
        out += [(r.offset, r.key, r.value) for r in batch]
    return out


def test_http_json_and_raw_read_committed(tiered: Tiered) -> None:
    with RlmClient(tiered.url) as client:
        for name, o in tiered.oracle.items():
            topic, _, p = name.rpartition("-")

            def json_fetch(
                offset: int, t: str = topic, q: int = int(p), o: Oracle = o
            ) -> tuple[list[Any], int]:
                doc = client.fetch_json(t, q, offset, 3_000, isolation="read_committed")
                assert doc["isolation"] == "read_committed"
                assert doc["last_stable_offset"] == o.last_stable_offset
                recs = [
                    (r["offset"], _b64(r["key"]), _b64(r["value"]))
                    for b in doc["batches"]
                    for r in b["records"]
                    if r["offset"] >= offset
                ]
                assert all(not b["is_control"] for b in doc["batches"])
                return recs, doc["next_offset"]

            def raw_fetch(
                offset: int, t: str = topic, q: int = int(p), o: Oracle = o
            ) -> tuple[list[Any], int]:
                body, headers = client.fetch_raw(t, q, offset, 3_000, isolation="read_committed")
                assert int(headers["x-rlm-last-stable-offset"]) == o.last_stable_offset
                return ([r for r in _raw_records(body) if r[0] >= offset], int(headers["x-rlm-next-offset"]))

            for fetch in (json_fetch, raw_fetch):
                got, stop = _read_all(fetch, 0)
                assert got == _expected(o.committed) and stop == o.last_stable_offset
            # the streaming read: whole committed batches back to back, several requests
            streamed = [
                (r.offset, r.key, r.value)
                for r in client.iter_records(
                    topic, int(p), 0, request_bytes=5_000, isolation="read_committed"
                )
            ]
            assert streamed == _expected(o.committed)
        with pytest.raises(RlmHttpError) as err:
            client.fetch_json("txn", 0, 0, isolation="snapshot")
        assert err.value.status == 400


def _b64(v: str | None) -> bytes | None:
    import base64

    return None if v is None else base64.b64decode(v)


def test_cli_fetch_read_committed(tiered: Tiered) -> None:
    o = tiered.oracle["txn-0"]
    for offset in (0, 200, o.last_stable_offset - 40):
        proc = rlm_cli(
            "fetch",
            "--config",
            tiered.config,
            "--topic",
            "txn",
            "--partition",
            0,
            "--offset",
            offset,
            "--max-bytes",
            5_000,
            "--isolation",
            "read_committed",
        )
        assert proc.returncode == 0, proc.stderr
        lines = [json.loads(line) for line in proc.stdout.splitlines()]
        got = [(d["offset"], _b64(d["key"]), _b64(d["value"])) for d in lines]
        res = txn.fetch(tiered.readers.reader("txn", 0), offset, 5_000, "read_committed")
        want = [r for r in _expected(o.committed) if offset <= r[0] < (res.next_offset or 0)]
        assert got == want and not any(d["is_control"] for d in lines)
        assert not {d["offset"] for d in lines} & o.aborted_offsets
    bad = rlm_cli(
        "fetch",
        "--config",
        tiered.config,
        "--topic",
        "txn",
        "--partition",
        0,
        "--offset",
        0,
        "--isolation",
        "serializable",
    )
    assert bad.returncode != 0


def test_plan_and_decode_path_of_the_spark_jobs(tiered: Tiered) -> None:
    """What read_tiered / export run on executors, in-process: plan_read + read_task_bytes +
    iter_task_records (the Spark wrapper is tested once in tests/spark)."""
    settings = tiered.readers.settings
    spec = BackendSpec.from_settings(settings)
    for isolation, want in (("read_committed", "committed"), ("read_uncommitted", "uncommitted")):
        plan = plan_read(settings, ["txn"], target_bytes=3_000, isolation=isolation)  # type: ignore[arg-type]
        for part in plan.partitions:
            o = tiered.oracle[f"txn-{part.partition}"]
            rows = [
                (r[2], r[0], r[1]) for t in part.tasks for r in iter_task_records(t, read_task_bytes(t, spec))
            ]
            assert rows == _expected(getattr(o, want))


# --- segments tiered before the index was captured --------------------------------------------------


def test_old_manifests_without_txn_index_are_scanned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _logs, store, _config, oracle, settings, backend, manager = _tier(tmp_path, seeds={0: (13, True)})
    for path, _m in _manifests(store):  # as written before rlm captured the index
        doc = json.loads(path.read_bytes())
        doc.pop("txn_index")
        obj = doc["objects"].pop("txn_index", None)
        if obj is not None:
            backend.delete(obj["key"])
        path.write_text(json.dumps(doc))
    readers = TieredReaders(settings, backend, progress=manager.live_progress)
    o = oracle["txn-0"]
    with caplog.at_level(logging.INFO, logger="rlm.tiering.read.partition_txns"):
        got, stop = _read_all(_in_process(readers, "txn-0", "read_committed", 4_000), 0)
    assert got == _expected(o.committed) and stop == o.last_stable_offset
    assert "tiered before rlm captured its transaction index: scanned its control batches" in caplog.text
    res = txn.fetch(readers.reader("txn", 0), 0, 4_000, "read_committed")
    assert any(s.endswith(object_keys.LOG) for s in res.txn_scanned)  # remote segments, not only local ones


# --- the broker's own .txnindex ---------------------------------------------------------------------


def test_brokers_txnindex_is_checked_then_uploaded_or_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    logs, store = tmp_path / "logs", tmp_path / "store"
    write_txn_log(logs, "txn", 0, seed=21, leave_open=False)
    part = logs / "txn-0"
    o = Oracle.of(part)
    written = write_broker_txn_indexes(part, o)
    damaged, wrong = sorted(written)[1], sorted(written)[2]
    (part / f"{damaged:020d}.txnindex").write_bytes(written[damaged][:-5])  # torn
    first = parse_txn_index(written[wrong])[0]  # names a producer whose marker this is not
    (part / f"{wrong:020d}.txnindex").write_bytes(
        kafka_txn_entry(first.producer_id + 1, first.first_offset, first.last_offset, 0) + written[wrong][34:]
    )
    settings = settings_for([logs], options={"root": str(store)}, state_dir=str(tmp_path / "state"))
    backend = LocalBackend(root=str(store))
    manager = RemoteLogManager(settings, backend)
    with caplog.at_level(logging.INFO, logger="rlm.tiering.copy.txn_capture"):
        assert all(r.error is None for r in manager.run_once())
    # Local reads use the broker's files too: the disagreeing one is caught, the torn one scanned.
    readers = TieredReaders(settings, backend, progress=manager.live_progress)
    with caplog.at_level(logging.WARNING, logger="rlm.tiering.read.partition_txns"):
        got, stop = _read_all(_in_process(readers, "txn-0", "read_committed", 2_000), 0)
    assert got == _expected(o.committed) and stop == o.last_stable_offset
    assert f"{wrong:020d}.txnindex: its entries do not name" in caplog.text
    sources = {m.base_offset: m.txn_index["source"] for _p, m in _manifests(store) if m.txn_index}
    assert sources[damaged] == sources[wrong] == "rebuilt"
    assert all(sources[b] == "broker" for b in written if b not in (damaged, wrong) and b in sources)
    assert "not a multiple of 34" in caplog.text and "ABORT markers" in caplog.text
    stored = []
    for _p, m in _manifests(store):
        obj = m.objects.get("txn_index")
        if obj is not None:
            entries = parse_txn_index(backend.read(obj.key))
            stored += [(e.producer_id, e.first_offset, e.last_offset) for e in entries]
    upto = max(m.last_offset for _p, m in _manifests(store))
    assert stored == [t for t in o.aborted_txns if t[2] <= upto]
    # the broker's file is never written
    assert (part / f"{damaged:020d}.txnindex").read_bytes() == written[damaged][:-5]


def test_partial_copy_keeps_the_slices_entries_with_their_true_first_offsets(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_txn_log(logs, "txn", 0, seed=5, leave_open=False, segment_bytes=20_000)
    part = logs / "txn-0"
    o = Oracle.of(part)
    segs = list_segments(part)
    seg = segs[1]
    batches = list(iter_batches(seg.log.read_bytes()))
    cut = batches[len(batches) // 2]
    pin = tmp_path / "pin"
    pin.mkdir()
    tail = pin / object_keys.LOG
    tail.write_bytes(seg.log.read_bytes()[cut.position :])
    tail_batches = list(iter_batches(tail.read_bytes()))
    got = capture_txn_index(seg, {object_keys.LOG: tail}, tail_batches, cut.position)
    end = segs[2].base_offset
    want = [t for t in o.aborted_txns if cut.base_offset <= t[2] < end]
    assert want and any(t[1] < cut.base_offset for t in want), "a transaction must begin before the slice"
    assert [(e.producer_id, e.first_offset, e.last_offset) for e in got.entries] == want
    assert got.path is not None and parse_txn_index(got.path.read_bytes()) == list(got.entries)


# --- the real broker's transactional fixture --------------------------------------------------------


def test_ksql_fixture_commit_is_read_committed(tmp_path: Path) -> None:
    if not FIXTURES.is_dir():
        unavailable("no Kafka fixtures: set RLM_FIXTURES or put shared/fixtures beside the repo")
    src_dir, topic = KSQL
    copied = {d.name: d for d in copy_fixture_logs(FIXTURES, tmp_path / "logs")}
    logs = copied[src_dir]
    for other in [d for d in logs.iterdir() if d.is_dir() and not d.name.startswith(topic)]:
        shutil.rmtree(other)
    part = logs / f"{topic}-0"
    o = Oracle.of(part)
    assert [r.offset for r in o.committed] == [0] and o.last_stable_offset == 2
    settings = settings_for(
        [logs], options={"root": str(tmp_path / "store")}, state_dir=str(tmp_path / "state")
    )
    backend = LocalBackend(root=str(tmp_path / "store"))
    manager = RemoteLogManager(settings, backend)
    assert all(r.error is None for r in manager.run_once())
    delete_local_segments(part, keep_last=1)
    readers = TieredReaders(settings, backend, progress=manager.live_progress)
    res = txn.fetch(readers.reader(topic, 0), 0, 1 << 20, "read_committed")
    assert res.tier == "remote" and [b.base_offset for b in res.batches] == [0] and res.next_offset == 2
    assert [r.value for b in res.batches for r in res.records(b)] == [o.committed[0].value]
    (m,) = [m for _p, m in _manifests(tmp_path / "store")]
    # Offset 0 starts with nothing open and the COMMIT closed the one transaction: none open after.
    assert m.txn_index == {"source": "rebuilt", "entries": 0, "open_at_end": []}
    assert "txn_index" not in m.objects
