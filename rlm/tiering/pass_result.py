"""What one pass over one partition did: the answer of ``RemoteLogManager.run_partition``, and the
rows ``rlm run --once`` sums into its summary (docs/cli.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PassResult"]


@dataclass
class PassResult:
    """What one pass over one partition did."""

    topic: str
    partition: int
    copied: list[int] = field(default_factory=list)  # base offsets
    deleted: list[int] = field(default_factory=list)  # base offsets removed by retention
    skipped: bool = False  # another pass held the partition
    error: str | None = None
    copied_bytes: int = 0  # bytes of the copied segments (progress)
    idle: bool = False  # nothing changed since a clean pass (idle.py)
