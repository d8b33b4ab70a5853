"""``isolation = read_committed | read_uncommitted`` for every read surface (docs/transactions.md).

One partition's transaction knowledge is a :class:`~rlm.tiering.read.partition_txns.PartitionTxns`
over its segments of both tiers (:func:`reader_txns` lists them for a partition reader; each
source's aborted transactions come from a stored ``.txnindex`` or its scanned control batches).

A read_committed fetch is (1) bounded by the last stable offset (:meth:`PartitionTxns.last_stable_offset`),
(2) given the aborted transactions Kafka's broker would list for it (:func:`collect_aborted` from
the fetch's segment on, until an entry proves the list complete), (3) filtered with a Kafka
consumer's rules (:func:`committed_batches`): aborted batches and control batches are dropped.
The last stable offset is replayed from a known producer state — a copy's recorded
``open_at_end`` or Kafka's producer snapshot (:mod:`rlm.tiering.store.producer_state`) — at or below
the first local segment, never from the local segments alone (a transaction opened in a tiered
segment by a producer silent since would be missed).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from rlm.errors import InvalidArgumentError, ObjectNotFoundError
from rlm.formats.transactions import committed_batches
from rlm.logdir.index_sets import SetView
from rlm.logdir.scan import list_segments
from rlm.storage.api import StorageBackend
from rlm.tiering.read.lookup import FetchResult, PartitionReader
from rlm.tiering.read.partition_txns import PartitionTxns
from rlm.tiering.read.txn_sources import FACTS, TxnSource, local_sources
from rlm.tiering.read.visibility import PartitionOffsets, batches_below
from rlm.tiering.store import (
    TXN_INDEX_OBJECT,
    SegmentManifest,
    StoreProtection,
    keys,
    open_at_end,
    snapshot_key,
)

__all__ = [
    "ISOLATION_LEVELS",
    "Isolation",
    "apply_isolation",
    "check_isolation",
    "fetch",
    "fetcher",
    "reader_txns",
]

log = logging.getLogger(__name__)

Isolation = Literal["read_uncommitted", "read_committed"]
ISOLATION_LEVELS: tuple[Isolation, ...] = ("read_uncommitted", "read_committed")


def check_isolation(value: str) -> Isolation:
    """``value`` as an :data:`Isolation` (Kafka's ``isolation.level`` names), else
    :class:`InvalidArgumentError` naming the field."""
    if value == "read_committed":
        return "read_committed"
    if value == "read_uncommitted":
        return "read_uncommitted"
    raise InvalidArgumentError(
        f"isolation {value!r} must be read_uncommitted or read_committed", field="isolation"
    )


def apply_isolation(fetched: Any, txns: PartitionTxns, isolation: Isolation) -> Any:
    """A :class:`~rlm.tiering.read.lookup.FetchResult` as ``isolation`` returns it: unchanged for
    read_uncommitted; for read_committed only batches below the last stable offset, without
    aborted or control batches, with the aborted transactions Kafka would list and the offset to
    resume from (after the last batch examined, kept or not)."""
    if isolation == "read_uncommitted":
        return fetched
    end = fetched.high_watermark
    lso = txns.last_stable_offset(end) if end is not None else None
    examined = list(fetched.batches if lso is None else batches_below(iter(fetched.batches), lso))
    if not examined:
        return replace(
            fetched,
            data=b"",
            batches=[],
            isolation=isolation,
            last_stable_offset=lso,
            resume_offset=fetched.requested_offset,
        )
    upper = examined[-1].last_offset + 1
    found = txns.aborted(examined[0].base_offset, upper)
    if found.scanned:
        log.debug(
            "read_committed %s-%s [%d, %d): no transaction index stored for %d segment(s); "
            "scanned their control batches",
            fetched.topic,
            fetched.partition,
            examined[0].base_offset,
            upper,
            len(found.scanned),
        )
    kept, _skipped = committed_batches(fetched.data, examined, found.entries)
    data = b"".join(fetched.data[b.position : b.end_position] for b in kept)
    rebased, origin = [], 0
    for b in kept:
        rebased.append(replace(b, position=origin))
        origin += b.size
    return replace(
        fetched,
        data=data,
        batches=rebased,
        isolation=isolation,
        last_stable_offset=lso,
        resume_offset=upper,
        aborted_transactions=tuple(found.entries),
        txn_scanned=tuple(found.scanned),
    )


# -- the partition readers' view (HTTP, CLI) ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Facts:
    """What a reader needs from the manifest committing one log object (docs/transactions.md)."""

    captured: bool = False  # its aborted transactions were captured (``txn_index``)
    txn_key: str | None = None  # the stored entries' key (None: none stored)
    protected: SegmentManifest | None = None  # the manifest, when its objects are protected
    snapshot: tuple[int, str] | None = None  # (offset, key) of its usable producer snapshot
    last_offset: int = -1
    open_at_end: tuple[tuple[int, int], ...] | None = None  # see TxnSource.open_at_end


def _manifest_facts(backend: StorageBackend, protection: StoreProtection, key: str) -> _Facts:
    """The :class:`_Facts` of the manifest committing the log object ``key`` (all unknown when it
    is gone or names another attempt)."""
    root = keys.parse_root(key)
    ref = keys.parse_data_key(root.topic, root.partition, key, root.topic_id) if root else None
    if root is None or ref is None:
        return _Facts()
    mkey = keys.manifest_key(root.topic, root.partition, ref.base_offset, root.topic_id)
    try:
        manifest = protection.read_manifest(backend.read, mkey)
    except ObjectNotFoundError:
        return _Facts()  # deleted by retention meanwhile: scan what is still readable
    protected = manifest if manifest.protection is not None else None
    if manifest.attempt_id != ref.attempt_id:
        return _Facts(protected=protected)
    snap = snapshot_key(manifest, manifest.base_offset)
    stored = manifest.objects.get(TXN_INDEX_OBJECT)
    return _Facts(
        manifest.txn_index is not None,
        stored.key if stored is not None else None,
        protected,
        (manifest.base_offset, snap) if snap is not None else None,
        manifest.last_offset,
        open_at_end(manifest),
    )


def _remote_groups(reader: PartitionReader) -> list[tuple[str, int, int]]:
    """``(object url, first offset, last offset)`` of every remote segment in the reader's sets."""
    out: list[tuple[str, int, int]] = []
    for view in reader._sets():
        last = view.last.entry.rdi.url if view.last is not None else ""
        out += FACTS.get(
            ("groups", str(reader.part.path), view.base_offset, len(view.log_index), last),
            functools.partial(_set_groups, view),
        )
    return out


def _set_groups(view: SetView) -> list[tuple[str, int, int]]:
    out: list[tuple[str, int, int]] = []
    current = view.first
    while current is not None:
        e = current.entry
        if out and out[-1][0] == e.rdi.url:
            out[-1] = (e.rdi.url, out[-1][1], e.last_offset)
        else:
            out.append((e.rdi.url, e.first_offset, e.last_offset))
        current = view.entry_after(current)
    return out


def reader_txns(reader: PartitionReader, ranges: PartitionOffsets) -> PartitionTxns:
    """The sources a partition reader serves: remote segments below the local log start, then
    the local segments, up to the visible end."""
    end = ranges.visible_end_offset if ranges.visible_end_offset is not None else 0
    local_start = ranges.local_log_start_offset
    res = reader.res
    sources: list[TxnSource] = []
    for url, first, last in _remote_groups(reader):
        if (local_start is not None and first >= local_start) or first >= end:
            continue
        key = res.backend.key_for_url(url)
        facts: _Facts = FACTS.get(
            ("manifest", url),
            lambda k=key: _manifest_facts(res.backend, res.protection, k),  # type: ignore[misc]
        )
        last = min(last, end - 1, (local_start if local_start is not None else end) - 1)
        snap = facts.snapshot
        sources.append(
            TxnSource(
                first,
                last,
                "remote",
                key,
                facts.txn_key,
                facts.captured,
                (url,),
                facts.protected,
                snap[1] if snap is not None and snap[0] == first else None,
                facts.open_at_end if last == facts.last_offset else None,
            )
        )
    sources += local_sources(list_segments(reader.part), end, local_start or 0)
    return PartitionTxns(sources, res.backend, res.protection, log_start=ranges.log_start_offset)


def fetch(
    reader: PartitionReader,
    offset: int,
    max_bytes: int,
    isolation: Isolation = "read_uncommitted",
    **options: Any,
) -> FetchResult:
    """:meth:`PartitionReader.fetch` (``options``: its keyword options) under ``isolation``
    (see :func:`apply_isolation`)."""
    fetched = reader.fetch(offset, max_bytes, **options)
    if isolation == "read_uncommitted":
        return fetched
    txns = reader_txns(reader, reader.offsets())
    result: FetchResult = apply_isolation(fetched, txns, isolation)
    return result


def fetcher(
    reader: PartitionReader, isolation: Isolation = "read_uncommitted", **options: Any
) -> Callable[[int, int], FetchResult]:
    """``(offset, max_bytes) → FetchResult`` for a stream of fetches (``/records/stream``): under
    read_committed a fetch whose batches were all aborted or markers is followed at once by the
    next one, so an answer has batches unless it reached the last stable offset."""
    if isolation == "read_uncommitted":
        return lambda offset, max_bytes: reader.fetch(offset, max_bytes, **options)

    def run(offset: int, max_bytes: int) -> FetchResult:
        while True:
            got = fetch(reader, offset, max_bytes, isolation, **options)
            if got.batches or got.next_offset is None or got.next_offset <= offset:
                return got
            offset = got.next_offset

    return run
