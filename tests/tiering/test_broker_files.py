"""Broker files are checked before use and before upload (issue #20 point 4, docs/broker-files.md).

Every partition is written by the real :class:`rlm.logdir.writer.LogWriter` and tiered by the real
engine to the real local backend. A *clean* copy of the same log dir is the oracle: a broken
``.index``/``.timeindex`` must change nothing a reader or the store sees (the rebuild is used and
uploaded), and a damaged ``.log`` must stop its partition at that segment, visibly, until the
broker replaces or removes the file.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from rlm.config import Settings, settings_from_mapping
from rlm.formats.compression import Compression
from rlm.formats.records import RecordSpec, iter_batches
from rlm.http.app import create_app
from rlm.http.server import ApiServer
from rlm.logdir.discovery import SegmentFiles, list_segments
from rlm.logdir.writer import LogWriter
from rlm.storage.local import LocalBackend
from rlm.testing.configs import write_config
from rlm.testing.daemon import rlm_cli
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read.readers import TieredReaders
from tests.lookup.helpers import delete_local_segments

T0 = 1_700_000_000_000
INTERVAL = 1_024  # index.interval.bytes of the generated logs, and log.index_interval_bytes
TOPIC = "bf"


def _write(log_dir: Path, topic: str, partition: int, seed: int, batches: int = 160) -> None:
    """Several ~6 KiB segments with ~5 index entries each; timestamps rise with some going back."""
    rnd = random.Random(seed)
    ts = T0
    with LogWriter(
        log_dir, topic, partition, segment_bytes=6_000, index_interval_bytes=INTERVAL, clock=lambda: T0
    ) as w:
        for i in range(batches):
            recs = []
            for _ in range(rnd.randint(1, 6)):
                ts += rnd.randint(-200, 900)
                recs.append(RecordSpec(ts, f"k{i}".encode(), rnd.randbytes(rnd.randint(10, 120))))
            w.append(recs, compression=(Compression.NONE, Compression.GZIP)[i % 2])


def _settings(logs: Path, store: Path) -> Settings:
    return settings_from_mapping(
        {
            "log": {"dirs": [str(logs)], "index_interval_bytes": INTERVAL},
            "remote": {"backend": "local", "options": {"root": str(store)}},
            "tiering": {"gc_grace_ms": 0},
        }
    )


def _manager(logs: Path, store: Path) -> RemoteLogManager:
    return RemoteLogManager(_settings(logs, store), LocalBackend(root=str(store)), metrics=TieringMetrics())


def _answers(logs: Path, store: Path, topic: str = TOPIC) -> list[tuple[Any, ...]]:
    """Offset and timestamp lookups over the whole partition: (query, found, tier, offset, ts)."""
    readers = TieredReaders(_settings(logs, store), LocalBackend(root=str(store)))
    reader = readers.reader(topic, 0)
    out: list[tuple[Any, ...]] = []
    end = reader.lookup_offset(0).ranges.log_end_offset or 0
    for offset in range(0, end + 2, 7):
        r = reader.lookup_offset(offset)
        out.append(("offset", offset, r.found, r.tier, r.offset, r.timestamp))
    for ts in range(T0 - 1_000, T0 + end * 400, 2_345):
        r = reader.lookup_timestamp(ts)
        out.append(("timestamp", ts, r.found, r.tier, r.offset, r.timestamp))
    return out


def _damage_index(path: Path, entry_size: int, damage: str) -> bytes:
    raw = path.read_bytes()
    assert len(raw) >= 3 * entry_size, "the victim index must have several entries"
    if damage == "random":
        data = random.Random(3).randbytes(len(raw))
    elif damage == "backwards":
        entries = [raw[i : i + entry_size] for i in range(0, len(raw), entry_size)]
        data = b"".join(reversed(entries))
    else:  # wrong_length: a half-written entry after the real ones
        data = raw + b"\x01\x02\x03\x04\x05"
    path.write_bytes(data)
    return data


def _index_objects(store: Path, topic: str = TOPIC) -> dict[int, tuple[bytes, bytes]]:
    """Per remote segment: the uploaded (.index, .timeindex) bytes."""
    backend = LocalBackend(root=str(store))
    out = {}
    for info in backend.list(f"{topic}-0/manifests/"):
        doc = json.loads(backend.read(info.key))
        objects = doc["objects"]
        out[doc["base_offset"]] = (
            backend.read(objects["index"]["key"]),
            backend.read(objects["timeindex"]["key"]),
        )
    return out


def _rebuilds(manager: RemoteLogManager, kind: str) -> float:
    value = manager.shared.metrics.registry.get_sample_value(
        "rlm_local_index_rebuilds_total", {"topic": TOPIC, "partition": "0", "index": kind}
    )
    return value or 0.0


@pytest.mark.parametrize("kind", ["index", "timeindex"])
@pytest.mark.parametrize("damage", ["random", "backwards", "wrong_length"])
def test_broken_index_is_rebuilt_used_and_uploaded(
    tmp_path: Path, kind: str, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    clean, broken = tmp_path / "clean", tmp_path / "broken"
    _write(clean, TOPIC, 0, seed=1)
    shutil.copytree(clean, broken)
    victim = list_segments(broken / f"{TOPIC}-0")[1]
    path = victim.index if kind == "index" else victim.time_index
    assert path is not None
    damaged = _damage_index(path, 8 if kind == "index" else 12, damage)
    m_clean, m_broken = _manager(clean, tmp_path / "s1"), _manager(broken, tmp_path / "s2")
    before = _rebuilds(m_broken, kind)

    # Local lookups (nothing tiered yet) answer as the clean copy does, and the file is named.
    with caplog.at_level(logging.WARNING, logger="rlm.logdir.indexcheck"):
        assert _answers(broken, tmp_path / "s2") == _answers(clean, tmp_path / "s1")
    warnings = [r.getMessage() for r in caplog.records if str(path) in r.getMessage()]
    assert warnings and "rebuild" in warnings[0], caplog.text

    # Tiering uploads the rebuild: byte for byte what the clean copy uploads; the broker's file
    # is left as it was.
    assert all(r.error is None for r in m_clean.run_once())
    assert all(r.error is None for r in m_broken.run_once())
    uploaded, expected = _index_objects(tmp_path / "s2"), _index_objects(tmp_path / "s1")
    assert victim.base_offset in uploaded and uploaded == expected
    assert path.read_bytes() == damaged
    assert _rebuilds(m_broken, kind) == before + 1  # one broken file version, counted once

    # Once the broker deleted the local copies, remote answers equal the clean copy's too.
    for logs in (clean, broken):
        delete_local_segments(logs / f"{TOPIC}-0", keep_last=1)
    remote = _answers(broken, tmp_path / "s2")
    assert remote == _answers(clean, tmp_path / "s1")
    assert any(a[3] == "remote" for a in remote if a[0] == "timestamp")


def test_zero_tail_and_missing_index_are_uploaded_as_kafka_would_have_them(tmp_path: Path) -> None:
    """A rolled index with a preallocated zero tail (a crash before Kafka trimmed it) is valid and
    uploaded trimmed; a missing one is rebuilt. Neither is a broken file (no count)."""
    clean, odd = tmp_path / "clean", tmp_path / "odd"
    _write(clean, TOPIC, 0, seed=4)
    shutil.copytree(clean, odd)
    segments = list_segments(odd / f"{TOPIC}-0")
    assert segments[0].index is not None and segments[1].time_index is not None
    segments[0].index.write_bytes(segments[0].index.read_bytes() + bytes(8 * 50))
    segments[1].time_index.unlink()
    m_clean, m_odd = _manager(clean, tmp_path / "s1"), _manager(odd, tmp_path / "s2")
    before = _rebuilds(m_odd, "index") + _rebuilds(m_odd, "timeindex")
    assert all(r.error is None for r in m_clean.run_once() + m_odd.run_once())
    assert _index_objects(tmp_path / "s2") == _index_objects(tmp_path / "s1")
    assert _rebuilds(m_odd, "index") + _rebuilds(m_odd, "timeindex") == before


# --- damaged .log files: quarantine ---------------------------------------------------------------


def _damage_log(seg: SegmentFiles, damage: str) -> tuple[int, str]:
    """Damage a rolled .log in place; returns (byte position rlm must report, cause)."""
    good = seg.log.read_bytes()
    batches = list(iter_batches(good))
    middle = batches[len(batches) // 2]
    if damage == "empty":
        seg.log.write_bytes(b"")
        return 0, "empty"
    if damage == "truncated":
        seg.log.write_bytes(good[: middle.position + middle.size // 2])
        return middle.position, "torn_tail"
    data = bytearray(good)
    data[middle.position + middle.size - 3] ^= 0x10  # a bit inside the batch's records
    seg.log.write_bytes(bytes(data))
    return middle.position, "corrupt"


def _last_rolled_offset(partition_dir: Path) -> int:
    return list_segments(partition_dir)[-1].base_offset - 1


def _rows(manager: RemoteLogManager) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["topic"], r["partition"]): r for r in manager.status()}


def _assert_quarantine_metrics(
    manager: RemoteLogManager, victim: SegmentFiles, position: int, cause: str
) -> dict[str, str]:
    """The quarantine shows in the metrics; returns the info metric's labels."""
    registry = manager.shared.metrics.registry
    assert registry.get_sample_value("rlm_segments_quarantined", {"topic": TOPIC, "partition": "0"}) == 1
    info = {
        "topic": TOPIC,
        "partition": "0",
        "base_offset": str(victim.base_offset),
        "file": str(victim.log),
        "position": str(position),
        "cause": cause,
    }
    assert registry.get_sample_value("rlm_segment_quarantine_info", info) == 1
    return info


