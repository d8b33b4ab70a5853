"""``faulty``: a wrapper backend that injects the failures real object stores produce.

Usable from config (``backend = "faulty"``) and from code (:meth:`FaultyBackend.wrap`)::

    [remote]
    backend = "faulty"
    [remote.options]
    inner = "memory"            # any installed backend name
    inner_options = {}          # handed to the inner backend
    seed = 42                   # same seed + same call sequence = same faults
    throttle_rate = 0.1         # 503 SlowDown before the call reaches the store
    error_rate = 0.05           # 500 InternalError before the call reaches the store
    timeout_rate = 0.0          # request timed out before the call reaches the store
    lost_ack_rate = 0.05        # put/delete performed, then the client sees an error
    partial_upload_rate = 0.05  # upload dies midway: the stream is half read, nothing is published
    latency_ms = 0              # added to every call (+ uniform jitter up to latency_jitter_ms)
    list_lag_ops = 0            # a new key shows up in listings only N calls after its put
    operations = ["put", "read", "head", "list", "delete"]   # calls subject to injected errors
    max_faults = -1             # stop injecting after this many faults (-1 = never)

Every injected error is a :class:`~rlm.errors.TransientStorageError` whose text says "injected";
``backend.injected`` counts them by kind. One random draw per call decides its fate, so a run is
deterministic for a given seed and call order (concurrent callers interleave draws arbitrarily).
"""

from __future__ import annotations

import collections
import dataclasses
import random
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO, ClassVar

from rlm.errors import ConfigError, TransientStorageError
from rlm.storage.api import Capabilities, ListPage, ObjectInfo, StorageBackend
from rlm.storage.options import Option, at_least, between
from rlm.storage.wrapper import WrappingBackend

__all__ = ["OPERATIONS", "FaultyBackend"]

OPERATIONS = ("put", "read", "head", "list", "delete")
_rate = between(0.0, 1.0)
_LOST_ACK = "connection reset before the response (injected lost ack)"


def _check_ops(ops: list[Any]) -> str | None:
    bad = [o for o in ops if o not in OPERATIONS]
    return f"unknown operation(s) {bad}; allowed: {list(OPERATIONS)}" if bad else None


