"""The ``rlm`` command line (DESIGN §4). Top layer: may import everything below it."""

from __future__ import annotations

from rlm.cli.main import main

__all__ = ["main"]
