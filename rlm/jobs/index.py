"""``rebuild_index`` and bulk ``offsets_for_times`` as Spark jobs: one task per partition."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from rlm.config import Settings
from rlm.errors import InvalidArgumentError
from rlm.formats.remote_index import iter_entries
from rlm.jobs.plan import BackendSpec, select_partitions
from rlm.tiering.remote_state import RemoteState, remote_view

OFFSETS_SCHEMA_DDL = "topic string, partition int, offset long, timestamp long, tier string"


def _fetch_partition(
    spec: BackendSpec, topic: str, partition: int, key_id: str | None
) -> tuple[str, int, list[bytes], list[bytes]]:
    """Executor side: the manifests (JSON) of what the partition's incarnation serves (``key_id``:
    its root, docs/topic-identity.md; the store's chain, docs/cluster.md) and each one's entries
    for the offsets it serves, encoded."""
    remote = RemoteState(spec.create(), topic, partition, key_id, protection=spec.protection())
    links = remote.chain().links
    return (
        topic,
        partition,
        [lk.manifest.to_json() for lk in links],
        [b"".join(e.encode() for e in remote.link_entries(lk)) for lk in links],
    )


def rebuild_index(spark: Any, settings: Settings, topics: Sequence[str] | None = None) -> dict[str, int]:
    """Rebuild the local remote-index sets of every partition (of ``topics``) from the store alone.

    Executors fetch each partition's manifests and uploaded entries objects (one task per
    partition); the driver then replaces the partition's index family and progress the way
    ``RemoteLogManager.rebuild_index`` does (delete all sets, append each committed segment's
    entries in offset order, progress = last manifest / first manifest). Unlike the in-process
    command it does not resolve the copy journal: the daemon's own recovery does that when it
    next starts. Do not run it beside a daemon that is copying the same partitions. Returns
    ``{"<topic>-<partition>": entries indexed}``.
    """
    from rlm.formats.remote_index import RemoteLogIndexEntry
    from rlm.storage.registry import open_backend
    from rlm.tiering.manager import RemoteLogManager
    from rlm.tiering.manifest import SegmentManifest
    from rlm.tiering.state import Progress

    parts = {(p.topic, p.partition): p for p in select_partitions(settings, topics)}
    views = {tp: remote_view(settings.tiering, p) for tp, p in parts.items()}
    wanted = sorted((t, p, views[(t, p)].key_id) for t, p in parts if views[(t, p)].servable)
    spec = BackendSpec.from_settings(settings)
    fetched = (
        spark.sparkContext.parallelize(wanted, max(1, len(wanted)))
        .map(lambda tpk: _fetch_partition(spec, tpk[0], tpk[1], tpk[2]))
        .collect()
    )
    manager = RemoteLogManager(settings, open_backend(spec.name, spec.options, spec.prefix_spread))
    rebuilt: dict[str, int] = {}
    for topic, partition, manifest_docs, entry_blobs in sorted(fetched):
        part = parts[(topic, partition)]
        ctx = manager.context(part)
        ctx.key_id = views[(topic, partition)].key_id
        manifests = [SegmentManifest.from_json(d) for d in manifest_docs]
        ctx.family.open()
        ctx.family.delete_all()
        deleted_below = Progress.load(ctx.progress_path).delete_records_offset
        ctx.progress_path.unlink(missing_ok=True)
        count = 0
        for _manifest, blob in zip(manifests, entry_blobs, strict=True):
            entries: list[RemoteLogIndexEntry] = [d.entry for d in iter_entries(blob)]
            floor = ctx.family.last_offset
            kept = [e for e in entries if e.first_offset > floor]
            ctx.family.append_segment(kept)
            count += len(entries)
        # The served range: a link may start after its manifest's base (docs/cluster.md).
        highest = ctx.family.last_offset
        start = ctx.family.first_offset if ctx.family.first_offset is not None else -1
        ctx.manifests = manifests
        ctx.progress = Progress(highest, start, deleted_below)
        if ctx.family.sets and start >= 0:
            ctx.family.remove_below(start)
        ctx.save_progress()
        rebuilt[part.name] = count
    return rebuilt


OffsetRow = tuple[str, int, int, int | None, str | None]


def _lookup_partitions(
    settings: Settings, spec: BackendSpec, target: int, rows: Iterator[tuple[str, int]]
) -> Iterator[OffsetRow]:
    from rlm.tiering.readers import TieredReaders

    readers = TieredReaders(settings, spec.create())
    for topic, partition in rows:
        row = readers.offset_for_time(topic, partition, target)
        yield row.topic, row.partition, row.offset, row.timestamp, row.tier


def offsets_for_times(
    spark: Any, settings: Settings, timestamp: int, topics: Sequence[str] | None = None, minus_ms: int = 0
) -> Any:
    """Per partition, the offset a consumer resumes at to read from ``timestamp - minus_ms`` on
    (Kafka ListOffsets, incl. the special values -1…-5), as a DataFrame
    ``topic string, partition int, offset long, timestamp long, tier string`` — row for row what
    the in-process :meth:`rlm.tiering.readers.TieredReaders.offsets_for_times` returns
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
    parts = [(p.topic, p.partition) for p in select_partitions(settings, topics)]
    if not parts:
        return spark.createDataFrame([], OFFSETS_SCHEMA_DDL)
    spec = BackendSpec.from_settings(settings)
    rdd = spark.sparkContext.parallelize(
        parts, min(len(parts), spark.sparkContext.defaultParallelism * 4)
    ).mapPartitions(lambda rows: _lookup_partitions(settings, spec, target, rows))
    return spark.createDataFrame(rdd, OFFSETS_SCHEMA_DDL)
