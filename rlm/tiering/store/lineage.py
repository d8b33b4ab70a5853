"""Which committed segments make up a partition's remote log: the chain (pure; docs/cluster.md).

Several sidecars commit manifests into one partition root. Two things can make a committed
manifest not (wholly) part of the log that readers must see:

* **Divergence.** After an unclean leader election the new leader's log differs from what an old
  leader tiered. Kafka's rule (its ``LeaderEpochFileCache.endOffsetFor``): data written in leader
  epoch ``e`` is part of a lineage only below the start offset of the first *later* epoch in that
  lineage. A manifest records the ``(epoch, start offset)`` entries in force over its offsets, so
  each of its offset ranges can be judged against a lineage; offsets from the first contradicted
  one on are *diverged*. A lineage only judges epochs older than its newest: data of a newer
  epoch than a lineage knows is not contradicted by it (that lineage is merely behind).
* **Overlap.** Two sidecars that both believed they led (stale leadership) may both commit the
  same offsets under different base offsets. Manifests are walked by base offset; offsets a
  manifest shares with the chain before it are *superseded*: a manifest wholly covered is dropped,
  one partly covered joins the chain from the first offset after it.

:func:`resolve_chain` applies both rules to a set of manifests and lineages (the writing leaders'
lineages recorded in :class:`LineageMarker` objects, plus the local ``leader-epoch-checkpoint``), so
every sidecar that lists the same manifests serves the same offsets from the same objects.
Offsets are inclusive unless named ``end``; a lineage is ``((epoch, start offset), ...)`` in
ascending order, as in a ``leader-epoch-checkpoint``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlm.errors import FormatError
from rlm.formats.checkpoint import EpochEntry
from rlm.tiering.store.idle_note import IdleNote
from rlm.tiering.store.manifest import SegmentManifest

__all__ = [
    "Chain",
    "Lineage",
    "LineageMarker",
    "Link",
    "Stamp",
    "StoreView",
    "epoch_end",
    "epoch_ranges",
    "first_diverged",
    "lineage_of",
    "merged_epochs",
    "replica_diverged",
    "resolve_chain",
]

Lineage = tuple[tuple[int, int], ...]


def lineage_of(entries: Iterable[EpochEntry]) -> Lineage:
    """A lineage from leader-epoch-checkpoint entries (file order is ascending)."""
    return tuple((e.epoch, e.start_offset) for e in entries)


def epoch_end(lineage: Lineage, epoch: int) -> int | None:
    """Exclusive end offset of ``epoch``'s data in ``lineage``: the start offset of the first entry
    with a larger epoch; None when the lineage knows no larger epoch (unbounded)."""
    for entry_epoch, start in lineage:
        if entry_epoch > epoch:
            return start
    return None


def epoch_ranges(manifest: SegmentManifest) -> list[tuple[int, int, int]]:
    """``(epoch, first, last)`` offset ranges of a manifest by its recorded leader epochs; empty
    when it recorded none (its data cannot be judged)."""
    epochs = manifest.leader_epochs
    out = []
    for i, (epoch, start) in enumerate(epochs):
        first = max(start, manifest.base_offset)
        last = epochs[i + 1][1] - 1 if i + 1 < len(epochs) else manifest.last_offset
        if first <= min(last, manifest.last_offset):
            out.append((epoch, first, min(last, manifest.last_offset)))
    return out


def first_diverged(manifest: SegmentManifest, lineage: Lineage) -> int | None:
    """The first offset of ``manifest`` that ``lineage`` contradicts, None when none is.

    Per epoch range of the manifest: an epoch newer than the lineage's newest is not judged; one
    older than its oldest entry (Kafka trims the cache from the start) is valid below that entry's
    start; one the lineage holds is valid below :func:`epoch_end`; one between its oldest and
    newest that it does not hold never had data on this lineage, so all of it diverged (Kafka's
    follower truncates to the end of the epoch before it, which ends where this data begins).
    """
    return _contradicted(epoch_ranges(manifest), lineage)


def replica_diverged(local: Lineage, lineages: Iterable[Lineage]) -> int | None:
    """The first offset of a replica's log whose ``leader-epoch-checkpoint`` is ``local`` that one
    of ``lineages`` contradicts, None when none does: from there on the replica holds data an
    unclean election threw away, which its broker truncates only once it rejoins (docs/cluster.md
    "A replica's own diverged data"). The rule of :func:`first_diverged`, with the replica's
    newest epoch running to the end of its log, wherever that is."""
    ranges: list[tuple[int, int, int | None]] = [
        (epoch, start, local[i + 1][1] - 1 if i + 1 < len(local) else None)
        for i, (epoch, start) in enumerate(local)
    ]
    found = [d for lineage in lineages if (d := _contradicted(ranges, lineage)) is not None]
    return min(found, default=None)


def _contradicted(ranges: Iterable[tuple[int, int, int | None]], lineage: Lineage) -> int | None:
    """The first offset of ``ranges`` (``(epoch, first, last)`` ascending; ``last`` None: open)
    that ``lineage`` contradicts (:func:`first_diverged`)."""
    if not lineage:
        return None
    held = {epoch for epoch, _ in lineage}
    for epoch, first, last in ranges:
        if epoch > lineage[-1][0] or (last is not None and last < first):
            continue
        if epoch < lineage[0][0] or epoch in held:
            end = epoch_end(lineage, epoch)
            if end is not None and (last is None or end <= last):
                return max(first, end)
        else:
            return first
    return None


@dataclass(frozen=True, slots=True)
class LineageMarker:
    """A leader's record that its lineage cuts tiered data (object ``manifests/lineage-<epoch>.json``).

    ``epoch``: the newest epoch of ``lineage`` (one marker per epoch, created only if absent);
    ``diverged_from``: the first tiered offset the lineage contradicted when it was written;
    ``node_id``: the broker whose sidecar wrote it; ``written_ms``: ms since the epoch.
    """

    epoch: int
    lineage: Lineage
    diverged_from: int
    node_id: int | None
    written_ms: int

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "epoch": self.epoch,
                "lineage": [list(e) for e in self.lineage],
                "diverged_from": self.diverged_from,
                "node_id": self.node_id,
                "written_ms": self.written_ms,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, data: bytes, *, key: str) -> LineageMarker:
        """Parse; FormatError names ``key`` and the field when it is malformed."""
        try:
            doc: Any = json.loads(data)
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
            ints = {}
            for name in ("epoch", "diverged_from", "written_ms"):
                value = doc.get(name)
                if not isinstance(value, int) or isinstance(value, bool):
                    raise ValueError(f"field {name} = {value!r} must be an integer")
                ints[name] = value
            node = doc.get("node_id")
            if node is not None and (not isinstance(node, int) or isinstance(node, bool)):
                raise ValueError(f"field node_id = {node!r} must be an integer or null")
            lineage = tuple((int(e), int(s)) for e, s in doc.get("lineage", []))
            return cls(ints["epoch"], lineage, ints["diverged_from"], node, ints["written_ms"])
        except (ValueError, TypeError, RecursionError) as err:
            raise FormatError(f"{key}: malformed lineage marker: {err}") from None


@dataclass(frozen=True, slots=True)
class Link:
    """One manifest's part of the chain: offsets ``[first_offset, last_offset]`` of it are served.

    ``first_offset`` > the manifest's base when an earlier manifest already covers its head
    (overlap); ``last_offset`` < its last offset when its tail is diverged.
    """

    manifest: SegmentManifest
    first_offset: int
    last_offset: int

    @property
    def whole(self) -> bool:
        return (
            self.first_offset == self.manifest.base_offset and self.last_offset == self.manifest.last_offset
        )

    @property
    def signature(self) -> tuple[int, str, int, int]:
        """What a reader's local index of this link depends on."""
        return self.manifest.base_offset, self.manifest.attempt_id, self.first_offset, self.last_offset


