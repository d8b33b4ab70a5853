"""``rlm export --format iceberg``: tiered history as an Apache Iceberg table, kept up to date
incrementally (docs/iceberg.md).

The driver opens (or creates) the table through pyiceberg, plans the read from the offsets the
table's last rlm snapshot records, has an *engine* (Spark executors, or the local engine's
workers) run :class:`IcebergSink` — the export sink seam of docs/export.md — to write the Parquet
data files (:mod:`rlm.jobs.tables.iceberg_files`), and commits them all in ONE snapshot
(``add_files``: one fast append) whose summary records the next offset to export per partition.
Until that commit, nothing written is visible: a crash leaves the current snapshot unchanged and
the files unreferenced; the next run deletes them (:func:`remove_orphans`) and writes again.

rlm's Spark jobs never load Iceberg's Spark runtime — no release of it loads in Spark 4.3, the
pyspark rlm installs, and the local engine has no JVM: executors write plain Parquet, the driver
commits, and :func:`rlm.jobs.tables.iceberg_read.spark_read_table` reads back the files pyiceberg
plans. A Spark that has the runtime reads and maintains the table through the same catalog
(:func:`~rlm.jobs.tables.iceberg_read.spark_catalog_conf`; tested with Spark 4.1, Iceberg 1.12).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlm.config import Settings
from rlm.errors import InvalidArgumentError, TableError
from rlm.jobs.reading import DEFAULT_TARGET_BYTES, BackendSpec, ReadPlan, ReadTask, arrow_schema, plan_read
from rlm.jobs.tables.iceberg_files import FILE_PREFIX, file_io, write_day_files
from rlm.jobs.tables.sink import DataFile, Sink
from rlm.tiering.local import crash_point
from rlm.tiering.read import check_isolation

__all__ = [
    "ATTEMPT_PROPERTY",
    "LOCK_NAME",
    "OFFSET_PROPERTY",
    "TOPIC_ID_PROPERTY",
    "Engine",
    "IcebergExportResult",
    "IcebergSink",
    "IcebergTarget",
    "Offsets",
    "export_iceberg",
    "exported_offsets",
    "exported_topic_ids",
    "load_table",
    "local_engine",
    "next_offsets",
    "open_table",
    "partition_spec_fields",
    "planned_topic_ids",
    "remove_orphans",
    "spark_engine",
]

log = logging.getLogger(__name__)

#: Snapshot summary property per Kafka partition: ``rlm.next-offset.<topic>-<partition>`` = the
#: first offset the next incremental run exports (every rlm snapshot carries the whole map).
OFFSET_PROPERTY = "rlm.next-offset."
#: Snapshot summary property per topic: ``rlm.topic-id.<topic>`` = the topic id (partition.metadata)
#: of the incarnation exported. A re-created topic is a new log whose offsets start again
#: (docs/topic-identity.md): an incremental run refuses it rather than skip or mix its records.
TOPIC_ID_PROPERTY = "rlm.topic-id."
#: Snapshot summary property naming the export run (its id is in its data files' names).
ATTEMPT_PROPERTY = "rlm.attempt"
LOCK_NAME = ".rlm-export.lock"

#: An export engine: runs every task of the plan through the sink on its workers, then commits
#: it (:func:`rlm.jobs.tables.export_local.run_sink`, :func:`rlm.jobs.tables.spark_sink.run_sink_spark`).
Engine = Callable[[ReadPlan, BackendSpec, Sink], list[DataFile]]
Offsets = dict[tuple[str, int], int]


@dataclass(frozen=True, slots=True)
class IcebergTarget:
    """Where the table is: catalog properties + name, namespace, table; ``lock_dir`` (the embedded
    catalog's directory) serialises exports; ``orphan_grace_ms``: unreferenced rlm data files
    younger than this are left alone (0 when the lock proves no other export runs)."""

    catalog_name: str
    properties: dict[str, str]
    namespace: str
    table: str
    lock_dir: Path | None = None
    orphan_grace_ms: int = 0

    @classmethod
    def from_settings(cls, settings: Settings, out: Path | None) -> IcebergTarget:
        """``[iceberg]``; without ``catalog`` properties, an embedded SQLite catalog whose database
        (``catalog.db``) and warehouse (``warehouse/``) are under ``out``."""
        conf = settings.iceberg
        if conf.catalog:
            return cls(
                conf.catalog_name,
                dict(conf.catalog),
                conf.namespace,
                conf.table,
                orphan_grace_ms=settings.tiering.gc_grace_ms,
            )
        if out is None:
            raise InvalidArgumentError(
                "--format iceberg without an [iceberg] catalog needs --out "
                "(the directory of the embedded catalog and its warehouse)"
            )
        out = out.absolute()
        props = {
            "type": "sql",
            "uri": f"sqlite:///{out / 'catalog.db'}",
            "warehouse": (out / "warehouse").as_uri(),
        }
        return cls(conf.catalog_name, props, conf.namespace, conf.table, lock_dir=out)

    @property
    def identifier(self) -> str:
        return f"{self.namespace}.{self.table}"

    def catalog(self) -> Any:
        from pyiceberg.catalog import load_catalog

        if self.lock_dir is not None:
            self.lock_dir.mkdir(parents=True, exist_ok=True)
        return load_catalog(self.catalog_name, **self.properties)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """One export at a time per embedded catalog (``flock``: released by the kernel when the
        process dies, SIGKILL included). Other catalogs: the operator runs one exporter per table."""
        if self.lock_dir is None:
            yield
            return
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise TableError(
                    "another rlm export is writing this table; wait for it", file=self.lock_dir
                ) from None
            yield
        finally:
            os.close(fd)


def partition_spec_fields() -> list[tuple[str, str, str]]:
    """The table's partitioning as ``(source column, transform, partition field name)``."""
    return [("topic", "identity", "topic"), ("timestamp", "day", "timestamp_day")]


def open_table(target: IcebergTarget) -> Any:
    """Load the table, creating namespace and table (schema :func:`~rlm.jobs.reading.decode.arrow_schema`,
    partitioned by ``topic``, ``day(timestamp)``) in one commit when missing. An existing table
    must have those columns and that partitioning (:class:`TableError` otherwise)."""
    from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError

    catalog = target.catalog()
    with contextlib.suppress(NamespaceAlreadyExistsError):
        catalog.create_namespace(target.namespace)
    try:
        table = catalog.load_table(target.identifier)
    except NoSuchTableError:
        # Created meanwhile by another process: checked below like any existing table.
        with contextlib.suppress(TableAlreadyExistsError):
            _create_table(catalog, target.identifier)
        table = catalog.load_table(target.identifier)
    _check_table(table, target.identifier)
    return table


def _create_table(catalog: Any, identifier: str) -> None:
    from pyiceberg.transforms import DayTransform, IdentityTransform

    transforms: dict[str, Any] = {"identity": IdentityTransform(), "day": DayTransform()}
    # Full (untruncated) column bounds on the partition sources: add_files infers a file's
    # partition from them, and a topic name longer than the default 16-char truncation would
    # leave lower != upper.
    properties = {
        "write.metadata.metrics.column.topic": "full",
        "write.metadata.metrics.column.timestamp": "full",
    }
    tx = catalog.create_table_transaction(identifier, schema=arrow_schema(), properties=properties)
    with tx.update_spec() as spec:
        for source, transform, name in partition_spec_fields():
            spec.add_field(source, transforms[transform], name)
    # add_files maps Parquet columns to field ids by name: set the mapping now, not in an append.
    mapping = tx.table_metadata.schema().name_mapping.model_dump_json()
    tx.set_properties({"schema.name-mapping.default": mapping})
    tx.commit_transaction()


def _check_table(table: Any, identifier: str) -> None:
    names = {f.name for f in table.schema().fields}
    missing = [f.name for f in arrow_schema() if f.name not in names]
    if missing:
        raise TableError(f"table {identifier} has no column {missing[0]!r}: not an rlm export table")
    schema = table.schema()
    got = [(schema.find_field(f.source_id).name, str(f.transform), f.name) for f in table.spec().fields]
    if got != partition_spec_fields():
        raise TableError(
            f"table {identifier} is partitioned by {got}, expected "
            f"{partition_spec_fields()} (topic identity, day(timestamp))"
        )


def _rlm_summary(table: Any) -> dict[str, str]:
    """What rlm's last commit recorded (``rlm.*`` keys): the summary of the newest rlm snapshot of
    the current snapshot's ancestry — snapshots other writers add on top (a compaction) are
    skipped, and a rollback rewinds the offsets with the data. When that ancestry holds no rlm
    snapshot any more (another engine's maintenance expired them: Spark's ``rewrite_data_files``
    then ``expire_snapshots``), the table properties every rlm commit sets to the same values.
    Empty for a new table (no current snapshot)."""
    from pyiceberg.table.snapshots import ancestors_of

    current = table.current_snapshot()
    for snapshot in ancestors_of(current, table.metadata):
        summary = dict(snapshot.summary.additional_properties) if snapshot.summary else {}
        if ATTEMPT_PROPERTY in summary:
            return summary
    properties = dict(table.properties)
    return properties if current is not None and ATTEMPT_PROPERTY in properties else {}


def exported_offsets(table: Any) -> Offsets:
    """``(topic, partition) → next offset to export`` (empty for a new table)."""
    out: Offsets = {}
    for key, value in _rlm_summary(table).items():
        if key.startswith(OFFSET_PROPERTY):
            topic, _, partition = key[len(OFFSET_PROPERTY) :].rpartition("-")
            out[(topic, int(partition))] = int(value)
    return out


def exported_topic_ids(table: Any) -> dict[str, str]:
    """``topic → topic id`` of the incarnations the table holds (topics without an id: absent)."""
    return {
        key[len(TOPIC_ID_PROPERTY) :]: value
        for key, value in _rlm_summary(table).items()
        if key.startswith(TOPIC_ID_PROPERTY)
    }


def planned_topic_ids(known: Mapping[str, str], plan: ReadPlan, identifier: str) -> dict[str, str]:
    """``known`` plus the planned partitions' topic ids; :class:`TableError` for a topic whose id
    changed: it was deleted and created again, its offsets start over, and appending it by offset
    would skip its first records (or mix two logs under one name)."""
    out = dict(known)
    for p in plan.partitions:
        if p.topic_id is None:
            continue
        old = out.setdefault(p.topic, p.topic_id)
        if old != p.topic_id:
            raise TableError(
                f"table {identifier}: topic {p.topic} was re-created (topic id {old} in "
                f"the table, {p.topic_id} in the log dir): a new log whose offsets start "
                "again; export it into another table (docs/iceberg.md)"
            )
    return out


def next_offsets(done: Mapping[tuple[str, int], int], plan: ReadPlan) -> Offsets:
    """``done`` advanced to one past the last offset each planned partition covers (its visible
    end: high watermark, or last stable offset under read_committed)."""
    out = dict(done)
    for p in plan.partitions:
        if p.local_max_offset >= 0:
            key = (p.topic, p.partition)
            out[key] = max(out.get(key, 0), p.local_max_offset + 1)
    return out


def remove_orphans(table: Any, grace_ms: int) -> int:
    """Delete rlm data files under the table's data directory that no snapshot references (left
    by a run that died before its commit) and are older than ``grace_ms``. Returns how many."""
    io_properties = dict(table.io.properties)
    io = file_io(io_properties)
    referenced: set[str] | None = None
    cutoff = time.time() - grace_ms / 1000

    def orphan(info: Any) -> bool:
        nonlocal referenced
        if not info.base_name.startswith(FILE_PREFIX):
            return False
        if info.mtime is not None and info.mtime.timestamp() > cutoff:
            return False
        if referenced is None:  # read the manifests only when there is a candidate
            referenced = {
                io.parse_location(p)[2] for p in table.inspect.all_files().column("file_path").to_pylist()
            }
        return info.path not in referenced

    removed = _remove_data_files(io_properties, f"{table.location()}/data", orphan)
    if removed:
        log.warning("iceberg export: removed %d data files of an export that did not commit", removed)
    return removed


def _remove_data_files(
    io_properties: dict[str, str], data_location: str, select: Callable[[Any], bool]
) -> int:
    """Delete the files under ``data_location`` that ``select`` (given a pyarrow ``FileInfo``)
    picks; how many."""
    from pyarrow.fs import FileSelector, FileType

    io = file_io(io_properties)
    scheme, netloc, path = io.parse_location(data_location)
    fs = io.fs_by_scheme(scheme, netloc)
    removed = 0
    for info in fs.get_file_info(FileSelector(path, recursive=True, allow_not_found=True)):
        if info.type == FileType.File and select(info):
            fs.delete_file(info.path)
            removed += 1
    return removed


@dataclass(frozen=True, slots=True)
class IcebergExportResult:
    out: str
    table: str
    partitions: int
    tasks: int
    bytes_planned: int
    records: int
    files: int
    snapshot_id: int | None
    orphans_removed: int
    offsets: Offsets = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "out": self.out,
            "format": "iceberg",
            "table": self.table,
            "partitions": self.partitions,
            "tasks": self.tasks,
            "bytes_planned": self.bytes_planned,
            "records": self.records,
            "files": self.files,
            "snapshot_id": self.snapshot_id,
            "orphans_removed": self.orphans_removed,
            "next_offsets": {f"{t}-{p}": o for (t, p), o in sorted(self.offsets.items())},
        }


