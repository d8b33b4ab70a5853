"""``rlm restore`` (docs/cli.md, docs/restore.md): Kafka partition directories from the remote tier.

One JSON object on stdout when done (like ``rlm export``); a byte progress bar on stderr on a
terminal only; errors are one line (``rlm: error: …``) with the usual exit codes.
"""

from __future__ import annotations

from pathlib import Path

import click

from rlm.cli.common import config_option, interactive, settings_for_tool, tracked_backend
from rlm.cli.errors import handle_errors
from rlm.cli.output import emit_json

__all__ = ["restore"]


@click.command("restore")
@config_option
@click.option("--topic", required=True, help="Topic to restore.")
@click.option(
    "--partition",
    "partitions",
    type=click.IntRange(0, 2**31 - 1),
    multiple=True,
    help="Only these partitions (repeatable; default: every partition of the topic in log.dirs).",
)
@click.option(
    "--from-offset",
    type=click.IntRange(0),
    default=None,
    help="Start at the tiered segment holding this offset (whole segments).",
)
@click.option(
    "--from-timestamp",
    type=click.IntRange(0),
    default=None,
    help="Start at the first tiered segment with a record at or after this time (ms since the epoch).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    required=True,
    help="Log directory to write <topic>-<partition>/ into (created when missing).",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace existing non-empty partition directories in --out (default: refuse).",
)
@click.option(
    "--parallelism",
    type=click.IntRange(1, 256),
    default=4,
    show_default=True,
    help="Segments read and written at once.",
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
@handle_errors
def restore(
    config_path: Path,
    topic: str,
    partitions: tuple[int, ...],
    from_offset: int | None,
    from_timestamp: int | None,
    out: Path,
    overwrite: bool,
    parallelism: int,
    quiet: bool,
) -> None:
    """Write the topic's tiered segments back as Kafka partition directories under OUT: segments
    byte-identical to what was tiered, their indexes, leader-epoch-checkpoint, partition.metadata
    and OUT's offset checkpoints, only what a consumer may see (docs/restore.md). Partitions are
    staged beside their target and renamed into place only when all are complete."""
    if from_offset is not None and from_timestamp is not None:
        raise click.UsageError("--from-offset and --from-timestamp exclude each other")
    settings = settings_for_tool(config_path)
    from tqdm import tqdm

    from rlm.jobs.restore import StartAt
    from rlm.jobs.restore import restore as run_restore

    with tqdm(
        unit="B", unit_scale=True, unit_divisor=1024, desc=f"restore {topic}", disable=not interactive(quiet)
    ) as bar:

        def planned(total: int) -> None:
            bar.reset(total=total)

        result = run_restore(
            settings,
            tracked_backend(settings),
            topic,
            out,
            partitions=list(partitions) or None,
            start=StartAt(from_offset, from_timestamp),
            overwrite=overwrite,
            parallelism=parallelism,
            on_bytes=bar.update,
            on_plan=planned,
        )
    emit_json(result.to_json())