@pytest.mark.parametrize("fix", ["replaced", "removed"])
@pytest.mark.parametrize("damage", ["empty", "truncated", "bitflip"])
def test_damaged_log_is_quarantined_shown_and_resumes(tmp_path: Path, damage: str, fix: str) -> None:
    logs, store = tmp_path / "logs", tmp_path / "store"
    _write(logs, TOPIC, 0, seed=1)
    _write(logs, "other", 0, seed=2)
    _write(logs, "other", 1, seed=3)
    segments = list_segments(logs / f"{TOPIC}-0")
    victim = segments[2]
    good = victim.log.read_bytes()
    position, cause = _damage_log(victim, damage)
    manager = _manager(logs, store)

    for _ in range(2):  # the second pass finds it again without copying past it
        results = {(r.topic, r.partition): r for r in manager.run_once()}
        assert results[("other", 0)].error is None and results[("other", 1)].error is None
    rows = _rows(manager)
    for p in (0, 1):  # the other partitions are fully tiered
        assert rows[("other", p)]["highest_tiered_offset"] == _last_rolled_offset(logs / f"other-{p}")
        assert rows[("other", p)]["quarantine"] == []
    row = rows[(TOPIC, 0)]
    assert row["highest_tiered_offset"] == victim.base_offset - 1  # the earlier segments went on
    assert row["copy_lag_segments"] == len(segments) - 1 - 2  # the victim and the later ones wait
    assert list(row["quarantined"]) == [victim.base_offset] and row["quarantined"][victim.base_offset]
    [q] = row["quarantine"]
    assert (q["base_offset"], q["file"], q["position"], q["cause"]) == (
        victim.base_offset,
        str(victim.log),
        position,
        cause,
    )
    assert str(victim.log) in q["reason"]
    info = _assert_quarantine_metrics(manager, victim, position, cause)

    # `rlm status` in another process shows what the daemon found.
    cfg = write_config(tmp_path / "c.toml", [logs], root=store)
    proc = rlm_cli("status", "--config", cfg)
    assert proc.returncode == 0, proc.stderr
    [cli_row] = [r for r in json.loads(proc.stdout) if r["topic"] == TOPIC]
    assert cli_row["quarantine"][0]["position"] == position
    assert cli_row["quarantined"] == {str(victim.base_offset): q["reason"]}

    if fix == "replaced":  # the broker writes a good copy (a new file renamed over the old one)
        tmp = victim.log.with_name("replacement.tmp")
        tmp.write_bytes(good)
        os.replace(tmp, victim.log)
    else:  # the broker's retention deletes the oldest segments, up to and including the victim
        delete_local_segments(logs / f"{TOPIC}-0", keep_last=len(segments) - 3)
        assert list_segments(logs / f"{TOPIC}-0")[0].base_offset == segments[3].base_offset
    assert all(r.error is None for r in manager.run_once())
    row = _rows(manager)[(TOPIC, 0)]
    assert row["quarantine"] == [] and row["quarantined"] == {}
    assert row["highest_tiered_offset"] == _last_rolled_offset(logs / f"{TOPIC}-0")
    assert manager.shared.metrics.registry.get_sample_value("rlm_segment_quarantine_info", info) is None
    remote = [
        m.base_offset
        for m in manager.context(next(p for p in manager.discover() if p.topic == TOPIC)).manifests
    ]
    assert (victim.base_offset in remote) == (fix == "replaced")