@dataclass(frozen=True, slots=True)
class IcebergSink:
    """The export :class:`~rlm.jobs.tables.sink.Sink` of one Iceberg export run (shipped to workers).

    ``write_task`` writes data files under ``data_location`` through the catalog's FileIO;
    ``commit`` (driver) registers them all in ONE snapshot carrying ``offsets`` (set as table
    properties in the same commit), provided the table's current snapshot is still
    ``base_snapshot_id`` (what the run planned from); ``abort`` removes this run's files (best
    effort: the next run removes what is left)."""

    target: IcebergTarget
    io_properties: dict[str, str]
    data_location: str
    attempt: str
    offsets: Offsets
    base_snapshot_id: int | None
    compression: str = "snappy"
    topic_ids: tuple[tuple[str, str], ...] = ()  # (topic, id) of every incarnation the table holds

    def write_task(self, index: int, task: ReadTask, batches: Iterable[Any]) -> list[DataFile]:
        return write_day_files(
            self.io_properties, self.data_location, self.attempt, index, task, batches, self.compression
        )

    def commit(self, files: Sequence[DataFile]) -> None:
        if not files:
            return  # nothing new: no snapshot (docs/iceberg.md)
        from pyiceberg.exceptions import CommitFailedException

        table = load_table(self.target)
        current = table.current_snapshot()
        if (current.snapshot_id if current is not None else None) != self.base_snapshot_id:
            raise TableError(
                f"table {self.target.identifier} changed while exporting (another writer "
                "committed); run again"
            )
        props = {ATTEMPT_PROPERTY: self.attempt}
        props.update({f"{OFFSET_PROPERTY}{t}-{p}": str(o) for (t, p), o in self.offsets.items()})
        props.update({f"{TOPIC_ID_PROPERTY}{t}": i for t, i in self.topic_ids})
        crash_point("export_before_commit")
        try:
            # One commit: the snapshot and, in the table properties, the same values — these
            # outlive the snapshot when another engine's maintenance expires it (_rlm_summary).
            with table.transaction() as tx:
                # Fresh file names (the attempt id): no need to scan every manifest for duplicates.
                tx.add_files([f.path for f in files], snapshot_properties=props, check_duplicate_files=False)
                tx.set_properties(props)
        except CommitFailedException as err:
            raise TableError(
                f"table {self.target.identifier} changed while exporting ({err}); run again"
            ) from err

    def abort(self) -> None:
        with contextlib.suppress(Exception):  # best effort; leftovers are orphans of the next run
            _remove_data_files(
                self.io_properties,
                self.data_location,
                lambda info: info.base_name.startswith(f"{FILE_PREFIX}{self.attempt}-"),
            )


