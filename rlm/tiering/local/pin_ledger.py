"""What rlm holds of the broker's files with hard links, per log dir, and the bound on it
(docs/architecture.md §5.1; sizing: docs/operations.md "Pins and the broker's retention").

Two kinds of pin hold broker files:

* a **sight pin**, ``<state dir>/pins/<base>/``: the files of a rolled, committed segment not yet
  tiered, hard-linked under their role names (``segment.log``, ``segment.index``, …, as a copy's
  pin) by the first pass that sees it (:mod:`rlm.tiering.copy.sight`), with ``pin.json``
  (:class:`SightPin`). Files, so they survive a restart; dropped once the segment is tiered or
  excluded.
* a **copy pin**, ``<state dir>/staging/<base>-<attempt>/``, of a copy in flight
  (:mod:`rlm.tiering.copy.prepare`): a :class:`PinClaim` while it exists.

**Accounting**: the bytes of distinct inodes (device, inode; size at link time), every pin counted
whether or not the broker still has the file. A hard link costs no disk while the broker's name for
the file exists, but the broker may delete it at any moment and the pin then holds the bytes alone,
so every pinned byte is a byte rlm may come to hold. A copy pin of a sight-pinned segment links the
same inodes: counted once. Files a copy writes itself (a rebuilt index, a partial copy's tail) are
not pins and are not counted; they live as long as the copy.

**Bound** (``tiering.max_pinned_bytes`` per log dir; -1 unlimited; 0 takes no sight pin):

* a sight pin is taken only when it fits; the first refusal in a log dir is logged once and
  ``rlm_pin_bound_reached`` set until every refused partition could pin again;
* a copy pin that does not fit first drops sight pins whose broker file is still there, newest
  first: they cost no disk yet, and the next pass pins them again when there is room. If it still
  does not fit it is taken anyway when no other copy in the log dir is over the bound — a copy
  never waits for room held by pins it cannot free (tiering would stop and the broker delete
  everything behind), so the one excess is a single copy in flight — else the copy waits for the
  next pass (:class:`~rlm.errors.PinRoomExhausted`).

A partition's refusal is persisted (``pins/refused.json``, docs/formats.md §7.4: the oldest
refused base and since when), so ``rlm status`` in another process shows it. ``pin.json`` is the
same section's. Thread-safe: one lock for the whole ledger.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlm.fsutil import fsync_dir
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.local.pin_files import (
    Inode,
    SightPin,
    clear_refused,
    linked_files,
    read_pins,
    read_refused,
    write_refused,
)

__all__ = ["PinClaim", "PinLedger"]

log = logging.getLogger(__name__)


@dataclass
class _LogDir:
    """One log dir's account: held inodes → [bytes, references]; its sight pins, counted."""

    inodes: dict[Inode, list[int]] = field(default_factory=dict)
    total: int = 0
    pins: int = 0  # kept here, not counted over every partition's pins on each change (#35)
    over_bound: int = 0  # copy claims taken past the bound (at most one)
    refused_by: dict[Path, tuple[int, int]] = field(default_factory=dict)  # state dir → (base, since ms)


class PinClaim:
    """A copy pin counted in the ledger until :meth:`release` (idempotent)."""

    def __init__(self, ledger: PinLedger, log_dir: Path, files: dict[Inode, int], over_bound: bool) -> None:
        self._ledger, self.log_dir, self.files, self.over_bound = ledger, log_dir, files, over_bound
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._ledger._unclaim(self)