def test_quarantine_in_the_http_status_api(tmp_path: Path) -> None:
    logs, store = tmp_path / "logs", tmp_path / "store"
    _write(logs, TOPIC, 0, seed=5)
    victim = list_segments(logs / f"{TOPIC}-0")[1]
    position, cause = _damage_log(victim, "truncated")
    manager = _manager(logs, store)
    manager.run_once()
    settings = _settings(logs, store)
    readers = TieredReaders(settings, LocalBackend(root=str(store)), progress=manager.live_progress)
    app = create_app(
        readers, settings.server, status=manager.status, registry=manager.shared.metrics.registry
    )
    server = ApiServer(app, "127.0.0.1", 0).start()
    try:
        [row] = httpx.get(server.url + "/v1/partitions", timeout=30).json()
        metrics = httpx.get(server.url + "/metrics", timeout=30).text
    finally:
        server.stop()
    assert row["quarantined"] == {str(victim.base_offset): row["quarantine"][0]["reason"]}
    assert row["quarantine"][0]["file"] == str(victim.log)
    assert (row["quarantine"][0]["position"], row["quarantine"][0]["cause"]) == (position, cause)
    assert "rlm_segment_quarantine_info{" in metrics and f'position="{position}"' in metrics


# --- rlm verify reports the same local findings ---------------------------------------------------


