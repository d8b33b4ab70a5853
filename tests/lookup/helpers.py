"""Shared by the lookup and HTTP acceptance tests: private copies of the fixture log dirs, configs,
the CLI as a real subprocess, a request-counting backend wrapper, and brute-force answers.

The brute force never goes through the lookup code: it decodes every batch of every ``.log``
file in offset order (rlm's batch codec, itself cross-checked with kafka-python elsewhere) and
answers by a linear scan.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlm.config import Settings, settings_from_mapping
from rlm.formats import naming
from rlm.formats.records import RecordBatch, decode_records, iter_batches
from rlm.logdir.discovery import list_segments
from rlm.testing.toml import toml_value
from tests.tiering.helpers import roll_after_last

REPO = Path(__file__).resolve().parents[2]
ARTHUR = "ArthurArutunyan04__Backend_labs"


# --- the store, counted ---------------------------------------------------------------------------


# --- log dirs ---------------------------------------------------------------------------------------


def copy_fixture_logs(fixtures_dir: Path, dest: Path) -> list[Path]:
    """A private copy of every fixture log dir (never the originals), each partition rolled once."""
    dirs = []
    for src in sorted((fixtures_dir / "kafka-logs").iterdir()):
        dst = dest / src.name
        shutil.copytree(src, dst)
        for part in sorted(p for p in dst.iterdir() if p.is_dir()):
            if any(part.glob("*.log")):
                roll_after_last(part)
        dirs.append(dst)
    return dirs


def delete_local_segments(partition_dir: Path, keep_last: int = 1) -> list[int]:
    """Delete the oldest segments' .log/.index/.timeindex (as the log store does once they are
    tiered), keeping the newest ``keep_last``; returns the deleted base offsets."""
    segments = list_segments(partition_dir)
    doomed = segments[: max(0, len(segments) - keep_last)]
    for seg in doomed:
        for suffix in (naming.LOG, naming.INDEX, naming.TIME_INDEX):
            (partition_dir / naming.segment_file_name(seg.base_offset, suffix)).unlink(missing_ok=True)
    return [s.base_offset for s in doomed]


def settings_for(
    log_dirs: Iterable[Path],
    *,
    backend: str = "local",
    options: dict[str, Any] | None = None,
    eligibility: str = "rolled",
    server: dict[str, Any] | None = None,
    **tiering: Any,
) -> Settings:
    tiering.setdefault("gc_grace_ms", 0)
    raw: dict[str, Any] = {
        "log": {"dirs": [str(d) for d in log_dirs], "eligibility": eligibility},
        "remote": {"backend": backend, "options": options or {}},
        "tiering": tiering,
    }
    if server:
        raw["server"] = server
    return settings_from_mapping(raw)


def write_config(
    path: Path,
    log_dirs: Iterable[Path],
    *,
    store: Path,
    eligibility: str = "rolled",
    follow_kafka_configs: bool = False,
    leadership: str = "always",
    serve_internal_topics: bool = False,
    remote: tuple[str, dict[str, Any]] | None = None,
    **tiering: Any,
) -> Path:
    """A TOML config with the local backend rooted at ``store``. Kafka's topic configs in the
    fixtures' metadata logs are not followed by default: these tests are about lookups, not the
    topic policy (their retention.ms is the broker's local retention and deletes nothing remote,
    docs/topic-policy.md §1; tests/tiering/test_retention_tiers.py follows one). Every partition is led
    here by default (``[cluster] leadership``): the fixtures come from three clusters whose
    brokers were stopped (no leaders in their metadata logs). ``remote``: another backend and
    its options instead of the local one (``store`` unused then)."""
    tiering.setdefault("gc_grace_ms", 0)
    lines = [
        "[log]",
        f"dirs = {json.dumps([str(d) for d in log_dirs])}",
        f"eligibility = {json.dumps(eligibility)}",
        "[remote]",
        f"backend = {json.dumps(remote[0] if remote else 'local')}",
        "[remote.options]",
        *(
            [f"{k} = {toml_value(v)}" for k, v in remote[1].items() if v is not None]
            if remote
            else [f"root = {json.dumps(str(store))}"]
        ),
        "[topics]",
        f"follow_kafka_configs = {json.dumps(follow_kafka_configs)}",
        "[cluster]",
        f"leadership = {json.dumps(leadership)}",
        "[tiering]",
    ] + [f"{k} = {json.dumps(v)}" for k, v in tiering.items()]
    if serve_internal_topics:  # docs/visibility.md, "Internal topics"
        lines += ["[server]", "serve_internal_topics = true"]
    path.write_text("\n".join(lines) + "\n")
    return path


# --- brute force ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BruteRecord:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    batch_base: int
    batch_last: int


@dataclass(frozen=True)
class BruteBatch:
    segment_base: int
    batch: RecordBatch
    data: bytes


@dataclass
class BruteLog:
    """Every batch and record of a partition, in offset order, decoded from its .log files."""

    batches: list[BruteBatch]
    records: list[BruteRecord]

    @classmethod
    def scan(cls, partition_dir: Path) -> BruteLog:
        batches: list[BruteBatch] = []
        records: list[BruteRecord] = []
        for seg in list_segments(partition_dir):
            buf = seg.log.read_bytes()
            for b in iter_batches(buf):
                batches.append(BruteBatch(seg.base_offset, b, buf[b.position : b.end_position]))
                for r in decode_records(buf, b):
                    records.append(
                        BruteRecord(r.offset, r.timestamp, r.key, r.value, b.base_offset, b.last_offset)
                    )
        return cls(batches, records)

    def first_offset_ge(self, offset: int) -> BruteRecord | None:
        return next((r for r in self.records if r.offset >= offset), None)

    def first_ts_ge(self, ts: int, *, min_offset: int = 0) -> BruteRecord | None:
        return next((r for r in self.records if r.timestamp >= ts and r.offset >= min_offset), None)

    def segment_batches_from(self, offset: int) -> list[BruteBatch]:
        """The batches a Kafka fetch at ``offset`` may return: from the first batch with
        last_offset ≥ offset to the end of that batch's segment."""
        start = next(i for i, b in enumerate(self.batches) if b.batch.last_offset >= offset)
        seg = self.batches[start].segment_base
        out = []
        for b in self.batches[start:]:
            if b.segment_base != seg:
                break
            out.append(b)
        return out