def export_iceberg(
    settings: Settings,
    topics: Sequence[str] | None,
    target: IcebergTarget,
    engine: Engine,
    *,
    partitions: Sequence[int] | None = None,
    incremental: bool = False,
    target_bytes: int = DEFAULT_TARGET_BYTES,
    isolation: str = "read_uncommitted",
) -> IcebergExportResult:
    """Export ``topics`` (``partitions``) into the table in one snapshot (docs/iceberg.md).

    Without ``incremental`` the table must hold no snapshot yet (else :class:`TableError`: a
    second full export would duplicate every row). With it, each partition is read from the
    offset the table's last rlm snapshot records. A run that writes no record commits nothing.
    ``engine`` runs the tasks (:func:`local_engine`, :func:`spark_engine`).
    """
    with target.locked():
        table = open_table(target)
        orphans = remove_orphans(table, target.orphan_grace_ms)
        base = table.current_snapshot()
        _refuse_second_full_export(target, base, incremental)
        done = exported_offsets(table)
        plan = plan_read(
            settings,
            topics,
            partitions,
            target_bytes=target_bytes,
            isolation=check_isolation(isolation),
            start_offsets=done,
        )
        ids = planned_topic_ids(exported_topic_ids(table), plan, target.identifier)
        sink = IcebergSink(
            target,
            dict(table.io.properties),
            f"{table.location()}/data",
            uuid.uuid4().hex,
            next_offsets(done, plan),
            base.snapshot_id if base is not None else None,
            topic_ids=tuple(sorted(ids.items())),
        )
        files = engine(plan, BackendSpec.from_settings(settings), sink)
        snapshot = load_table(target).current_snapshot() if files else None
    out = str(target.lock_dir) if target.lock_dir is not None else table.location()
    return IcebergExportResult(
        out,
        target.identifier,
        len(plan.partitions),
        len(plan.tasks),
        sum(t.size for t in plan.tasks),
        sum(f.records for f in files),
        len(files),
        snapshot.snapshot_id if snapshot is not None else None,
        orphans,
        sink.offsets,
    )


def _refuse_second_full_export(target: IcebergTarget, base: Any, incremental: bool) -> None:
    """A full export into a table that holds a snapshot (``base``) would duplicate every row."""
    if not incremental and base is not None:
        raise TableError(
            f"table {target.identifier} already holds data (snapshot "
            f"{base.snapshot_id}); use --incremental to append only new offsets"
        )


def spark_engine(spark: Any) -> Engine:
    """Spark executors write the files (one Spark task per read task), the driver commits."""
    from rlm.jobs.tables.spark_sink import run_sink_spark

    return functools.partial(run_sink_spark, spark)


def local_engine(parallelism: int | None = None) -> Engine:
    """The local engine's workers write the files (no JVM), the driver commits."""
    from rlm.jobs.tables.export_local import run_sink

    return functools.partial(run_sink, parallelism=parallelism)


def load_table(target: IcebergTarget) -> Any:
    """The pyiceberg table of ``target`` (for reading back: ``table.scan().to_arrow()``)."""
    return target.catalog().load_table(target.identifier)