def test_verify_reports_broken_indexes_and_quarantine_worthy_logs(tmp_path: Path) -> None:
    from rlm.jobs.checks.verify_local import check_local_segments
    from rlm.logdir.discovery import discover_partitions

    logs = tmp_path / "logs"
    _write(logs, TOPIC, 0, seed=1)
    _write(logs, "other", 0, seed=2)
    segments = list_segments(logs / f"{TOPIC}-0")
    assert segments[0].time_index is not None and segments[3].index is not None
    _damage_index(segments[0].time_index, 12, "backwards")
    position, cause = _damage_log(segments[2], "bitflip")
    (logs / f"{TOPIC}-0" / segments[3].index.name).write_bytes(b"\x07" * 13)
    found = {}
    for part in discover_partitions([logs]):
        found[part.name] = check_local_segments(part, INTERVAL)
    assert found["other-0"] == []
    by_key = {(p.check, p.key): p for p in found[f"{TOPIC}-0"]}
    assert set(by_key) == {
        ("local_broken_index", str(segments[0].time_index)),
        ("local_segment_quarantine", str(segments[2].log)),
        ("local_broken_index", str(segments[3].index)),
    }
    q = by_key[("local_segment_quarantine", str(segments[2].log))]
    assert (q.base_offset, q.position, q.severity) == (segments[2].base_offset, position, "error")
    assert cause in q.message
    bad_length = by_key[("local_broken_index", str(segments[3].index))]
    assert bad_length.position == 8 and "multiple of 8" in bad_length.message


def test_spark_planner_cuts_local_segments_only_at_real_batch_starts(tmp_path: Path) -> None:
    """The read planner splits local segments at .index positions: a broken index (here a
    structurally valid one whose middle entries point between batches) must not become a cut."""
    import struct

    from rlm.jobs.reading.plan import plan_partition
    from rlm.logdir.discovery import discover_partitions

    clean, broken = tmp_path / "clean", tmp_path / "broken"
    _write(clean, TOPIC, 0, seed=6)
    shutil.copytree(clean, broken)
    victim = list_segments(broken / f"{TOPIC}-0")[0]
    assert victim.index is not None
    entries = [list(e) for e in struct.iter_unpack(">ii", victim.index.read_bytes())]
    for e in entries[1:-1]:
        e[1] += 1  # still increasing, inside the file: only the batches show it is wrong
    victim.index.write_bytes(b"".join(struct.pack(">ii", *e) for e in entries))

    def local_tasks(logs: Path) -> list[tuple[str, int, int]]:
        [part] = discover_partitions([logs])
        plan = plan_partition(
            part, LocalBackend(root=str(tmp_path / "none")), target_bytes=1_200, index_interval_bytes=INTERVAL
        )
        return [(Path(t.location).name, t.start, t.end) for t in plan.tasks if t.source == "local"]

    assert local_tasks(broken) == local_tasks(clean)
    starts = {b.position for b in iter_batches(victim.log.read_bytes())}
    assert all(s in starts for name, s, _ in local_tasks(broken) if name == victim.log.name)
