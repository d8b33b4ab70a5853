"""The retry policy: how often and how long to retry a transient storage failure (docs/storage.md).

:class:`RetryPolicy` retries :class:`~rlm.errors.TransientStorageError` (throttling, 5xx, timeouts)
with delays ``uniform(0, min(max_delay, base_delay * 2**attempt))`` ("full jitter"), up to
``max_attempts`` calls in total; ``sleep`` and the random source are injectable so tests are
instant and deterministic.

A leaf below the backend contract: :class:`~rlm.storage.api.StorageBackend` names the policy it is
handed (``use_retry_policy``) and :mod:`rlm.storage.retry` applies it, so both import it from here
and the contract never imports its retry wrapper. The one seam that applies it is still
:func:`rlm.storage.retry.with_retries`, which also re-exports these names.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rlm.errors import RlmError, TransientStorageError

__all__ = ["RetryPolicy", "gave_up"]

log = logging.getLogger("rlm.storage.retry")  # the retry layer's logger, as before the split
T = TypeVar("T")


@dataclass
class RetryPolicy:
    """Exponential backoff with full jitter; see module doc. ``max_attempts`` counts the first call."""

    max_attempts: int = 6
    base_delay: float = 0.05
    max_delay: float = 5.0
    retry_on: tuple[type[BaseException], ...] = (TransientStorageError,)
    sleep: Callable[[float], None] = time.sleep
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("delays must be >= 0")
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def delay(self, attempt: int) -> float:
        """Delay before retry number ``attempt`` (0-based): uniform in ``[0, min(max, base*2**attempt)]``."""
        cap = min(self.max_delay, self.base_delay * (2 ** min(attempt, 62)))
        with self._lock:
            return self.rng.uniform(0, cap)

    def call(
        self, fn: Callable[..., T], *args: Any, before_retry: Callable[[], None] | None = None, **kwargs: Any
    ) -> T:
        """Call ``fn(*args, **kwargs)``, retrying ``retry_on`` errors; re-raise the last one.

        ``before_retry`` runs before each retry (e.g. rewind a stream); if it raises, that error
        propagates with the transient one chained.
        """
        attempt = 0
        while True:
            try:
                return fn(*args, **kwargs)
            except self.retry_on as e:
                if getattr(e, "attempts", None) is not None:
                    # This policy already spent its attempts on the request inside this call (a
                    # multipart step, handed down by RetryingBackend): one budget per request.
                    raise
                if attempt + 1 >= self.max_attempts:
                    gave_up(e, attempt + 1)
                    raise
                pause = self.delay(attempt)
                log.debug(
                    "transient storage error (attempt %d/%d), retrying in %.3fs: %s",
                    attempt + 1,
                    self.max_attempts,
                    pause,
                    e,
                )
                self.sleep(pause)
                attempt += 1
                if before_retry is not None:
                    try:
                        before_retry()
                    except Exception as rewind_error:
                        raise rewind_error from e


def gave_up(err: BaseException, attempts: int) -> None:
    """Mark ``err`` as exhausted after ``attempts`` calls (its text says so, for the operator);
    see :class:`~rlm.errors.TransientStorageError`. Other errors are left alone."""
    if isinstance(err, RlmError):
        err.attempts = attempts  # type: ignore[attr-defined]  # declared by TransientStorageError
        err.reason = f"{err.reason} (gave up after {attempts} attempt{'s' if attempts != 1 else ''})"
