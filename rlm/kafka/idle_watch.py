"""The listener's idle timeout (``kafka.idle_timeout_ms``, Kafka's ``connections.max.idle.ms``):
one watch on the event loop for every connection, instead of a timeout scope around each read and
drain.

A connection *owes* bytes while the listener waits for them: the next request's size, the rest of
a frame, or the client to take a response (a drain). Each such wait records when it began (and a
frame's size header arriving restarts it: that is progress); the watch wakes every
:func:`tick_s` seconds and cancels the task of every connection that has owed bytes for
``idle_s`` or more. So a silent connection is closed between ``idle_s`` and ``idle_s`` + one tick
after it went silent; time spent answering a request is never counted.

Why not ``asyncio.timeout`` per wait: each scope costs a timer handle pushed on and cancelled from
the loop's heap and a ``current_task`` lookup, three per request, which measured 3-5 % of the
listener's CPU per 1 MiB Fetch (BENCHMARKS.md "Beside Kafka's own tiered storage"). Marking a wait
costs one clock read and an attribute store.
"""

from __future__ import annotations

import asyncio

__all__ = ["IdleWatch", "Owing", "tick_s"]


def tick_s(idle_s: float) -> float:
    """How often the watch looks, seconds: a quarter of the timeout, at most one second."""
    return min(1.0, idle_s / 4)


class Owing:
    """One connection as the watch sees it: since when it owes bytes (loop time, seconds; None
    while it owes nothing) and whether the watch closed it."""

    __slots__ = ("expired", "since", "task")

    def __init__(self, task: asyncio.Task[None] | None) -> None:
        self.task = task
        self.since: float | None = None
        self.expired = False


class IdleWatch:
    """Cancels the task of each registered connection that has owed bytes for ``idle_s`` seconds."""

    def __init__(self, idle_s: float) -> None:
        self.idle_s = idle_s
        self._conns: set[Owing] = set()

    def add(self, owing: Owing) -> None:
        self._conns.add(owing)

    def discard(self, owing: Owing) -> None:
        self._conns.discard(owing)

    def check(self, now: float) -> int:
        """Expire the connections silent since ``now - idle_s`` or earlier; how many."""
        expired = 0
        for owing in self._conns:
            if owing.since is not None and not owing.expired and now - owing.since >= self.idle_s:
                owing.expired = True
                if owing.task is not None:
                    owing.task.cancel("silent for kafka.idle_timeout_ms")
                expired += 1
        return expired

    async def run(self) -> None:
        """Check every :func:`tick_s` until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(tick_s(self.idle_s))
            self.check(loop.time())
