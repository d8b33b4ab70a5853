"""``isolation = read_committed | read_uncommitted`` for every read surface (docs/transactions.md).

One partition's transaction knowledge is a :class:`~rlm.tiering.read.partition_txns.PartitionTxns`
over its segments of both tiers, which :class:`~rlm.tiering.read.visibility.Visibility` builds
when a read_committed answer asks (each source's aborted transactions come from a stored
``.txnindex`` or its scanned control batches).

A read_committed fetch is (1) bounded by the last stable offset (:meth:`Visibility.last_stable_offset`),
(2) given the aborted transactions Kafka's broker would list for it (:func:`collect_aborted` from
the fetch's segment on, until an entry proves the list complete), (3) filtered with a Kafka
consumer's rules (:func:`committed_batches`): aborted batches and control batches are dropped.
The last stable offset is replayed from a known producer state — a copy's recorded
``open_at_end`` or Kafka's producer snapshot (:mod:`rlm.tiering.store.producer_state`) — at or below
the first local segment, never from the local segments alone (a transaction opened in a tiered
segment by a producer silent since would be missed).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from rlm.errors import InvalidArgumentError
from rlm.formats.transactions import committed_batches
from rlm.tiering.read.answers import FetchResult
from rlm.tiering.read.lookup import PartitionReader
from rlm.tiering.read.visibility import Isolation, Visibility, batches_below

__all__ = [
    "ISOLATION_LEVELS",
    "Isolation",
    "apply_isolation",
    "check_isolation",
    "fetch",
    "fetcher",
]

log = logging.getLogger(__name__)

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


def apply_isolation(fetched: Any, vis: Visibility, isolation: Isolation) -> Any:
    """A :class:`~rlm.tiering.read.answers.FetchResult` as ``isolation`` returns it: unchanged for
    read_uncommitted; for read_committed only batches below the last stable offset ``vis`` gives,
    without aborted or control batches, with the aborted transactions Kafka would list and the
    offset to resume from (after the last batch examined, kept or not)."""
    if isolation == "read_uncommitted":
        return fetched
    lso = vis.last_stable_offset() if fetched.high_watermark is not None else None
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
    found = vis.aborted(examined[0].base_offset, upper)
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
    result: FetchResult = apply_isolation(fetched, fetched.seen, isolation)
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
