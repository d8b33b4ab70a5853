"""``rlm rewrap --to <key id>``: re-wrap stored data keys under another master key, rewriting only
manifests (docs/cli.md, docs/security.md §5). Safe beside a running ``rlm run``."""

from __future__ import annotations

from pathlib import Path

import click

from rlm.cli.common import config_option, interactive, settings_for_tool, tracked_backend
from rlm.cli.errors import EXIT_FAILURE, handle_errors
from rlm.cli.output import emit_json
from rlm.errors import ConfigError
from rlm.tiering.store import KeyRing, rewrap_store

__all__ = ["rewrap"]


@click.command("rewrap")
@config_option
@click.option(
    "--to",
    "to",
    required=True,
    metavar="KEY_ID",
    help="Key id of [remote.encryption] key_files to wrap every data key with.",
)
@click.option("--topic", "topics", multiple=True, help="Only these topics (repeatable; default all).")
@click.option("--dry-run", is_flag=True, help="Count what would be re-wrapped; write nothing.")
@click.option(
    "--authenticate",
    is_flag=True,
    help="Also trust, once, manifests without a MAC (written before rlm authenticated manifests) "
    "and MAC them (docs/protection.md §9).",
)
@click.option(
    "--parallelism",
    type=click.IntRange(1, 256),
    default=8,
    show_default=True,
    help="Manifests handled at once.",
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
@handle_errors
def rewrap(
    config_path: Path,
    to: str,
    topics: tuple[str, ...],
    dry_run: bool,
    authenticate: bool,
    parallelism: int,
    quiet: bool,
) -> None:
    """Re-wrap every segment's data key that is not under KEY_ID (unwrapping it with its own key
    from the ring) and rewrite its manifest with its MAC under KEY_ID; data objects are never
    touched. Idempotent; a JSON
    summary on stdout; exit 1 when a manifest could not be re-wrapped (one line each)."""
    settings = settings_for_tool(config_path)
    ring = KeyRing.from_settings(settings.remote.encryption)
    if ring is None:
        raise ConfigError(
            "rlm rewrap: [remote.encryption] key_files is empty: the key ring needs the "
            f"key that wrapped each data key and the target key {to!r} ({settings.source})"
        )
    if to not in ring.key_ids:
        raise ConfigError(
            f"rlm rewrap --to {to!r}: not a key id of [remote.encryption] key_files "
            f"(known: {', '.join(ring.key_ids)})"
        )
    from tqdm import tqdm

    with tqdm(unit="manifest", desc="rewrap", disable=not interactive(quiet)) as bar:
        result = rewrap_store(
            tracked_backend(settings),
            ring,
            to,
            topics=frozenset(topics) or None,
            dry_run=dry_run,
            authenticate=authenticate,
            parallelism=parallelism,
            on_manifest=lambda: bar.update(1),
        )
    emit_json(result.to_json())
    for line in result.errors:
        click.echo(f"rlm: error: {line}", err=True)
    if not result.ok:
        raise SystemExit(EXIT_FAILURE)
