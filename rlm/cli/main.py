"""Entry point and command group of the ``rlm`` CLI."""

from __future__ import annotations

import click


@click.group()
@click.version_option(package_name="rlm")
def main() -> None:
    """rlm — tiered-storage remote log manager for Kafka-format log directories."""


from rlm.cli.dump import dump  # noqa: E402  (commands register after the group exists)

main.add_command(dump)

from rlm.cli.generate import generate  # noqa: E402

main.add_command(generate)