class PinLedger:
    """Every pin of the configured log dirs (loaded from the state dirs at first use) and their
    bound. ``bound`` bytes per log dir: -1 unlimited, 0 = no sight pins."""

    def __init__(
        self,
        bound: int = -1,
        log_dirs: Iterable[Path] = (),
        root_of: Callable[[Path], Path] | None = None,
        metrics: TieringMetrics | None = None,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self.bound = bound
        self._log_dirs = [Path(d) for d in log_dirs]
        self._root_of = root_of
        self._metrics = metrics
        self._clock = clock_ms or (lambda: int(time.time() * 1000))
        self._lock = threading.RLock()
        self._dirs: dict[Path, _LogDir] = {}
        self._pins: dict[Path, dict[int, SightPin]] = {}  # state dir → base → pin
        self._leftovers: dict[Path, list[Path]] = {}
        self._loaded = False

    # -- loading ----------------------------------------------------------------------------------

    def _load(self) -> None:
        """The pins on disk, once (lock held): each counted in the log dir its ``pin.json`` names."""
        if self._loaded:
            return
        self._loaded = True
        roots = {self._root_of(d) for d in self._log_dirs} if self._root_of is not None else set()
        for d in self._log_dirs:
            self._dirs.setdefault(d, _LogDir())
        for root in sorted(roots):
            try:
                with os.scandir(root) as it:  # one listing; d_type says which are dirs (no stat)
                    state_dirs = sorted(Path(e.path) for e in it if e.is_dir())
            except OSError:
                continue
            for state_dir in state_dirs:
                self._load_partition(state_dir)
        for d in self._log_dirs:
            self._publish(d)

    def _load_partition(self, state_dir: Path) -> None:
        found = read_pins(state_dir)  # one failed scandir for a partition that never pinned
        if found is None:
            return
        pins, leftovers = found
        if leftovers:
            self._leftovers[state_dir] = leftovers
        for pin in pins:
            if pin.log_dir in self._dirs:
                self._register(pin)
        refused = read_refused(state_dir)
        if refused is not None and refused[0] in self._dirs:
            self._dirs[refused[0]].refused_by[state_dir] = refused[1:]

    def _dir(self, log_dir: Path) -> _LogDir:
        self._load()
        return self._dirs.setdefault(log_dir, _LogDir())

    def _register(self, pin: SightPin) -> None:
        replaced = self._pins.setdefault(pin.state_dir, {}).get(pin.base_offset)
        if replaced is not None:  # counted once: the new pin's files stand for it
            old = self._dirs.setdefault(replaced.log_dir, _LogDir())
            self._remove(old, replaced.files)
            old.pins -= 1
        d = self._dirs.setdefault(pin.log_dir, _LogDir())
        self._add(d, pin.files)
        d.pins += 1
        self._pins[pin.state_dir][pin.base_offset] = pin

    def _add(self, d: _LogDir, files: Mapping[Inode, int]) -> None:
        for inode, size in files.items():
            held = d.inodes.get(inode)
            if held is None:
                d.inodes[inode] = [size, 1]
                d.total += size
            else:
                held[1] += 1

    def _remove(self, d: _LogDir, files: Mapping[Inode, int]) -> None:
        for inode in files:
            held = d.inodes.get(inode)
            if held is None:
                continue
            held[1] -= 1
            if held[1] <= 0:
                del d.inodes[inode]
                d.total -= held[0]

    def leftovers(self, state_dir: Path) -> list[Path]:
        """What a crash left in the partition's pins dir (handed out once, for removal)."""
        with self._lock:
            self._load()
            return self._leftovers.pop(state_dir, [])

    # -- sight pins ---------------------------------------------------------------------------------

    def pins_of(self, state_dir: Path) -> dict[int, SightPin]:
        """The partition's sight pins by base offset (a copy)."""
        with self._lock:
            self._load()
            return dict(self._pins.get(state_dir, {}))

    def room(self, log_dir: Path) -> int | None:
        """Bytes a new pin may still take in ``log_dir``; None = unlimited."""
        if self.bound < 0:
            return None
        with self._lock:
            return max(0, self.bound - self._dir(log_dir).total)

    def admit(self, pin: SightPin, staged: Path) -> bool:
        """Publish the sight pin linked in ``staged`` (renamed to ``pin.path``) if it fits."""
        with self._lock:
            d = self._dir(pin.log_dir)
            new = sum(size for inode, size in pin.files.items() if inode not in d.inodes)
            if self.bound >= 0 and d.total + new > self.bound:
                return False
            if pin.path.exists():  # a pin this ledger does not count (another log dir's name)
                shutil.rmtree(pin.path)
            os.rename(staged, pin.path)
            fsync_dir(pin.path.parent)
            self._register(pin)
            self._publish(pin.log_dir)
            return True

    def release(self, pin: SightPin) -> None:
        """Drop a sight pin: its files, and its bytes from the account."""
        with self._lock:
            self._load()
            registered = self._pins.get(pin.state_dir, {}).pop(pin.base_offset, None)
            if registered is not None:
                d = self._dir(registered.log_dir)
                self._remove(d, registered.files)
                d.pins -= 1
            shutil.rmtree(pin.path, ignore_errors=True)
            self._publish(pin.log_dir)

    def refused(self, state_dir: Path, log_dir: Path, base: int, size: int) -> None:
        """The bound kept segment ``base`` (``size`` bytes) of a partition from a pin: counted
        once per segment, persisted, and logged when it starts the log dir's crossing."""
        with self._lock:
            d = self._dir(log_dir)
            prev = d.refused_by.get(state_dir)
            if prev is not None and prev[0] == base:
                return
            starts = not d.refused_by
            since = prev[1] if prev is not None else self._clock()
            d.refused_by[state_dir] = (base, since)
            write_refused(state_dir, log_dir, base, since)
            if self._metrics is not None:
                self._metrics.pin_refused.labels(log_dir=str(log_dir)).inc()
            if starts:
                log.warning(
                    "%s: pinned segment files reached tiering.max_pinned_bytes (%d + %d bytes > %d): "
                    "new segments are not pinned until tiering frees room, and the broker's retention "
                    "may delete them before they are tiered (docs/operations.md)",
                    log_dir,
                    d.total,
                    size,
                    self.bound,
                )
            self._publish(log_dir)

    def satisfied(self, state_dir: Path, log_dir: Path) -> None:
        """The partition holds every pending segment it wanted: its refusal (if any) is over."""
        with self._lock:
            d = self._dir(log_dir)
            if d.refused_by.pop(state_dir, None) is None:
                return
            clear_refused(state_dir)
            if not d.refused_by:
                log.info(
                    "%s: pinned segment files back under tiering.max_pinned_bytes (%d of %d bytes): "
                    "every new segment is pinned again",
                    log_dir,
                    d.total,
                    self.bound,
                )
            self._publish(log_dir)

    def refusal_of(self, state_dir: Path) -> tuple[int, int] | None:
        """(oldest refused base, since ms) of a partition, None when it pins all it wants."""
        with self._lock:
            self._load()
            for d in self._dirs.values():
                if state_dir in d.refused_by:
                    return d.refused_by[state_dir]
            return None

    def release_stale(self, live: set[Path], *, dry_run: bool = False) -> list[SightPin]:
        """Drop the pins of every state dir not in ``live`` (the partitions rlm tiers now: a topic
        no longer tiered, a partition gone, an old incarnation) and forget pins whose files another
        process removed; returns the pins dropped (or, ``dry_run``, that would be)."""
        with self._lock:
            self._load()
            stale = [p for s, pins in self._pins.items() if s not in live for p in pins.values()]
            gone = [p for pins in self._pins.values() for p in pins.values() if not p.path.exists()]
            if dry_run:
                return stale
            for pin in stale + gone:
                self.release(pin)
            for d in self._dirs.values():
                for state_dir in [s for s in d.refused_by if s not in live]:
                    d.refused_by.pop(state_dir)
            for log_dir in self._dirs:
                self._publish(log_dir)
            return stale

    # -- copy pins ----------------------------------------------------------------------------------

    def claim_copy(self, log_dir: Path, directory: Path) -> PinClaim | None:
        """Count the copy pin linked in ``directory``; None when it must wait (module doc)."""
        files = linked_files(directory)
        with self._lock:
            d = self._dir(log_dir)
            need = sum(size for inode, size in files.items() if inode not in d.inodes)
            over = False
            if self.bound > 0 and d.total + need > self.bound:
                self._evict(log_dir, d, need, set(files))
                if d.total + need > self.bound:
                    if d.over_bound:
                        return None
                    over = True
                    d.over_bound += 1
                    log.warning(
                        "%s: a copy pins %d bytes past tiering.max_pinned_bytes (%d held, bound %d): "
                        "the pins that fill it hold segments the broker already deleted",
                        log_dir,
                        need,
                        d.total,
                        self.bound,
                    )
            self._add(d, files)
            self._publish(log_dir)
            return PinClaim(self, log_dir, files, over)

    def _evict(self, log_dir: Path, d: _LogDir, need: int, keep: set[Inode]) -> None:
        """Drop sight pins whose broker file is still there, newest first, until ``need`` fits."""
        pins = [p for ps in self._pins.values() for p in ps.values() if p.log_dir == log_dir]
        for pin in sorted(pins, key=lambda p: (p.pinned_ms, p.base_offset), reverse=True):
            if d.total + need <= self.bound:
                return
            if keep & set(pin.files) or not pin.broker_still_has():
                continue
            log.info(
                "%s: dropped the pin of segment %d (the broker still has it; pinned again when "
                "there is room) to make room for a copy",
                pin.partition_dir.name,
                pin.base_offset,
            )
            self.release(pin)

    def _unclaim(self, claim: PinClaim) -> None:
        with self._lock:
            d = self._dir(claim.log_dir)
            self._remove(d, claim.files)
            if claim.over_bound:
                d.over_bound -= 1
            self._publish(claim.log_dir)

    # -- reporting ----------------------------------------------------------------------------------

    def _publish(self, log_dir: Path) -> None:
        if self._metrics is None:
            return
        d = self._dirs.get(log_dir) or _LogDir()
        label = str(log_dir)
        m = self._metrics
        m.pinned_bytes.labels(log_dir=label).set(d.total)
        m.pinned_segments.labels(log_dir=label).set(self._count(log_dir))
        m.pin_bound_reached.labels(log_dir=label).set(1 if d.refused_by else 0)

    def _count(self, log_dir: Path) -> int:
        d = self._dirs.get(log_dir)
        return d.pins if d is not None else 0

    def summary(self) -> list[dict[str, Any]]:
        """Per configured log dir: pinned bytes and segments, the bound, whether it is reached
        (since when, epoch ms) and how many partitions wait for room (``GET /v1/pins``)."""
        with self._lock:
            self._load()
            rows = []
            for log_dir in self._log_dirs:
                d = self._dir(log_dir)
                since = min((s for _b, s in d.refused_by.values()), default=None)
                rows.append(
                    {
                        "log_dir": str(log_dir),
                        "pinned_bytes": d.total,
                        "pinned_segments": self._count(log_dir),
                        "max_pinned_bytes": self.bound,
                        "bound_reached": bool(d.refused_by),
                        "bound_reached_since_ms": since,
                        "partitions_refused": len(d.refused_by),
                    }
                )
            return rows
