"""Watching a live broker's partitions while it rolls and deletes: the rolled segments' bytes kept
aside (hard links, so the broker's rename to ``.deleted`` and its unlink cannot take them), which
segments the broker deleted since, and what a consumer read from the broker before that.
"""

from __future__ import annotations

import itertools
import os
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlm.testing.sidecar import Record

_LOG = re.compile(r"^(\d{20})\.log(\.deleted)?$")

TP = tuple[str, int]


@dataclass(frozen=True)
class Rolled:
    """A rolled segment: offsets ``[base, end)`` (``end`` = the next segment's base) and the
    hard link to its ``.log`` taken while the broker still had it."""

    tp: TP
    base: int
    end: int
    aside: Path


@dataclass
class SegmentWatch:
    """Polls the partition dirs of ``tps`` under ``log_dir`` every ``interval`` seconds: links
    each segment once a later one exists (it is rolled: its bytes no longer change), and notes
    when its ``.log`` is gone from the broker's segment list (renamed ``.deleted`` or unlinked)."""

    log_dir: Path
    tps: Iterable[TP]
    aside: Path
    interval: float = 0.05
    rolled: dict[TP, dict[int, Rolled]] = field(default_factory=dict)
    deleted: dict[TP, list[Rolled]] = field(default_factory=dict)
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self.tps = list(self.tps)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="segment-watch", daemon=True)
        for tp in self.tps:
            self.rolled[tp], self.deleted[tp] = {}, []
            (self.aside / f"{tp[0]}-{tp[1]}").mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> SegmentWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def deleted_now(self, tp: TP) -> list[Rolled]:
        """The segments of ``tp`` the broker deleted so far, oldest first."""
        if self.error is not None:
            raise RuntimeError(f"the segment watch failed: {self.error!r}") from self.error
        with self._lock:
            return list(self.deleted[tp])

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for tp in self.tps:
                    self._poll(tp)
                time.sleep(self.interval)
        except BaseException as err:
            self.error = err

    def _poll(self, tp: TP) -> None:
        part = self.log_dir / f"{tp[0]}-{tp[1]}"
        listed: dict[int, str] = {}
        for name in os.listdir(part):
            m = _LOG.match(name)
            if m and not m.group(2):
                listed[int(m.group(1))] = name
        bases = sorted(listed)
        for base, nxt in itertools.pairwise(bases):
            if base not in self.rolled[tp]:
                self._link(tp, part / listed[base], base, nxt)
        head = bases[0] if bases else None
        with self._lock:
            known = {r.base for r in self.deleted[tp]}
            self.deleted[tp] += [
                r
                for b, r in sorted(self.rolled[tp].items())
                if head is not None and b < head and b not in known
            ]

    def _link(self, tp: TP, log: Path, base: int, nxt: int) -> None:
        target = self.aside / f"{tp[0]}-{tp[1]}" / log.name
        for source in (log, log.with_name(log.name + ".deleted")):  # renamed meanwhile: same inode
            try:
                os.link(source, target)
            except FileNotFoundError:
                continue
            with self._lock:
                self.rolled[tp][base] = Rolled(tp, base, nxt, target)
            return


@dataclass
class BrokerRecorder:
    """Two consumers (read_uncommitted, read_committed) tailing ``tps`` on the broker from offset 0,
    keeping every record they read: what a consumer saw before the broker deleted anything. A
    consumer that falls below the broker's log start fails the recorder (``auto_offset_reset``
    none) instead of skipping what it never read."""

    bootstrap: str
    tps: Iterable[TP]
    records: dict[str, dict[TP, dict[int, Record]]] = field(default_factory=dict)
    positions: dict[str, dict[TP, int]] = field(default_factory=dict)
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self.tps = list(self.tps)
        self._stop = threading.Event()
        self._threads = []
        for iso in ("read_uncommitted", "read_committed"):
            self.records[iso] = {tp: {} for tp in self.tps}
            self.positions[iso] = dict.fromkeys(self.tps, 0)
            self._threads.append(
                threading.Thread(target=self._run, args=(iso,), name=f"rec-{iso}", daemon=True)
            )

    def __enter__(self) -> BrokerRecorder:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop reading (what was read stays)."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)

    def read(self, iso: str, tp: TP, start: int, end: int) -> list[Record]:
        """What the consumer with ``iso`` read of ``[start, end)``, in offset order."""
        got = self.records[iso][tp]
        return [got[o] for o in sorted(got) if start <= o < end]

    def past(self, iso: str, tp: TP, end: int) -> bool:
        """Whether that consumer's position reached ``end``; raises what failed it."""
        if self.error is not None:
            raise RuntimeError(f"the broker consumer failed: {self.error!r}") from self.error
        return self.positions[iso][tp] >= end

    def _run(self, iso: str) -> None:
        from kafka import KafkaConsumer, TopicPartition

        consumer: Any = KafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            isolation_level=iso,
            auto_offset_reset="none",
            fetch_max_wait_ms=100,
            request_timeout_ms=30000,
        )
        try:
            parts = [TopicPartition(*tp) for tp in self.tps]
            consumer.assign(parts)
            for p in parts:
                consumer.seek(p, 0)
            while not self._stop.is_set():
                for p, msgs in consumer.poll(timeout_ms=200).items():
                    for m in msgs:
                        headers = tuple((k, bytes(v)) for k, v in (m.headers or []))
                        self.records[iso][(p.topic, p.partition)][m.offset] = Record(
                            m.offset, m.timestamp, m.key, m.value, headers
                        )
                for p in parts:
                    self.positions[iso][(p.topic, p.partition)] = int(consumer.position(p))
        except BaseException as err:
            self.error = err
        finally:
            consumer.close()