def expected_fetch(log: BruteLog, offset: int, max_bytes: int) -> list[BruteBatch]:
    """Kafka fetch: whole batches from the one holding ``offset`` while the total ≤ max_bytes, ≥ 1."""
    out: list[BruteBatch] = []
    total = 0
    for b in log.segment_batches_from(offset):
        if out and total + b.batch.size > max_bytes:
            break
        out.append(b)
        total += b.batch.size
    return out


def fixture_partitions(expected: dict[str, Any]) -> Iterable[tuple[str, str, str, int, list[dict[str, Any]]]]:
    """(source dir, partition dir, topic, partition, segments) of every fixture partition."""
    for src, parts in expected.items():
        for pname, segs in parts.items():
            if pname == "_kraft_snapshots":
                continue  # _kraft_snapshots: not a partition
            topic, _, p = pname.rpartition("-")
            yield src, pname, topic, int(p), segs


def expected_ts_answer(segs: list[dict[str, Any]], seg: dict[str, Any], q: dict[str, Any]) -> int | None:
    """The partition-wide answer of a per-segment timestamp query: a segment's null (ts above its
    max) becomes the next segment's first offset when that segment's records are all ≥ ts."""
    want = q["first_offset_with_ts_ge"]
    if want is None:
        later = [s for s in segs if s["first_offset"] > seg["last_offset"]]
        if later:
            assert later[0]["min_record_ts"] >= q["ts"], "query not answerable from expected.json"
            want = later[0]["first_offset"]
    return want  # type: ignore[no-any-return]


# --- generated partitions ---------------------------------------------------------------------------


def write_generated(
    log_dir: Path,
    topic: str = "orders",
    partition: int = 0,
    *,
    batches: int = 300,
    seed: int = 7,
    segment_bytes: int = 16_384,
    t0: int = 1_700_000_000_000,
) -> None:
    """A deterministic partition: mixed codecs, 1–20 records per batch, timestamps mostly rising with
    some out of order, several segments, closed like a clean shutdown (checkpoints written)."""
    import random

    from rlm.formats.compression import Compression
    from rlm.formats.records import RecordSpec
    from rlm.logdir.writer import LogWriter

    rnd = random.Random(seed)
    codecs = [Compression.NONE, Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD]
    ts = t0
    with LogWriter(
        log_dir, topic, partition, segment_bytes=segment_bytes, index_interval_bytes=1024, clock=lambda: t0
    ) as w:
        for i in range(batches):
            recs = []
            for _ in range(rnd.randint(1, 20)):
                ts += rnd.randint(-300, 1_000)
                recs.append(RecordSpec(ts, f"key-{i}".encode(), rnd.randbytes(rnd.randint(10, 200))))
            w.append(recs, compression=codecs[i % len(codecs)])