@dataclass(frozen=True, slots=True)
class Chain:
    """The resolved remote log: ``links`` in offset order, and what is not served."""

    links: tuple[Link, ...]
    superseded: tuple[SegmentManifest, ...] = ()  # wholly covered by earlier links
    diverged: tuple[tuple[SegmentManifest, int], ...] = ()  # wholly diverged: (manifest, cut)

    @property
    def highest(self) -> int:
        """Highest offset served from the store, -1 when none is."""
        return self.links[-1].last_offset if self.links else -1

    @property
    def start(self) -> int:
        """Remote log start offset, -1 when nothing is served."""
        return self.links[0].first_offset if self.links else -1

    @property
    def manifests(self) -> list[SegmentManifest]:
        return [link.manifest for link in self.links]

    @property
    def first_diverged(self) -> int | None:
        """The lowest diverged offset of any manifest (wholly or partly diverged), None when none."""
        cuts = [offset for _m, offset in self.diverged]
        cuts += [link.last_offset + 1 for link in self.links if link.last_offset < link.manifest.last_offset]
        return min(cuts, default=None)


def _cut(manifest: SegmentManifest, lineages: Sequence[Lineage]) -> int | None:
    found = [d for lineage in lineages if (d := first_diverged(manifest, lineage)) is not None]
    return min(found, default=None)


