"""One finding of ``rlm verify`` (:mod:`rlm.jobs.checks.scrub`, :mod:`rlm.jobs.checks.verify_local`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = ["Problem", "Severity"]

Severity = Literal["error", "warning"]


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding. ``key`` is an object key (remote) or a file path (local)."""

    check: str
    topic: str
    partition: int
    message: str
    severity: Severity = "error"
    base_offset: int | None = None
    key: str | None = None
    position: int | None = None
    offset: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def line(self) -> str:
        where = [f"{self.topic}-{self.partition}"]
        if self.base_offset is not None:
            where.append(f"segment {self.base_offset}")
        if self.key is not None:
            where.append(self.key)
        if self.position is not None:
            where.append(f"byte {self.position}")
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        return f"{self.severity}: {self.check}: {', '.join(where)}: {self.message}"
