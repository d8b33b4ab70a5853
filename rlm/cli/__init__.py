"""The ``rlm`` command line (docs/cli.md). Top layer: may import everything below it."""

from __future__ import annotations

from rlm.cli.main import main

__all__ = ["main"]