def resolve_chain(manifests: Iterable[SegmentManifest], lineages: Sequence[Lineage] = ()) -> Chain:
    """The chain of ``manifests`` under ``lineages`` (see the module doc).

    Deterministic in the set of manifests: ties on base offset (two manifests at one base cannot
    both exist in a store, but a caller may merge listings) go to the earlier ``created_ms``, then
    the smaller attempt id.
    """
    links: list[Link] = []
    superseded: list[SegmentManifest] = []
    diverged: list[tuple[SegmentManifest, int]] = []
    for m in sorted(manifests, key=lambda m: (m.base_offset, m.created_ms, m.attempt_id)):
        cut = _cut(m, lineages)
        if cut is not None and cut <= m.base_offset:
            diverged.append((m, cut))
            continue
        last = m.last_offset if cut is None else cut - 1
        first = m.base_offset
        if links and first <= links[-1].last_offset:
            first = links[-1].last_offset + 1
            if first > last:
                superseded.append(m)
                continue
        links.append(Link(m, first, last))
    return Chain(tuple(links), tuple(superseded), tuple(diverged))


#: How a listing describes an object: size, etag, last modified (a key re-created is told apart).
Stamp = tuple[int, str | None, float | None]


@dataclass
class StoreView:
    """What this process last read of a partition's ``manifests/`` prefix, and what the local index
    holds (``held``: link signatures; None = not known since start, checked against local entries)."""

    manifests: dict[str, tuple[Stamp, SegmentManifest]] = field(default_factory=dict)
    markers: dict[str, tuple[Stamp, LineageMarker]] = field(default_factory=dict)
    held: tuple[tuple[int, str, int, int], ...] | None = None
    chain: Chain = field(default_factory=lambda: Chain(()))
    #: The highest log start a marker of rlm's DeleteRecords names (docs/formats.md §6.8); -1 none.
    log_start: int = -1
    #: The leader's idle note as last listed (docs/cluster.md "Idle partitions"): its stamp and the
    #: note, None for one that does not parse; None when the listing had none.
    idle_note: tuple[Stamp, IdleNote | None] | None = None


def merged_epochs(starts: Iterable[tuple[int, int]], log_start: int, log_end: int) -> list[EpochEntry]:
    """A leader-epoch cache as Kafka keeps it for the log ``[log_start, log_end)``, from
    ``(epoch, start offset)`` pairs gathered anywhere (manifests' ``leader_epochs``, a
    ``leader-epoch-checkpoint``): an epoch starts at the lowest start any pair gives it; a newer
    epoch replaces those starting at or after it (Kafka's ``assign``); entries starting at or after
    the log end are dropped (``truncateFromEnd``) and the one in force at the log start is moved to
    it (``truncateFromStart``)."""
    first: dict[int, int] = {}
    for epoch, start in starts:
        first[epoch] = min(start, first.get(epoch, start))
    out: list[EpochEntry] = []
    for epoch, start in sorted(first.items()):
        if start >= log_end:
            continue
        while out and out[-1].start_offset >= start:
            out.pop()
        out.append(EpochEntry(epoch, start))
    below = [e for e in out if e.start_offset <= log_start]
    if below:
        out = [EpochEntry(below[-1].epoch, log_start)] + [e for e in out if e.start_offset > log_start]
    return out
