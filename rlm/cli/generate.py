"""``rlm generate --out DIR [--topic NAME[:PARTITIONS] ...] [--seed N]`` — a demo Kafka log dir.

Writes partitions with :class:`rlm.logdir.writer.LogWriter`, so the files are laid out exactly as a
broker writes them: several segments per partition, batches in all five codecs, out-of-order
CreateTime timestamps, a leader-epoch change, Kafka's indexes and the log dir's checkpoints. Some
partitions get a high watermark below their last rolled segment (a lagging follower), so the
``high-watermark`` eligibility rule visibly holds a segment back. The same seed gives the same bytes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import click

from rlm.cli.errors import handle_errors
from rlm.errors import InvalidArgumentError, LogDirError
from rlm.formats.compression import Compression
from rlm.formats.naming import validate_topic
from rlm.formats.records import Header, RecordSpec
from rlm.logdir.discovery import PartitionState, eligible_segments, list_segments
from rlm.logdir.writer import LogWriter

__all__ = ["DEFAULT_TOPICS", "EPOCH_MS", "PartitionSummary", "generate", "generate_log_dir", "parse_topic"]

#: Topic names exercising '-', '.' and '_' (the partition follows the last '-').
DEFAULT_TOPICS: tuple[tuple[str, int], ...] = (
    ("orders-eu.v1", 2),
    ("click_stream", 2),
    ("metrics.cpu-load_1m", 1),
)
#: Demo time starts here (2025-01-01T00:00:00Z) so output does not depend on the wall clock.
EPOCH_MS = 1_735_689_600_000


@dataclass(frozen=True, slots=True)
class PartitionSummary:
    """What was written for one partition."""

    topic: str
    partition: int
    segments: int
    records: int
    log_end_offset: int
    high_watermark: int
    eligible_segments: int


def parse_topic(text: str) -> tuple[str, int]:
    """``"name"`` or ``"name:partitions"`` (1..64 partitions) → (name, partitions)."""
    name, _, count = text.rpartition(":") if ":" in text else (text, "", "1")
    try:
        partitions = int(count)
    except ValueError:
        raise InvalidArgumentError(f"--topic {text!r}: partitions must be an integer") from None
    if not 1 <= partitions <= 64:
        raise InvalidArgumentError(f"--topic {text!r}: partitions must be in 1..64")
    try:
        validate_topic(name)
    except LogDirError as exc:  # a bad name on the command line is a usage error (exit 2)
        raise InvalidArgumentError(f"--topic {text!r}: {exc}") from exc
    return name, partitions


class _DemoClock:
    """Follows the generated record time, so time-based rolls are deterministic."""

    def __init__(self) -> None:
        self.now = EPOCH_MS

    def __call__(self) -> int:
        return self.now


def _write_partition(
    out: Path,
    topic: str,
    partition: int,
    rng: random.Random,
    *,
    records: int,
    segment_bytes: int,
    lagging: bool,
) -> PartitionSummary:
    clock = _DemoClock()
    codecs = list(Compression)
    writer = LogWriter(
        out,
        topic,
        partition,
        segment_bytes=segment_bytes,
        segment_ms=3_600_000,
        index_interval_bytes=4096,
        clock=clock,
    )
    with writer:
        written = 0
        while written < records:
            count = min(records - written, rng.randint(1, 20))
            clock.now += rng.randint(0, 2_000)
            specs = []
            for i in range(count):
                # Producers stamp records slightly out of order: jitter of up to 1.5 s backwards.
                ts = clock.now - rng.randint(0, 1_500) if rng.random() < 0.2 else clock.now + i
                key = f"key-{rng.randint(0, 99)}".encode()
                value = bytes(rng.choice(b"abcdefgh ") for _ in range(rng.randint(20, 400)))
                headers = (Header("seq", str(written + i).encode()),) if rng.random() < 0.3 else ()
                specs.append(RecordSpec(ts, key, value, headers))
            if written >= records // 2 and writer.leader_epoch == 0:
                writer.leader_epoch = 1  # a leader change halfway, recorded in leader-epoch-checkpoint
            writer.append(specs, compression=rng.choice(codecs))
            written += count
        bases = writer.segment_base_offsets
        if lagging and len(bases) >= 2:
            # Committed data ends inside the last rolled segment: that segment is not yet eligible.
            writer.high_watermark = bases[-1] - 1
        summary_hw = writer.high_watermark
        summary_leo = writer.log_end_offset
    segments = list_segments(writer.path)
    eligible = eligible_segments(segments, PartitionState(high_watermark=summary_hw))
    return PartitionSummary(
        topic=topic,
        partition=partition,
        segments=len(segments),
        records=records,
        log_end_offset=summary_leo,
        high_watermark=summary_hw,
        eligible_segments=len(eligible),
    )


def generate_log_dir(
    out: Path,
    topics: Sequence[tuple[str, int]] = DEFAULT_TOPICS,
    *,
    seed: int = 0,
    records: int = 1500,
    segment_bytes: int = 64 * 1024,
) -> list[PartitionSummary]:
    """Write the demo log dir under ``out`` (created if needed); deterministic for a given seed.

    Every second partition (in creation order) lags: its high watermark is one below its active
    segment's base. Raises :class:`rlm.errors.LogDirError` if a partition already has segments.
    """
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    summaries: list[PartitionSummary] = []
    n = 0
    for topic, partitions in topics:
        for partition in range(partitions):
            part_rng = random.Random(rng.getrandbits(64))
            summaries.append(
                _write_partition(
                    out,
                    topic,
                    partition,
                    part_rng,
                    records=records,
                    segment_bytes=segment_bytes,
                    lagging=n % 2 == 1,
                )
            )
            n += 1
    return summaries


@click.command()
@click.option(
    "--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Log dir."
)
@click.option(
    "--topic",
    "--topics",
    "topics",
    multiple=True,
    metavar="NAME[:PARTITIONS]",
    help="Topic to create (repeatable); default: a few topics with '-', '.', '_' in their names.",
)
@click.option("--seed", default=0, show_default=True, type=int, help="Same seed, same bytes.")
@click.option(
    "--records", default=1500, show_default=True, type=click.IntRange(1), help="Records per partition."
)
@click.option(
    "--segment-bytes", default=64 * 1024, show_default=True, type=click.IntRange(1024), help="segment.bytes."
)
@handle_errors
def generate(out: Path, topics: tuple[str, ...], seed: int, records: int, segment_bytes: int) -> None:
    """Write a demo Kafka log dir (several topics, partitions, segments and codecs) under --out."""
    specs = [parse_topic(t) for t in topics] if topics else list(DEFAULT_TOPICS)
    summaries = generate_log_dir(out, specs, seed=seed, records=records, segment_bytes=segment_bytes)
    for s in summaries:
        click.echo(
            f"{s.topic}-{s.partition}: {s.segments} segments, {s.records} records, "
            f"log end {s.log_end_offset}, high watermark {s.high_watermark}, {s.eligible_segments} eligible"
        )
    total_segments = sum(s.segments for s in summaries)
    click.echo(f"wrote {len(summaries)} partitions, {total_segments} segments to {out}")
