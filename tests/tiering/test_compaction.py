"""Compacted topics (docs/topic-policy.md): not tiered by default; with archive_compacted the remote
tier keeps the pre-compaction history — a cleaner rewrite of tiered segments is detected and shown
(status, metric), never re-uploaded, and tiered offsets are answered from the remote tier."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlm.config import load_settings
from rlm.formats.checkpoint import format_offset_checkpoint
from rlm.formats.records import RecordSpec, decode_records, iter_batches
from rlm.logdir.discovery import SegmentFiles, list_segments
from rlm.logdir.writer import LogWriter
from rlm.storage.local import LocalBackend
from rlm.testing.configs import write_config
from rlm.tiering.converge.compaction import find_rewrites
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read.readers import TieredReaders
from rlm.tiering.store.manifest import SegmentManifest, StoredObject

TOPIC = "state"
TS = 1_700_000_000_000


def _write(logs: Path) -> None:
    """Ten records per batch, keys k0..k9 over and over, ~4 batches per segment."""
    with LogWriter(logs, TOPIC, 0, segment_bytes=1200, index_interval_bytes=256) as w:
        for b in range(40):
            w.append([RecordSpec(TS + b, f"k{i}".encode(), f"v{b}-{i}".encode()) for i in range(10)])
        w.high_watermark = w.log_end_offset


def _compact(part: Path, count: int) -> tuple[int, list[int]]:
    """What Kafka's cleaner does to ``count`` rolled segments from the second one: one new segment
    named after the first base, every other batch dropped. Returns (base, dropped batch offsets)."""
    segments = list_segments(part)[1 : 1 + count]
    kept, dropped = bytearray(), []
    index = 0
    for seg in segments:
        data = seg.log.read_bytes()
        for batch in iter_batches(data):
            if index % 2:
                dropped.append(batch.base_offset)
            else:
                kept += data[batch.position : batch.end_position]
            index += 1
    for seg in segments:
        for path in (seg.log, seg.index, seg.time_index):
            if path is not None:
                path.unlink()
    (part / segments[0].log.name).write_bytes(bytes(kept))  # indexes rebuilt by Kafka: none here
    (part.parent / "cleaner-offset-checkpoint").write_text(
        format_offset_checkpoint({(TOPIC, 0): segments[-1].base_offset})
    )
    return segments[0].base_offset, dropped


def _setup(tmp_path: Path, **topics: Any) -> tuple[Path, Path, LocalBackend]:
    logs = tmp_path / "logs"
    _write(logs)
    cfg = write_config(
        tmp_path / "c.toml", [logs], root=tmp_path / "store", eligibility="rolled", topics=topics or None
    )
    return logs, cfg, LocalBackend(root=str(tmp_path / "store"))


def test_archive_compacted(tmp_path: Path) -> None:
    logs, cfg, backend = _setup(tmp_path, overrides={"st*": {"archive_compacted": True}})
    mgr = RemoteLogManager(load_settings(cfg), backend, metrics=TieringMetrics())
    first = mgr.run_once()[0]
    assert first.error is None and len(first.copied) >= 6
    objects = sorted((i.key, i.size) for i in backend.list(""))
    part = logs / f"{TOPIC}-0"
    base, dropped = _compact(part, 3)
    mgr = RemoteLogManager(load_settings(cfg), backend, metrics=TieringMetrics())
    again = mgr.run_once()[0]
    assert again.error is None and again.copied == [] and again.deleted == []
    assert sorted((i.key, i.size) for i in backend.list("")) == objects  # nothing re-uploaded
    row = mgr.status()[0]
    assert row["tiered"] and row["last_error"] is None
    assert row["policy"]["cleanup_policy"]["from"].endswith("(cleaner-offset-checkpoint)")
    assert len(row["compaction"]) == 1
    found = row["compaction"][0]
    assert found["base_offset"] == base and len(found["tiered_segments"]) == 3
    assert found["tiered_segments"][0] == base and found["untiered_from"] is None
    assert (
        mgr.shared.metrics.registry.get_sample_value(
            "rlm_compacted_local_segments", {"topic": TOPIC, "partition": "0"}
        )
        == 1
    )
    # A dropped offset is answered from the remote tier (the local copy would skip ahead to the
    # next kept batch); a kept one too, so every tiered offset has one consistent answer.
    readers = TieredReaders(load_settings(cfg), backend)
    reader = readers.reader(TOPIC, 0)
    for offset in (dropped[0], dropped[0] - 10, dropped[-1] + 3):
        answer = reader.lookup_offset(offset)
        assert answer.found and answer.tier == "remote" and answer.offset == offset, answer
    local = reader.lookup_offset(dropped[0], tier="local")
    assert local.tier == "local" and local.offset == dropped[0] + 10  # what the local copy says
    records = reader.fetch(dropped[0], 1)
    assert records.tier == "remote"
    first_batch = next(iter_batches(records.data))
    assert next(r.offset for r in decode_records(records.data, first_batch)) == dropped[0]


def test_rewrite_across_the_tiered_boundary_is_reported_not_copied(tmp_path: Path) -> None:
    logs, _, backend = _setup(tmp_path)
    cfg = write_config(
        tmp_path / "hw.toml",
        [logs],
        root=tmp_path / "store",
        topics={"overrides": {"*": {"archive_compacted": True}}},
    )
    (logs / "cleaner-offset-checkpoint").write_text(format_offset_checkpoint({(TOPIC, 0): 0}))
    part = logs / f"{TOPIC}-0"
    segments = list_segments(part)
    end = (logs / "replication-offset-checkpoint").read_text()
    # The high watermark holds the last two rolled segments back: the others are tiered.
    (logs / "replication-offset-checkpoint").write_text(
        format_offset_checkpoint({(TOPIC, 0): segments[-3].base_offset})
    )
    first = RemoteLogManager(load_settings(cfg), backend).run_once()[0]
    assert first.error is None and first.copied[-1] == segments[-4].base_offset
    # The cleaner merges the last tiered segment with the first untiered one; the HW moves on.
    merged = segments[-4].log.read_bytes() + segments[-3].log.read_bytes()
    for path in (segments[-3].log, segments[-3].index, segments[-3].time_index):
        assert path is not None
        path.unlink()
    segments[-4].log.write_bytes(merged)
    (logs / "replication-offset-checkpoint").write_text(end)
    mgr = RemoteLogManager(load_settings(cfg), backend, metrics=TieringMetrics())
    result = mgr.run_once()[0]
    assert result.error is None
    # Later segments are still tiered: the merged one is skipped and reported, nothing stops.
    assert result.copied == [segments[-2].base_offset]
    row = mgr.status()[0]
    assert row["last_error"] is None
    found = row["compaction"]
    assert [(f["base_offset"], f["untiered_from"]) for f in found] == [
        (segments[-4].base_offset, segments[-3].base_offset)
    ]


def test_compacted_topics_are_not_tiered_by_default(tmp_path: Path) -> None:
    logs, cfg, backend = _setup(tmp_path)
    (logs / "cleaner-offset-checkpoint").write_text(format_offset_checkpoint({(TOPIC, 0): 0}))
    mgr = RemoteLogManager(load_settings(cfg), backend, metrics=TieringMetrics())
    assert mgr.run_once() == []
    assert list(backend.list("")) == []
    row = mgr.status()[0]
    assert row["tiered"] is False and row["policy"]["source"] == "kafka"
    assert "compacted topic" in row["excluded_reason"] and "archive_compacted" in row["excluded_reason"]
    assert (
        mgr.shared.metrics.registry.get_sample_value("rlm_partitions_excluded", {"reason": "compacted"}) == 1
    )


def _m(base: int, last: int, size: int) -> SegmentManifest:
    return SegmentManifest(
        TOPIC, 0, base, last, 0, 0, size, 1, 1, f"a{base}", 0, {"log": StoredObject(f"k{base}", size, 0)}
    )


def _s(base: int, size: int) -> SegmentFiles:
    return SegmentFiles(base, Path(f"{base:020d}.log"), size)


def test_find_rewrites_pure() -> None:
    remote = [_m(10, 19, 100), _m(20, 29, 100), _m(30, 39, 100)]
    # Identical segments, one below the remote start (local retention is behind), the active one.
    assert find_rewrites([_s(0, 50), _s(10, 100), _s(20, 100), _s(30, 100), _s(40, 0)], remote) == []
    # Rewritten in place (same base, smaller) and two merged into one.
    shrunk = find_rewrites([_s(10, 60), _s(20, 150), _s(40, 0)], remote)
    assert [(r.base_offset, r.end_offset, r.tiered_bases, r.untiered_from) for r in shrunk] == [
        (10, 20, (10,), None),
        (20, 40, (20, 30), None),
    ]
    # Merged with offsets that were never tiered.
    across = find_rewrites([_s(30, 180), _s(50, 0)], remote)
    assert [(r.base_offset, r.untiered_from) for r in across] == [(30, 40)]
    assert "offsets 40-49" in across[0].describe()
    assert find_rewrites([_s(10, 1)], remote) == [] and find_rewrites([_s(10, 1), _s(20, 0)], []) == []
    # A local segment in a gap between remote segments is a missing segment, not a rewrite.
    assert find_rewrites([_s(20, 100), _s(30, 0)], [remote[0], remote[2]]) == []
