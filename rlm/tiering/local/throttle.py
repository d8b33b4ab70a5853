"""Upload throttling: one byte-rate token bucket shared by every upload stream.

Kafka's quota applies per segment, so one large segment can still saturate the link; here the
bucket meters the bytes as the backend reads them from the file (rlm/tiering/copy/upload.py pays
it for every chunk a :class:`~rlm.storage.filestream.FileStream` reads), whatever the segment size
or the number of concurrent uploads. A global semaphore caps concurrent uploads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["TokenBucket"]


class TokenBucket:
    """``rate`` bytes/second with a burst of ``burst`` bytes (default: one second's worth).

    ``rate <= 0`` means unlimited. ``take(n)`` blocks until ``n`` tokens are available; requests
    larger than the burst are served in burst-sized pieces so no caller starves.
    """

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.rate = rate
        self.burst = burst if burst is not None else max(rate, 1.0)
        self._tokens = self.burst
        self._clock = clock
        self._sleep = sleep
        self._last = clock()
        self._lock = threading.Lock()

    @property
    def unlimited(self) -> bool:
        return self.rate <= 0

    def take(self, n: int) -> None:
        if self.unlimited or n <= 0:
            return
        remaining = float(n)
        while remaining > 0:
            piece = min(remaining, self.burst)
            with self._lock:
                now = self._clock()
                self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
                self._last = now
                self._tokens -= piece
                wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
            if wait > 0:
                self._sleep(wait)
            remaining -= piece
