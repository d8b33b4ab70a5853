"""``rlm restore`` (docs/restore.md): where the restored log starts and ends — ``--from-offset``,
``--from-timestamp``, nothing to restore, the high watermark inside a tiered segment, a DeleteRecords
point as the restored log start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlm.config import settings_from_mapping
from rlm.errors import InvalidArgumentError, RlmError
from rlm.formats import naming
from rlm.formats.checkpoint import (
    format_offset_checkpoint,
    parse_offset_checkpoint,
)
from rlm.formats.records import RecordSpec
from rlm.jobs.restore import StartAt, restore
from rlm.logdir.discovery import (
    LOG_START_OFFSET_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
)
from rlm.logdir.writer import LogWriter
from rlm.storage.registry import create_backend
from rlm.tiering.manager import RemoteLogManager
from tests.jobs.restore_helpers import (
    check_loadable,
    delete_local_logs,
    original_segments,
    read_checkpoint,
    records_by_partition,
    segments_of,
    tier_generated_logs,
    tiered_partitions,
)
from tests.lookup.helpers import delete_local_segments
from tests.spark.conftest import kafka_python_records, tier

# --- where the restored log starts and ends -------------------------------------------------------


@pytest.fixture(scope="module")
def gen_tiered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every codec tiered, every local rolled segment deleted (read-only)."""
    root = tmp_path_factory.mktemp("restore-gen")
    settings, dirs = tier_generated_logs(root, {"backend": "local", "options": {"root": str(root / "store")}})
    originals, records = original_segments(dirs, tiered_partitions(settings)), records_by_partition(dirs)
    delete_local_logs(dirs)
    return {
        "settings": settings,
        "originals": originals,
        "records": records,
        "backend": create_backend("local", {"root": str(root / "store")}),
    }


def test_from_offset_starts_at_the_segment_holding_it(gen_tiered: dict[str, Any], tmp_path: Path) -> None:
    segments = segments_of(gen_tiered["originals"]["gen-1"])
    base, last = segments[2][0], segments[2][1]
    assert last > base + 2
    result = restore(
        gen_tiered["settings"],
        gen_tiered["backend"],
        "gen",
        tmp_path,
        partitions=[1],
        start=StartAt(offset=base + 2),
    ).to_json()
    restored = tmp_path / "gen-1"
    assert sorted(p.name for p in restored.glob("*.log")) == [
        naming.segment_file_name(s[0], naming.LOG) for s in segments[2:]
    ]
    for s in segments[2:]:
        assert (restored / naming.segment_file_name(s[0], naming.LOG)).read_bytes() == s[3]
    check_loadable(restored)
    assert kafka_python_records(restored) == [
        r for r in gen_tiered["records"]["gen-1"] if base <= r[0] <= segments[-1][1]
    ]
    assert ("gen", 1) not in read_checkpoint(tmp_path, LOG_START_OFFSET_CHECKPOINT)  # the data starts at base
    [row] = result["partitions"]
    assert (row["log_start_offset"], row["log_end_offset"]) == (base, segments[-1][1] + 1)
    assert list(tmp_path.iterdir()) and not (tmp_path / "gen-0").exists()


def test_from_timestamp_starts_at_the_first_segment_with_a_record_that_recent(
    gen_tiered: dict[str, Any], tmp_path: Path
) -> None:
    segments = segments_of(gen_tiered["originals"]["gen-3"])
    assert len(segments) >= 3
    ts = segments[-2][2]  # timestamps go backwards too: an earlier segment may hold one as recent
    first = next(i for i, s in enumerate(segments) if s[2] >= ts)
    restore(
        gen_tiered["settings"],
        gen_tiered["backend"],
        "gen",
        tmp_path,
        partitions=[3],
        start=StartAt(timestamp=ts),
    )
    assert sorted(p.name for p in (tmp_path / "gen-3").glob("*.log")) == [
        naming.segment_file_name(s[0], naming.LOG) for s in segments[first:]
    ]
    records = kafka_python_records(tmp_path / "gen-3")
    assert records[0][0] == segments[first][0] and any(r[1] >= ts for r in records)


