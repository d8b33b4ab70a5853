"""When GC is due: the daemon's interval, remembered across processes (docs/operations.md, "GC").

A GC run costs every partition this node leads 3 LISTs, a HEAD and a GET in the store (more the
first time; in a running daemon an idle one once a day: docs/operations.md "GC"), and lists the deleted
topics' prefixes: on 1000 partitions it was nearly all of an idle ``rlm run --once`` (87 s on
SeaweedFS, issue #35). The daemon runs
it every :func:`gc_interval_s`; a ``rlm run --once`` (cron, scripts) runs it only when that long
has passed since the last GC any rlm process finished on the same state roots, when none ever did,
or when one of its own passes failed (an attempt it may have left behind). ``rlm gc`` always runs
it.

The time of the last finished GC is ``<state root>/gc-last.json`` (``{"finished_ms": <epoch ms>}``)
in every state root the node writes; the oldest of them counts, and a missing or unreadable file
means "never": GC runs. It is a schedule, not a safety record — losing it costs one GC run — so it
is written without fsync.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rlm.config import Settings, TieringSettings
from rlm.fsutil import atomic_write
from rlm.tiering.local import state_root_of

__all__ = ["GC_FILE", "GcSchedule", "gc_interval_s"]

GC_FILE = "gc-last.json"


def gc_interval_s(t: TieringSettings) -> float:
    """Seconds between GC runs: a quarter of the shortest grace (nothing waits much past its grace,
    docs/topic-identity.md), never more often than the task interval."""
    graces = (t.gc_grace_ms, t.old_incarnation_grace_ms, t.deleted_topic_grace_ms)
    return max(t.task_interval_ms / 1000, min(graces) / 4000)


@dataclass(frozen=True)
class GcSchedule:
    """The last finished GC over ``roots`` (the node's state roots) and whether the next is due."""

    roots: tuple[Path, ...]
    interval_s: float

    @classmethod
    def of(cls, settings: Settings) -> GcSchedule:
        """The schedule of the state roots ``settings``' log dirs use, at :func:`gc_interval_s`."""
        t = settings.tiering
        roots = tuple(dict.fromkeys(state_root_of(t, Path(d)) for d in settings.log.dirs))
        return cls(roots, gc_interval_s(t))

    def last_ms(self) -> int | None:
        """Epoch ms of the oldest root's last finished GC; None when a root has none."""
        times = []
        for root in self.roots:
            try:
                times.append(int(json.loads((root / GC_FILE).read_bytes())["finished_ms"]))
            except (OSError, ValueError, KeyError, TypeError):
                return None
        return min(times) if times else None

    def due(self, now_ms: int) -> tuple[bool, str]:
        """Whether GC is due at ``now_ms``, and why (in words, for ``rlm run --once``'s summary)."""
        last = self.last_ms()
        every = f"every {self.interval_s:g} s"
        if last is None:
            return True, f"no finished GC recorded on these state roots ({every})"
        ago = max(0, now_ms - last) / 1000
        if ago >= self.interval_s:
            return True, f"last GC finished {ago:.0f} s ago ({every})"
        return False, f"last GC finished {ago:.0f} s ago; next due in {self.interval_s - ago:.0f} s ({every})"

    def record(self, now_ms: int, *, dry_run: bool = False) -> None:
        """A GC over every root finished at ``now_ms`` (a ``dry_run`` deleted nothing: not one)."""
        if dry_run:
            return
        data = json.dumps({"finished_ms": now_ms}).encode()
        for root in self.roots:
            root.mkdir(parents=True, exist_ok=True)
            atomic_write(root / GC_FILE, data, durable=False)
