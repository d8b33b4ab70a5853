"""``rlm export --format iceberg``: tiered history as an Apache Iceberg table, kept up to date
incrementally (docs/iceberg.md).

The driver opens (or creates) the table through pyiceberg, plans the read from the offsets the
table's last rlm snapshot records, has a *writer* (Spark executors, or this process) write the
Parquet data files (:mod:`rlm.jobs.iceberg_files`), and commits them all in ONE snapshot
(``add_files``: one fast append) whose summary records the next offset to export per partition.
Until that commit, nothing written is visible: a crash leaves the current snapshot unchanged and
the files unreferenced; the next run deletes them (:func:`remove_orphans`) and writes again.

There is no Iceberg Spark runtime jar here (no Maven), so Spark never talks to the table itself:
executors write plain Parquet, the driver commits, and :func:`spark_read_table` reads back the
files pyiceberg plans for the current snapshot.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlm.config import Settings
from rlm.errors import InvalidArgumentError, TableError
from rlm.jobs.decode import KAFKA_SCHEMA_DDL, arrow_schema
from rlm.jobs.iceberg_files import FILE_PREFIX, WriteJob, WrittenFile, write_task, write_tasks_local
from rlm.jobs.plan import DEFAULT_TARGET_BYTES, BackendSpec, ReadPlan, ReadTask, plan_read
from rlm.tiering.crash import crash_point
from rlm.tiering.isolation import check_isolation

log = logging.getLogger(__name__)

#: Snapshot summary property per Kafka partition: ``rlm.next-offset.<topic>-<partition>`` = the
#: first offset the next incremental run exports (every rlm snapshot carries the whole map).
OFFSET_PROPERTY = "rlm.next-offset."
#: Snapshot summary property naming the export run (its id is in its data files' names).
ATTEMPT_PROPERTY = "rlm.attempt"
LOCK_NAME = ".rlm-export.lock"

#: Writes the data files of ``tasks`` for ``job``: Spark executors or this process.
FileWriter = Callable[[WriteJob, Sequence[ReadTask]], list[WrittenFile]]
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
            return cls(conf.catalog_name, dict(conf.catalog), conf.namespace, conf.table,
                       orphan_grace_ms=settings.tiering.gc_grace_ms)
        if out is None:
            raise InvalidArgumentError("--format iceberg without an [iceberg] catalog needs --out "
                                       "(the directory of the embedded catalog and its warehouse)")
        out = out.absolute()
        props = {"type": "sql", "uri": f"sqlite:///{out / 'catalog.db'}",
                 "warehouse": (out / "warehouse").as_uri()}
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
                raise TableError("another rlm export is writing this table; wait for it",
                                 file=self.lock_dir) from None
            yield
        finally:
            os.close(fd)


def partition_spec_fields() -> list[tuple[str, str, str]]:
    """The table's partitioning as ``(source column, transform, partition field name)``."""
    return [("topic", "identity", "topic"), ("timestamp", "day", "timestamp_day")]


def open_table(target: IcebergTarget) -> Any:
    """Load the table, creating namespace and table (schema :func:`~rlm.jobs.decode.arrow_schema`,
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
    properties = {"write.metadata.metrics.column.topic": "full",
                  "write.metadata.metrics.column.timestamp": "full"}
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
        raise TableError(f"table {identifier} is partitioned by {got}, expected "
                         f"{partition_spec_fields()} (topic identity, day(timestamp))")


def exported_offsets(table: Any) -> Offsets:
    """``(topic, partition) → next offset to export``, from the newest rlm snapshot of the current
    snapshot's ancestry (snapshots other writers add on top are skipped); empty for a new table."""
    from pyiceberg.table.snapshots import ancestors_of

    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        summary = dict(snapshot.summary.additional_properties) if snapshot.summary else {}
        if ATTEMPT_PROPERTY not in summary:
            continue
        out: Offsets = {}
        for key, value in summary.items():
            if key.startswith(OFFSET_PROPERTY):
                topic, _, partition = key[len(OFFSET_PROPERTY):].rpartition("-")
                out[(topic, int(partition))] = int(value)
        return out
    return {}


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
    from pyarrow.fs import FileSelector, FileType
    from pyiceberg.io.pyarrow import PyArrowFileIO

    io = PyArrowFileIO(dict(table.io.properties))
    data = f"{table.location()}/data"
    scheme, netloc, path = io.parse_location(data)
    fs = io.fs_by_scheme(scheme, netloc)
    infos = fs.get_file_info(FileSelector(path, recursive=True, allow_not_found=True))
    ours = [i for i in infos if i.type == FileType.File and i.base_name.startswith(FILE_PREFIX)]
    if not ours:
        return 0
    referenced = {io.parse_location(p)[2] for p in table.inspect.all_files().column("file_path").to_pylist()}
    cutoff = time.time() - grace_ms / 1000
    removed = 0
    for info in ours:
        mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
        if info.path not in referenced and mtime <= cutoff:
            fs.delete_file(info.path)
            removed += 1
    if removed:
        log.warning("iceberg export: removed %d data files of an export that did not commit", removed)
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
        return {"out": self.out, "format": "iceberg", "table": self.table, "partitions": self.partitions,
                "tasks": self.tasks, "bytes_planned": self.bytes_planned, "records": self.records,
                "files": self.files, "snapshot_id": self.snapshot_id,
                "orphans_removed": self.orphans_removed,
                "next_offsets": {f"{t}-{p}": o for (t, p), o in sorted(self.offsets.items())}}


