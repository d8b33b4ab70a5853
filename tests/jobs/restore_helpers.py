"""What the ``rlm restore`` test modules share (tests/jobs/test_restore*.py): settings over a log dir
and a store, tiering generated logs, the original segments and records to compare a restore with,
and the byte-for-byte / loadable / record-by-record check of a restored directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlm.config import Settings, settings_from_mapping
from rlm.formats import naming
from rlm.formats.checkpoint import parse_offset_checkpoint
from rlm.formats.records import iter_batches
from rlm.logdir.discovery import (
    discover_partitions,
    list_segments,
)
from rlm.logdir.indexcheck import parse_checked
from rlm.storage.registry import open_backend
from rlm.tiering.store import object_keys
from tests.lookup.helpers import delete_local_segments
from tests.spark.conftest import CODECS, kafka_python_records, tier, write_generated

SEGMENT_SUFFIXES = (naming.LOG, naming.INDEX, naming.TIME_INDEX)


def restore_settings(log_dirs: list[Path], store: dict[str, Any], **tiering: Any) -> Settings:
    tiering.setdefault("gc_grace_ms", 0)
    return settings_from_mapping(
        {
            "log": {"dirs": [str(d) for d in log_dirs]},
            "remote": store,
            "tiering": tiering,
            "topics": {"follow_kafka_configs": False},  # about restore, not the topic policy
            "cluster": {"leadership": "always"},
        }
    )


def tiered_partitions(settings: Settings) -> set[str]:
    """The partition dir names the store holds data of (any root)."""
    remote = settings.remote
    backend = open_backend(remote.backend, remote.options, remote.prefix_spread)
    roots = (object_keys.parse_root(info.key) for info in backend.list(""))
    return {f"{r.topic}-{r.partition}" for r in roots if r is not None}


def original_segments(log_dirs: list[Path], tiered: set[str]) -> dict[str, dict[str, bytes]]:
    """Per tiered partition dir name: every rolled segment's files (the active one stays local)."""
    out: dict[str, dict[str, bytes]] = {}
    for part in discover_partitions(log_dirs):
        if part.name not in tiered:
            continue
        files: dict[str, bytes] = {}
        for seg in list_segments(part)[:-1]:
            for suffix in SEGMENT_SUFFIXES:
                path = part.path / naming.segment_file_name(seg.base_offset, suffix)
                if path.exists():
                    files[path.name] = path.read_bytes()
        if files:
            out[part.name] = files
    return out


def records_by_partition(log_dirs: list[Path]) -> dict[str, list[Any]]:
    return {p.name: kafka_python_records(p.path) for p in discover_partitions(log_dirs)}


def delete_local_logs(log_dirs: list[Path]) -> None:
    for part in discover_partitions(log_dirs):
        delete_local_segments(part.path, keep_last=1)


def check_loadable(part_dir: Path) -> None:
    """rlm's reader opens every segment: each batch CRC-valid, whole batches to the end, and
    the indexes pass rlm's broker-file checks against the batches (docs/broker-files.md)."""
    segments = list_segments(part_dir)
    assert segments
    for seg in segments:
        data = seg.log.read_bytes()
        batches = list(iter_batches(data, verify_crc=True))
        assert batches and batches[-1].position + batches[-1].size == len(data)
        assert batches[0].base_offset >= seg.base_offset
        for kind, path in (("index", seg.index), ("timeindex", seg.time_index)):
            assert path is not None and path.exists(), (seg.log, kind)
            parse_checked(kind, seg.base_offset, path.read_bytes(), batches)  # type: ignore[arg-type]


def read_checkpoint(out: Path, name: str) -> dict[tuple[str, int], int]:
    return parse_offset_checkpoint((out / name).read_bytes()).entries


def tier_generated_logs(root: Path, store: dict[str, Any]) -> tuple[Settings, list[Path]]:
    logs = root / "logs"
    logs.mkdir(parents=True)
    for p, codec in enumerate(CODECS):
        write_generated(logs, "gen", p, codec, seed=p, log_append_time=(p == 4))
    settings = restore_settings([logs], store, index_entry_bytes=8192)
    tier(settings)
    return settings, [logs]


def assert_restored(
    out: Path, originals: dict[str, dict[str, bytes]], records: dict[str, list[Any]], result: dict[str, Any]
) -> None:
    for name, files in originals.items():
        restored = out / name
        got = {p.name: p.read_bytes() for p in restored.iterdir() if p.suffix in SEGMENT_SUFFIXES}
        assert got == files, name
        check_loadable(restored)
        last = max(b.last_offset for f, d in files.items() if f.endswith(naming.LOG) for b in iter_batches(d))
        assert kafka_python_records(restored) == [r for r in records[name] if r[0] <= last], name
    assert result["restored_partitions"] == len(originals)


def segments_of(files: dict[str, bytes]) -> list[tuple[int, int, int, bytes]]:
    """(base, last offset, max timestamp, bytes) of each original ``.log``, in offset order."""
    out = []
    for name in sorted(f for f in files if f.endswith(naming.LOG)):
        batches = list(iter_batches(files[name]))
        out.append(
            (
                naming.parse_base_offset(name),
                batches[-1].last_offset,
                max(b.max_timestamp for b in batches),
                files[name],
            )
        )
    return out
