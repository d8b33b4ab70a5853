"""Which of a partition directory's names are which segment's files, and which name a local
remote-index set's gate (docs/formats.md §2, §5), kept per listing.

:func:`~rlm.logdir.discovery.list_segments` runs on every ListOffsets and Fetch (the visibility
authority answers from it) and on every copy pass. Turning a listing into ``Path`` objects — five
per segment — is most of its cost on Python 3.11 (~0.5 of the 0.74 ms of a ListOffsets on a
50-segment partition), while a partition directory's names change only when the broker rolls,
deletes or compacts a segment. So the layout is kept for the exact listing it was made from: the
directory and its names in the order listed. Any other listing, one name more or less, or the same
names in another order, is a miss and is laid out anew. Nothing is trusted from a timestamp, and
the sizes are not kept: the caller ``stat``-s each ``.log`` every time.

The local remote-index sets (rlm/logdir/index_sets.py) are found from the same listing on every
Fetch: the bases whose gate (``.remoteoffsetindex``) is listed are part of the layout too, so one
memo serves both.

Bound: layouts of at most :data:`MAX_SEGMENTS_KEPT` segments in all (~2 KiB each; a listing of none
counts as one), least recently used dropped first; a listing of more segments than that is laid out
and not kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from rlm.errors import RlmError
from rlm.formats import naming

__all__ = ["MAX_SEGMENTS_KEPT", "Layout", "SegmentPaths", "layout_of"]

#: The most segments the kept layouts hold together (each ~2 KiB of ``Path`` objects).
MAX_SEGMENTS_KEPT = 8192

_SUFFIXES = (naming.LOG, naming.INDEX, naming.TIME_INDEX, naming.TXN_INDEX, naming.SNAPSHOT)


@dataclass(frozen=True, slots=True)
class SegmentPaths:
    """One segment's files as named by a listing (a companion absent from it: ``None``)."""

    base_offset: int
    log: Path
    index: Path | None
    time_index: Path | None
    txn_index: Path | None
    snapshot: Path | None


@dataclass(frozen=True, slots=True)
class Layout:
    """A listing's segments in base-offset order, its segment-suffixed names that start with no
    base offset (reported by the caller on every listing, kept or not), and the bases of the local
    remote-index sets whose gate it lists, ascending."""

    segments: tuple[SegmentPaths, ...]
    unnamed: tuple[Path, ...]
    set_gates: tuple[int, ...]

    @property
    def weight(self) -> int:
        """What it counts against :data:`MAX_SEGMENTS_KEPT`."""
        return max(1, len(self.segments))


_kept: OrderedDict[tuple[str, tuple[str, ...]], Layout] = OrderedDict()
_kept_segments = 0
_lock = threading.Lock()


def layout_of(directory: Path, names: list[str]) -> Layout:
    """The layout of ``names``, one listing of ``directory``: the kept one for this exact listing,
    else laid out now (and kept, within :data:`MAX_SEGMENTS_KEPT`). Thread-safe."""
    global _kept_segments
    key = (str(directory), tuple(names))
    with _lock:
        hit = _kept.get(key)
        if hit is not None:
            _kept.move_to_end(key)
            return hit
    layout = _lay_out(directory, names)
    if layout.weight > MAX_SEGMENTS_KEPT:
        return layout
    with _lock:
        if key not in _kept:
            _kept[key] = layout
            _kept_segments += layout.weight
            while _kept_segments > MAX_SEGMENTS_KEPT:
                _, dropped = _kept.popitem(last=False)
                _kept_segments -= dropped.weight
    return layout


def _lay_out(directory: Path, names: list[str]) -> Layout:
    """Transient files (``.deleted``, ``.cleaned``, ``.swap``) and other files (KRaft
    ``.checkpoint`` snapshots, ``partition.metadata``, remote index files) are left out."""
    by_suffix: dict[str, dict[int, str]] = {suffix: {} for suffix in _SUFFIXES}
    unnamed: list[Path] = []
    gates: list[int] = []
    for name in names:
        if naming.is_transient(name):
            continue
        if name.endswith(naming.REMOTE_OFFSET_INDEX):  # a set's gate: its name's base, if any
            gate = _base_offset_of(name)
            if gate is not None:
                gates.append(gate)
            continue
        _, dot, suffix = name.partition(".")
        if not dot:
            continue
        group = by_suffix.get("." + suffix)
        if group is None:
            continue
        base = _base_offset_of(name)
        if base is None:
            unnamed.append(directory / name)
            continue
        group[base] = name

    def companion(suffix: str, base: int) -> Path | None:
        name = by_suffix[suffix].get(base)
        return directory / name if name is not None else None

    segments = tuple(
        SegmentPaths(
            base_offset=base,
            log=directory / by_suffix[naming.LOG][base],
            index=companion(naming.INDEX, base),
            time_index=companion(naming.TIME_INDEX, base),
            txn_index=companion(naming.TXN_INDEX, base),
            snapshot=companion(naming.SNAPSHOT, base),
        )
        for base in sorted(by_suffix[naming.LOG])
    )
    return Layout(segments, tuple(unnamed), tuple(sorted(gates)))


def _base_offset_of(name: str) -> int | None:
    try:
        return naming.parse_base_offset(name)
    except (RlmError, ValueError):
        return None
