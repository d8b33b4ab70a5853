"""Upload throttling: one byte-rate token bucket shared by every upload stream.

Kafka's quota applies per segment, so one large segment can still saturate the link; here the
bucket meters the bytes as the backend reads them from the stream, whatever the segment size or
the number of concurrent uploads. A global semaphore caps concurrent uploads.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable
from typing import BinaryIO

from rlm.errors import UploadAbandoned

__all__ = ["ThrottledReader", "TokenBucket"]


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


class ThrottledReader(io.RawIOBase):
    """A read-only stream that pays the bucket for every byte read and can be abandoned.

    ``on_bytes`` is called with each chunk size (metrics, progress); ``on_data`` with each chunk's
    bytes (e.g. a checksum of exactly what was sent; the view is only valid during the call);
    ``stop`` is checked before every read so a shutdown can interrupt a long upload at a chunk
    boundary. Reads pass the underlying stream's result through without copying it.
    """

    def __init__(
        self,
        raw: BinaryIO,
        bucket: TokenBucket,
        *,
        on_bytes: Callable[[int], None] | None = None,
        on_data: Callable[[bytes | memoryview], None] | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        super().__init__()
        self._raw = raw
        self._bucket = bucket
        self._on_bytes = on_bytes
        self._on_data = on_data
        self._stop = stop

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._raw.seekable()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def _check_stop(self) -> None:
        if self._stop is not None and self._stop.is_set():
            raise UploadAbandoned("upload abandoned: shutting down")

    def _account(self, data: bytes | memoryview) -> None:
        n = len(data)
        self._bucket.take(n)
        if n:
            if self._on_data is not None:
                self._on_data(data)
            if self._on_bytes is not None:
                self._on_bytes(n)

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        self._check_stop()
        readinto = getattr(self._raw, "readinto", None)
        if readinto is not None:
            n = readinto(buffer) or 0
        else:
            data = self._raw.read(len(buffer))
            n = len(data)
            buffer[:n] = data
        with memoryview(buffer) as view:
            self._account(view[:n])
        return n

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            chunks = []
            while chunk := self.read(1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        self._check_stop()
        data = self._raw.read(size)
        self._account(data)
        return data
