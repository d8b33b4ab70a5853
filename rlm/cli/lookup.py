"""``rlm lookup``, ``rlm offsets-for-times``, ``rlm fetch`` (docs/cli.md): read-only, any time."""

from __future__ import annotations

import base64
import csv
import json
import re
import sys
from pathlib import Path

import click

from rlm.cli.common import config_option, settings_for_tool, tracked_backend
from rlm.cli.errors import handle_errors
from rlm.errors import InvalidArgumentError
from rlm.tiering.read import TieredReaders
from rlm.tiering.read import isolation as txn

__all__ = ["fetch", "lookup", "offsets_for_times", "parse_duration_ms"]

_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d)?$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, None: 1}


def parse_duration_ms(text: str) -> int:
    """``15m`` → 900000; units ms, s, m, h, d (no unit = ms)."""
    m = _DURATION.match(text.strip())
    if not m:
        raise InvalidArgumentError(f"--minus {text!r}: expected a duration such as 500ms, 30s, 15m, 2h, 1d")
    return int(m.group(1)) * _UNIT_MS[m.group(2)]


def _readers(config_path: Path) -> TieredReaders:
    settings = settings_for_tool(config_path)
    return TieredReaders(settings, tracked_backend(settings))


@click.command("lookup")
@config_option
@click.option("--topic", required=True)
@click.option("--partition", required=True, type=click.IntRange(min=0))
@click.option("--offset", type=click.IntRange(min=0), help="first record offset >= this")
@click.option(
    "--timestamp",
    type=int,
    help="ms since the epoch, or -1 latest, -2 earliest, "
    "-3 max timestamp, -4 earliest local, -5 latest tiered",
)
@handle_errors
def lookup(config_path: Path, topic: str, partition: int, offset: int | None, timestamp: int | None) -> None:
    """Where is offset O / the first record at time TS: one JSON object."""
    if (offset is None) == (timestamp is None):
        raise click.UsageError("give exactly one of --offset and --timestamp")
    reader = _readers(config_path).reader(topic, partition)
    result = reader.lookup_offset(offset) if offset is not None else reader.lookup_timestamp(timestamp or 0)
    sys.stdout.write(json.dumps(result.to_json()) + "\n")


@click.command("offsets-for-times")
@config_option
@click.option("--timestamp", required=True, type=int, help="ms since the epoch")
@click.option("--topic", "topics", multiple=True, help="repeatable; default: every topic")
@click.option("--minus", default="0", help="safety margin subtracted from --timestamp, e.g. 15m")
@handle_errors
def offsets_for_times(config_path: Path, timestamp: int, topics: tuple[str, ...], minus: str) -> None:
    """CSV topic,partition,offset for `kafka-consumer-groups --reset-offsets --from-file`.

    Each offset is the first visible record with timestamp >= TS - MINUS in either tier; a
    partition with no record that recent gets its high watermark (consumers resume at the end of
    what is committed, docs/visibility.md).
    """
    rows = _readers(config_path).offsets_for_times(timestamp, list(topics) or None, parse_duration_ms(minus))
    out = csv.writer(sys.stdout, lineterminator="\n")
    for row in rows:
        out.writerow([row.topic, row.partition, row.offset])


@click.command("fetch")
@config_option
@click.option("--topic", required=True)
@click.option("--partition", required=True, type=click.IntRange(min=0))
@click.option("--offset", required=True, type=click.IntRange(min=0))
@click.option("--max-bytes", default=1 << 20, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "raw"]),
    default="json",
    show_default=True,
    help="json: decoded records (base64 keys/values); raw: the batches' bytes to stdout",
)
@click.option("--verify", is_flag=True, help="CRC-check remote batches again (checked before upload)")
@click.option(
    "--isolation",
    type=click.Choice(txn.ISOLATION_LEVELS),
    default="read_uncommitted",
    show_default=True,
    help="read_committed: below the last stable offset, without aborted "
    "transactions or control batches (docs/transactions.md)",
)
@handle_errors
def fetch(
    config_path: Path,
    topic: str,
    partition: int,
    offset: int,
    max_bytes: int,
    fmt: str,
    verify: bool,
    isolation: str,
) -> None:
    """Records from OFFSET on, from whichever tier holds them (Kafka fetch semantics), below the
    high watermark only; OFFSET = the high watermark prints nothing (docs/visibility.md)."""
    reader = _readers(config_path).reader(topic, partition)
    result = txn.fetch(reader, offset, max_bytes, txn.check_isolation(isolation), verify=verify)
    if fmt == "raw":
        sys.stdout.buffer.write(result.data)
        return

    def b64(v: bytes | None) -> str | None:
        return None if v is None else base64.b64encode(v).decode()

    for batch in result.batches:
        for r in result.records(batch, from_requested=True):
            sys.stdout.write(
                json.dumps(
                    {
                        "offset": r.offset,
                        "timestamp": r.timestamp,
                        "key": b64(r.key),
                        "value": b64(r.value),
                        "headers": [{"key": h.key, "value": b64(h.value)} for h in r.headers],
                        "tier": result.tier,
                        "is_control": batch.is_control,
                    }
                )
                + "\n"
            )