def export_iceberg(settings: Settings, topics: Sequence[str] | None, target: IcebergTarget,
                   write: FileWriter, *, partitions: Sequence[int] | None = None,
                   incremental: bool = False, target_bytes: int = DEFAULT_TARGET_BYTES,
                   isolation: str = "read_uncommitted") -> IcebergExportResult:
    """Export ``topics`` (``partitions``) into the table in one snapshot (docs/iceberg.md).

    Without ``incremental`` the table must hold no snapshot yet (else :class:`TableError`: a
    second full export would duplicate every row). With it, each partition is read from the
    offset the table's last rlm snapshot records. A run that writes no record commits nothing.
    ``write`` writes the data files (:func:`spark_writer`, :func:`local_writer`).
    """
    with target.locked():
        table = open_table(target)
        orphans = remove_orphans(table, target.orphan_grace_ms)
        if not incremental and table.current_snapshot() is not None:
            raise TableError(f"table {target.identifier} already holds data (snapshot "
                             f"{table.current_snapshot().snapshot_id}); use --incremental to append "
                             "only new offsets")
        done = exported_offsets(table)
        plan = plan_read(settings, topics, partitions, target_bytes=target_bytes,
                         isolation=check_isolation(isolation), start_offsets=done)
        job = WriteJob(BackendSpec.from_settings(settings), dict(table.io.properties),
                       f"{table.location()}/data", uuid.uuid4().hex)
        files = write(job, plan.tasks) if plan.tasks else []
        offsets = next_offsets(done, plan)
        snapshot_id = _commit(table, target, files, offsets, job.attempt) if files else None
    out = str(target.lock_dir) if target.lock_dir is not None else table.location()
    return IcebergExportResult(out, target.identifier, len(plan.partitions), len(plan.tasks),
                               sum(t.size for t in plan.tasks), sum(f.records for f in files),
                               len(files), snapshot_id, orphans, offsets)


def _commit(table: Any, target: IcebergTarget, files: Sequence[WrittenFile], offsets: Offsets,
            attempt: str) -> int:
    """Register every file in ONE snapshot (a fast append) carrying ``offsets``; the snapshot id."""
    from pyiceberg.exceptions import CommitFailedException

    props = {ATTEMPT_PROPERTY: attempt}
    props.update({f"{OFFSET_PROPERTY}{t}-{p}": str(o) for (t, p), o in offsets.items()})
    crash_point("export_before_commit")
    try:
        # Fresh file names (the attempt id): no need to scan every manifest for duplicates.
        table.add_files([f.path for f in files], snapshot_properties=props, check_duplicate_files=False)
    except CommitFailedException as err:
        raise TableError(f"table {target.identifier} changed while exporting ({err}); run again "
                         "(the files written are removed by the next run)") from err
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return int(snapshot.snapshot_id)


def spark_writer(spark: Any) -> FileWriter:
    """Spark executors write the files, one task per Spark partition; the driver collects what
    was written (paths and counts only, never rows)."""
    def write(job: WriteJob, tasks: Sequence[ReadTask]) -> list[WrittenFile]:
        rdd = spark.sparkContext.parallelize(list(enumerate(tasks)), max(1, len(tasks)))
        return list(rdd.flatMap(lambda it: write_task(job, it[0], it[1])).collect())
    return write


def local_writer() -> FileWriter:
    """This process writes the files (no JVM)."""
    return write_tasks_local


def load_table(target: IcebergTarget) -> Any:
    """The pyiceberg table of ``target`` (for reading back: ``table.scan().to_arrow()``)."""
    return target.catalog().load_table(target.identifier)


def spark_read_table(spark: Any, table: Any) -> Any:
    """The table's current snapshot as a Spark DataFrame (Spark's Kafka schema), WITHOUT the
    Iceberg Spark runtime: pyiceberg plans the snapshot's data files on the driver, and executors
    read exactly those Parquet files (one Spark partition per file) through pyiceberg's FileIO with
    the catalog's properties, as rlm's jobs read the store — no Hadoop S3A jars. rlm's tables hold
    data files only; a table with delete files (another engine's) is refused rather than read wrong.
    With the runtime jar, Spark's own Iceberg reader does the same (docs/iceberg.md)."""
    from rlm.jobs.iceberg_files import read_data_files

    tasks = list(table.scan().plan_files())
    if any(t.delete_files for t in tasks):
        raise TableError(f"table {table.name()} has delete files: read it with the Iceberg Spark runtime")
    paths = [t.file.file_path for t in tasks]
    if not paths:
        return spark.createDataFrame([], KAFKA_SCHEMA_DDL)
    props = dict(table.io.properties)
    rdd = spark.sparkContext.parallelize([(p,) for p in paths], len(paths))
    return spark.createDataFrame(rdd, "path string").mapInArrow(
        lambda batches: read_data_files(props, (p for b in batches for p in b.column(0).to_pylist())),
        KAFKA_SCHEMA_DDL)
