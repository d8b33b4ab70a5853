"""Entry point and command group of the ``rlm`` CLI (docs/cli.md)."""

from __future__ import annotations

import click

from rlm.cli.admin import delete_records
from rlm.cli.dump import dump
from rlm.cli.generate import generate
from rlm.cli.jobs import export, rebuild_index, verify
from rlm.cli.lookup import fetch, lookup, offsets_for_times
from rlm.cli.restore import restore
from rlm.cli.rewrap import rewrap
from rlm.cli.run import gc, run, status

__all__ = ["main"]


@click.group()
@click.version_option(package_name="rlm")
def main() -> None:
    """rlm — tiered-storage remote log manager for Kafka-format log directories."""


for command in (
    dump,
    generate,
    run,
    status,
    gc,
    rebuild_index,
    lookup,
    offsets_for_times,
    fetch,
    export,
    verify,
    restore,
    rewrap,
    delete_records,
):
    main.add_command(command)
