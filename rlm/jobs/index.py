"""``rebuild_index`` and bulk ``offsets_for_times`` as Spark jobs: one task per partition."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from rlm.config import Settings
from rlm.errors import InvalidArgumentError
from rlm.formats.indexes.remote_index import iter_entries
from rlm.jobs.reading import BackendSpec, select_partitions
from rlm.tiering.converge import index_links, progress_after
from rlm.tiering.local import PartitionContext, Progress, remote_view
from rlm.tiering.store import Chain, Link, RemoteState, SegmentManifest

__all__ = ["OFFSETS_SCHEMA_DDL", "OffsetRow", "offsets_for_times", "rebuild_index"]

OFFSETS_SCHEMA_DDL = "topic string, partition int, offset long, timestamp long, tier string"


#: What an executor ships back for one partition: topic, partition, and per served link (in chain
#: order) its manifest (JSON), the offsets ``[first, last]`` it serves and its entries (encoded).
_Fetched = tuple[str, int, list[tuple[bytes, int, int]], list[bytes]]


def _fetch_partition(spec: BackendSpec, topic: str, partition: int, key_id: str | None) -> _Fetched:
    """Executor side: the store's chain (docs/cluster.md) of the partition's incarnation
    (``key_id``: its root, docs/topic-identity.md) and each link's entries, as plain data."""
    remote = RemoteState(spec.create(), topic, partition, key_id, protection=spec.protection())
    links = remote.chain().links
    return (
        topic,
        partition,
        [(lk.manifest.to_json(), lk.first_offset, lk.last_offset) for lk in links],
        [b"".join(e.encode() for e in remote.link_entries(lk)) for lk in links],
    )


def rebuild_index(spark: Any, settings: Settings, topics: Sequence[str] | None = None) -> dict[str, int]:
    """Rebuild the local remote-index sets of every partition (of ``topics``) from the store alone.

    Executors fetch each partition's chain and its links' entries (one task per partition); the
    driver then replaces the partition's index family and progress as ``rlm rebuild-index`` does
    in-process: every set deleted, the chain indexed by :func:`rlm.tiering.converge.sync.index_links`,
    progress from :func:`rlm.tiering.converge.recovery.progress_after` (the DeleteRecords point kept).
    Unlike the in-process command it does not resolve the copy journal: the daemon's own recovery
    does that when it next starts. Do not run it beside a daemon that is copying the same
    partitions. Returns ``{"<topic>-<partition>": entries indexed}``.
    """
    from rlm.storage.registry import open_backend
    from rlm.tiering.manager import RemoteLogManager

    parts = {(p.topic, p.partition): p for p in select_partitions(settings, topics)}
    views = {tp: remote_view(settings.tiering, p) for tp, p in parts.items()}
    wanted = sorted((t, p, views[(t, p)].key_id) for t, p in parts if views[(t, p)].servable)
    spec = BackendSpec.from_settings(settings)
    fetched: list[_Fetched] = (
        spark.sparkContext.parallelize(wanted, max(1, len(wanted)))
        .map(lambda tpk: _fetch_partition(spec, tpk[0], tpk[1], tpk[2]))
        .collect()
    )
    manager = RemoteLogManager(settings, open_backend(spec.name, spec.options, spec.prefix_spread))
    rebuilt: dict[str, int] = {}
    for topic, partition, links, entry_blobs in sorted(fetched):
        ctx = manager.context(parts[(topic, partition)])
        ctx.key_id = views[(topic, partition)].key_id
        rebuilt[ctx.part.name] = _reindex(ctx, links, entry_blobs)
    return rebuilt


def _reindex(ctx: PartitionContext, links: list[tuple[bytes, int, int]], entry_blobs: list[bytes]) -> int:
    """Replace ``ctx``'s index family and progress by the fetched chain; return the entries."""
    chain = Chain(tuple(Link(SegmentManifest.from_json(d), first, last) for d, first, last in links))
    entries = [[d.entry for d in iter_entries(blob)] for blob in entry_blobs]
    ctx.family.open()
    deleted_below = Progress.load(ctx.progress_path).delete_records_offset
    # The old progress stays until the new one replaces it: readers meanwhile answer what it
    # claims from the store, and the rebuilt sets appear whole (docs/read-path.md).
    with ctx.family.staged():
        ctx.family.delete_all()
        index_links(ctx, chain, entries)
    ctx.manifests = chain.manifests
    ctx.progress = Progress(*progress_after(chain, Progress()), deleted_below)
    ctx.save_progress()
    return sum(len(e) for e in entries)


OffsetRow = tuple[str, int, int, int | None, str | None]


def _lookup_partitions(
    settings: Settings, spec: BackendSpec, target: int, rows: Iterator[tuple[str, int]]
) -> Iterator[OffsetRow]:
    from rlm.tiering.read import TieredReaders

    readers = TieredReaders(settings, spec.create())
    try:
        for topic, partition in rows:
            row = readers.offset_for_time(topic, partition, target)
            yield row.topic, row.partition, row.offset, row.timestamp, row.tier
    finally:
        readers.close()


def offsets_for_times(
    spark: Any, settings: Settings, timestamp: int, topics: Sequence[str] | None = None, minus_ms: int = 0
) -> Any:
    """Per partition, the offset a consumer resumes at to read from ``timestamp - minus_ms`` on
    (Kafka ListOffsets, incl. the special values -1…-5), as a DataFrame
    ``topic string, partition int, offset long, timestamp long, tier string`` — row for row what
    the in-process :meth:`rlm.tiering.read.readers.TieredReaders.offsets_for_times` returns
    (a partition with no visible record that recent → its high watermark, timestamp/tier null;
    docs/visibility.md).

    One lookup task per partition; lookups read the local index sets and segments, so executors
    run on the sidecar host (``local[*]``).
    """
    if minus_ms < 0:
        raise InvalidArgumentError(f"minus {minus_ms} ms must not be negative")
    target = timestamp - minus_ms if timestamp >= 0 else timestamp
    if timestamp >= 0 and target < 0:
        target = 0
    parts = [(p.topic, p.partition) for p in select_partitions(settings, topics, served=True)]
    if not parts:
        return spark.createDataFrame([], OFFSETS_SCHEMA_DDL)
    spec = BackendSpec.from_settings(settings)
    rdd = spark.sparkContext.parallelize(
        parts, min(len(parts), spark.sparkContext.defaultParallelism * 4)
    ).mapPartitions(lambda rows: _lookup_partitions(settings, spec, target, rows))
    return spark.createDataFrame(rdd, OFFSETS_SCHEMA_DDL)