def test_nothing_to_restore_is_one_clear_error_and_writes_nothing(
    gen_tiered: dict[str, Any], tmp_path: Path
) -> None:
    last = segments_of(gen_tiered["originals"]["gen-0"])[-1][1]
    with pytest.raises(InvalidArgumentError, match=rf"gen-0: no tiered segment .* offset {last + 1}"):
        restore(
            gen_tiered["settings"],
            gen_tiered["backend"],
            "gen",
            tmp_path / "out",
            partitions=[0],
            start=StartAt(offset=last + 1),
        )
    with pytest.raises(RlmError, match=r"gen-9 is not in log.dirs"):
        restore(gen_tiered["settings"], gen_tiered["backend"], "gen", tmp_path / "out", partitions=[9])
    assert not (tmp_path / "out").exists()


def test_high_watermark_inside_a_tiered_segment_cuts_it_at_a_batch_boundary(tmp_path: Path) -> None:
    """``log.eligibility = "rolled"`` tiers rolled segments above a lagging high watermark: the
    restored log ends at the last whole batch below it, its indexes rebuilt for the cut file."""
    logs = tmp_path / "logs"
    with LogWriter(logs, "cut", 0, segment_bytes=2048, index_interval_bytes=256) as w:
        for i in range(120):
            w.append([RecordSpec(1_700_000_000_000 + i, b"k", bytes([i]) * (40 + i % 7))] * (1 + i % 3))
        bases = w.segment_base_offsets
        hw = bases[2] + 5
        w.high_watermark = hw
    want = [r for r in kafka_python_records(logs / "cut-0") if r[0] < hw]
    store = {"backend": "local", "options": {"root": str(tmp_path / "s")}}
    settings = settings_from_mapping(
        {
            "log": {"dirs": [str(logs)], "eligibility": "rolled"},
            "remote": store,
            "tiering": {"gc_grace_ms": 0},
        }
    )
    tier(settings)
    delete_local_segments(logs / "cut-0", keep_last=1)
    backend = create_backend("local", {"root": str(tmp_path / "s")})
    [row] = restore(settings, backend, "cut", tmp_path / "out").to_json()["partitions"]
    restored = tmp_path / "out" / "cut-0"
    check_loadable(restored)
    got = kafka_python_records(restored)
    end = got[-1][0] + 1
    assert got == [r for r in want if r[0] < end] and hw - 3 <= end <= hw  # whole batches only
    assert row["cut_segments"] == 1 and row["log_end_offset"] == end
    assert read_checkpoint(tmp_path / "out", REPLICATION_OFFSET_CHECKPOINT)[("cut", 0)] == end
    last_name = sorted(p.name for p in restored.glob("*.log"))[-1]
    assert last_name == naming.segment_file_name(bases[2], naming.LOG)


def test_delete_records_point_is_the_restored_log_start(tmp_path: Path) -> None:
    """A DeleteRecords point inside a tiered segment (remembered by the daemon after the broker
    forgot it): that segment is restored whole and the log start checkpoint says where the
    visible data starts."""
    settings, dirs = tier_generated_logs(
        tmp_path, {"backend": "local", "options": {"root": str(tmp_path / "store")}}
    )
    segments = segments_of(original_segments(dirs, tiered_partitions(settings))["gen-2"])
    point = segments[1][0] + 3
    ckpt = dirs[0] / LOG_START_OFFSET_CHECKPOINT
    entries = parse_offset_checkpoint(ckpt.read_bytes()).entries if ckpt.exists() else {}
    entries[("gen", 2)] = point
    ckpt.write_text(format_offset_checkpoint(entries))
    manager = RemoteLogManager(settings, create_backend("local", {"root": str(tmp_path / "store")}))
    assert all(r.error is None for r in manager.run_once())  # persists the point, drops segment 0
    delete_local_logs(dirs)
    ckpt.write_text(format_offset_checkpoint({k: v for k, v in entries.items() if k != ("gen", 2)}))
    backend = create_backend("local", {"root": str(tmp_path / "store")})
    restore(settings, backend, "gen", tmp_path / "out", partitions=[2])
    assert sorted(p.name for p in (tmp_path / "out" / "gen-2").glob("*.log"))[0] == naming.segment_file_name(
        segments[1][0], naming.LOG
    )
    assert read_checkpoint(tmp_path / "out", LOG_START_OFFSET_CHECKPOINT)[("gen", 2)] == point
