"""What the commands print on stdout: JSON documents as compact JSON Lines (docs/cli.md §1)."""

from __future__ import annotations

import json
import sys

__all__ = ["emit_json", "json_line"]


def json_line(doc: object) -> str:
    """``doc`` as one compact JSON line (no spaces), newline-terminated."""
    return json.dumps(doc, separators=(",", ":")) + "\n"


def emit_json(doc: object) -> None:
    """Print ``doc`` on stdout as one :func:`json_line`."""
    sys.stdout.write(json_line(doc))
