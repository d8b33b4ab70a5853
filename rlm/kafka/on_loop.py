"""Which Fetches the listener tries to answer on its event loop (docs/kafka-listener.md §8).

A Fetch whose read needs nothing that waits — its remote ranges read ahead and landed, or cached;
no store request, no question to the broker, no segment's records on disk (rlm/nowait.py) — is
answered on the event loop: handing it to a pool thread and back costs two thread wake-ups, more
than such a read (on a 2-core VM, 20 % of a catch-up's throughput). A read that would wait stops
before the waiting step changed anything and a pool thread goes on from there (the partitions
already read are kept). A connection whose reads keep waiting (a store slower than its reader)
is not tried on every Fetch: after a read that waited, its next 1, 3, 7 … (at most
:data:`MAX_SKIP`) Fetches go to the pool whole; one answered on the loop resets that.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MAX_SKIP", "LoopTries"]

#: The most Fetches of one connection sent to the pool whole after a read that waited.
MAX_SKIP = 63


@dataclass(slots=True)
class LoopTries:
    """One connection's choice: try its next Fetch on the event loop or not."""

    skip: int = 0  # Fetches still to send to the pool whole
    after_wait: int = 0  # the skip set by the next read that waits

    def due(self) -> bool:
        """Whether to try this Fetch on the loop (counts down the skip)."""
        if self.skip:
            self.skip -= 1
            return False
        return True

    def waited(self) -> None:
        """The try would have waited: skip more Fetches before the next."""
        self.after_wait = min(2 * self.after_wait + 1, MAX_SKIP)
        self.skip = self.after_wait

    def answered(self) -> None:
        """The try answered: try the next one too."""
        self.after_wait = 0
