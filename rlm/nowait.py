"""Work that must not wait, and the places where a read would.

The Kafka listener answers a Fetch on its event loop when everything it needs is already in memory
(docs/kafka-listener.md §8): a thread hop costs more than such a read. It runs the read inside
:func:`without_waiting`; every place where a read could wait — a store request, a read ahead
still in flight, a question to the broker, a segment file's bytes on disk — calls
:func:`may_wait` first, which then raises :class:`BlockingIOError` before that step starts, and
the caller hands the rest of the work to a thread (which does it again from that step). Outside
:func:`without_waiting` (every thread but that one moment) :func:`may_wait` does nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["may_wait", "waiting_allowed", "without_waiting"]

_here = threading.local()


@contextmanager
def without_waiting() -> Iterator[None]:
    """Inside it, on this thread, :func:`may_wait` raises instead of letting the caller wait."""
    before = getattr(_here, "refused", False)
    _here.refused = True
    try:
        yield
    finally:
        _here.refused = before


def waiting_allowed() -> bool:
    """False inside :func:`without_waiting` on this thread."""
    return not getattr(_here, "refused", False)


def may_wait(what: str) -> None:
    """Called before ``what`` (a read that may wait) starts: :class:`BlockingIOError` naming it
    inside :func:`without_waiting`, nothing otherwise."""
    if getattr(_here, "refused", False):
        raise BlockingIOError(f"would wait: {what}")