class FaultyBackend(WrappingBackend):
    """Inject latency, throttling, 5xx, timeouts, lost acks, partial uploads and listing lag."""

    name: ClassVar[str] = "faulty"
    OPTIONS: ClassVar[tuple[Option, ...]] = (
        Option("inner", "str", default="memory"),
        Option("inner_options", "dict", default=None),
        Option("seed", "int", default=0),
        Option("throttle_rate", "float", default=0.0, check=_rate),
        Option("error_rate", "float", default=0.0, check=_rate),
        Option("timeout_rate", "float", default=0.0, check=_rate),
        Option("lost_ack_rate", "float", default=0.0, check=_rate),
        Option("partial_upload_rate", "float", default=0.0, check=_rate),
        Option("latency_ms", "float", default=0.0, check=at_least(0)),
        Option("latency_jitter_ms", "float", default=0.0, check=at_least(0)),
        Option("list_lag_ops", "int", default=0, check=at_least(0)),
        Option("operations", "list", default=list(OPERATIONS), check=_check_ops),
        Option("max_faults", "int", default=-1, check=at_least(-1)),
    )

    def __init__(
        self,
        *,
        inner_backend: StorageBackend | None = None,
        sleep: Callable[[float], None] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        o = self.options
        total = sum(
            o[k]
            for k in ("throttle_rate", "error_rate", "timeout_rate", "lost_ack_rate", "partial_upload_rate")
        )
        if total > 1.0:
            raise ConfigError(f"faulty: the fault rates add up to {total}, more than 1")
        if inner_backend is not None and not isinstance(inner_backend, StorageBackend):
            raise ConfigError("unknown option 'inner_backend' for backend 'faulty'")
        if inner_backend is None:
            from rlm.storage.registry import create_backend

            inner_backend = create_backend(o["inner"], o["inner_options"] or {})
        self.inner = inner_backend
        self._sleep = sleep or time.sleep
        self._rng = random.Random(o["seed"])
        self._lock = threading.Lock()
        self._ops = 0
        self._recent: dict[str, int] = {}
        self._ops_enabled = frozenset(o["operations"])
        #: Injected faults by kind ("throttle", "error", "timeout", "lost_ack", "partial_upload").
        self.injected: collections.Counter[str] = collections.Counter()

    @classmethod
    def wrap(
        cls, inner: StorageBackend, *, sleep: Callable[[float], None] | None = None, **fault_options: Any
    ) -> FaultyBackend:
        """Wrap an existing backend instance (``fault_options`` as in the module doc, minus ``inner*``)."""
        return cls(inner_backend=inner, sleep=sleep, inner=inner.name, **fault_options)

    def __reduce__(self) -> tuple[Any, ...]:
        opts = {k: v for k, v in self.options.items() if k not in ("inner", "inner_options")}
        return (_rewrap, (self.inner, opts))

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["options"]["inner_options"] = self.inner.describe()["options"]
        return d

    @property
    def capabilities(self) -> Capabilities:
        caps = self.inner.capabilities
        if self.options["list_lag_ops"] > 0:
            caps = dataclasses.replace(caps, consistent_listing=False)
        if self.options["latency_ms"] > 0 or self.options["latency_jitter_ms"] > 0:
            caps = dataclasses.replace(caps, local_io=False)  # it plays a store across a network
        return caps

    # -- fault machinery ------------------------------------------------------------------------

    def _roll(self, op: str, write: bool) -> str | None:
        """Advance the op counter, sleep the latency, and decide this call's fault (or None)."""
        o = self.options
        with self._lock:
            self._ops += 1
            draw = self._rng.random()
            jitter = self._rng.random() * o["latency_jitter_ms"]
            if op not in self._ops_enabled or (0 <= o["max_faults"] <= sum(self.injected.values())):
                fault = None
            else:
                fault = None
                edge = 0.0
                kinds = ["throttle", "error", "timeout"]
                if write:
                    kinds += ["lost_ack", "partial_upload"] if op == "put" else ["lost_ack"]
                for kind in kinds:
                    edge += o[f"{kind}_rate"]
                    if draw < edge:
                        fault = kind
                        break
                if fault is not None:
                    self.injected[fault] += 1
        delay = (o["latency_ms"] + jitter) / 1000.0
        if delay > 0:
            self._sleep(delay)
        if fault == "throttle":
            raise TransientStorageError(f"{op}: 503 SlowDown: please reduce your request rate (injected)")
        if fault == "error":
            raise TransientStorageError(f"{op}: 500 InternalError (injected)")
        if fault == "timeout":
            raise TransientStorageError(f"{op}: request timed out (injected)")
        return fault

    # -- operations -----------------------------------------------------------------------------

    def _put(self, key: str, stream: BinaryIO, if_absent: bool) -> ObjectInfo:
        fault = self._roll("put", write=True)
        if fault == "partial_upload":
            stream.read(1 << 16)  # the connection died midway; the store never publishes it
            raise TransientStorageError(f"put {key!r}: connection reset mid-upload (injected partial upload)")
        info = self.inner.put(key, stream, if_absent=if_absent)
        with self._lock:
            self._recent[key] = self._ops
        if fault == "lost_ack":
            raise TransientStorageError(f"put {key!r}: {_LOST_ACK}")
        return info

    def _read(self, key: str, start: int, end: int | None) -> bytes:
        self._roll("read", write=False)
        return self.inner.read(key, start, end)

    def _head(self, key: str) -> ObjectInfo:
        self._roll("head", write=False)
        return self.inner.head(key)

    def _list_page(self, prefix: str, start_after: str | None, limit: int) -> ListPage:
        self._roll("list", write=False)
        page = self.inner.list_page(prefix, token=start_after, limit=limit)
        lag = self.options["list_lag_ops"]
        if lag <= 0:
            return page
        with self._lock:
            now = self._ops
            self._recent = {k: n for k, n in self._recent.items() if now - n < lag}
            hidden = set(self._recent)
        if not hidden:
            return page
        return ListPage(tuple(o for o in page.objects if o.key not in hidden), page.next_token)

    def _delete(self, key: str) -> None:
        fault = self._roll("delete", write=True)
        self.inner.delete(key)
        if fault == "lost_ack":
            raise TransientStorageError(f"delete {key!r}: {_LOST_ACK}")


def _rewrap(inner: StorageBackend, options: dict[str, Any]) -> FaultyBackend:
    return FaultyBackend.wrap(inner, **options)
