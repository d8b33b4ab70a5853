"""Read a KRaft metadata log (``__cluster_metadata-0``) into an image of topics, partitions and configs.

The controller quorum's log holds the cluster's metadata as records (:mod:`rlm.formats.metadata`)
in ordinary v2 batches, plus periodic snapshots ``<endOffset>-<epoch>.checkpoint`` holding the
whole image as of ``endOffset`` (exclusive) between a SnapshotHeader and a SnapshotFooter control
batch. :class:`KraftMetadataLog` loads the newest snapshot, then the ``.log`` segments after it,
and on every :meth:`~KraftMetadataLog.poll` reads only what was appended since (it remembers the
segment and byte position of the next batch). It starts over from the newest snapshot when:

* a snapshot newer than what was read appears (the segments before it may already be deleted);
* the log was truncated below what was read (Raft truncates an uncommitted tail after a leader
  change): the segment is shorter than the remembered position, the batch before that position
  changed (CRC), or every segment now ends before it.

Control batches (LeaderChange, SnapshotHeader/Footer, KRaft voters) are skipped; records between a
BeginTransactionRecord and its End are applied together, an Abort drops them (KIP-868). A torn
tail (a batch still being written) is left for the next poll. Missing history (the first segment
starts after what the snapshot covers) is reported in :attr:`MetadataImage.gaps`, not guessed.
The broker only acts on records up to the quorum's high watermark, which is not on disk: rlm reads
every complete batch, and a truncation is caught as above. See docs/topic-policy.md.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import mmap
import re
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rlm.errors import CorruptRecordError, LogDirError, RlmError
from rlm.formats import metadata as md
from rlm.formats.records import Buffer, ControlRecordType, decode_records, iter_batches, parse_control_record
from rlm.logdir.discovery import list_segments

__all__ = [
    "METADATA_LOG_DIR",
    "KraftMetadataLog",
    "MetadataImage",
    "PartitionImage",
    "TopicImage",
    "find_metadata_log",
    "list_snapshots",
    "read_node_id",
]

log = logging.getLogger(__name__)

#: The directory of the KRaft quorum's log inside ``metadata.log.dir`` (a log dir by default).
METADATA_LOG_DIR = "__cluster_metadata-0"
_SNAPSHOT_RE = re.compile(r"([0-9]{20})-([0-9]{10})\.checkpoint")
#: The records :meth:`MetadataImage.apply` or a metadata transaction acts on; any other record
#: (NoOpRecord, broker registrations and fences, ...) leaves the image as it was.
_IMAGE_RECORDS = (
    md.TopicRecord,
    md.PartitionRecord,
    md.PartitionChangeRecord,
    md.RemoveTopicRecord,
    md.ConfigRecord,
    md.FeatureLevelRecord,
    md.BeginTransactionRecord,
    md.EndTransactionRecord,
    md.AbortTransactionRecord,
)
_CRC_AT = 17  # a v2 batch's CRC field, to recognise the last batch read after a truncation
_U32 = struct.Struct(">I")


@dataclass(slots=True)
class PartitionImage:
    """One partition as the controller last recorded it; ``leader`` -1 = no leader."""

    partition: int
    leader: int
    leader_epoch: int
    partition_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(slots=True)
class TopicImage:
    name: str
    topic_id: str
    partitions: dict[int, PartitionImage] = field(default_factory=dict)


@dataclass(slots=True)
class MetadataImage:
    """The cluster metadata after applying every record up to ``offset`` (inclusive; -1 = none).

    ``topic_configs`` is keyed by topic name and ``broker_configs`` by broker id, ``""`` being the
    cluster-wide default; both only hold keys set explicitly (Kafka's defaults are not recorded).
    """

    topics_by_id: dict[str, TopicImage] = field(default_factory=dict)
    topics_by_name: dict[str, TopicImage] = field(default_factory=dict)
    topic_configs: dict[str, dict[str, str]] = field(default_factory=dict)
    broker_configs: dict[str, dict[str, str]] = field(default_factory=dict)
    features: dict[str, int] = field(default_factory=dict)
    offset: int = -1
    snapshot: str | None = None  # name of the snapshot file the image started from
    gaps: list[str] = field(default_factory=list)

    def apply(self, record: md.MetadataRecord) -> None:
        """Replay one record (the same meaning as Kafka's ``MetadataDelta.replay``)."""
        if isinstance(record, md.TopicRecord):
            topic = TopicImage(record.name, record.topic_id)
            old = self.topics_by_name.get(record.name)
            if old is not None:  # only after a missed RemoveTopicRecord (a gap): newest wins
                self.topics_by_id.pop(old.topic_id, None)
            self.topics_by_id[record.topic_id] = self.topics_by_name[record.name] = topic
        elif isinstance(record, md.PartitionRecord):
            self._apply_partition(record)
        elif isinstance(record, md.PartitionChangeRecord):
            self._apply_change(record)
        elif isinstance(record, md.RemoveTopicRecord):
            removed = self.topics_by_id.pop(record.topic_id, None)
            if removed is not None:
                self.topics_by_name.pop(removed.name, None)
                self.topic_configs.pop(removed.name, None)  # configs go with the topic
        elif isinstance(record, md.ConfigRecord):
            self._apply_config(record)
        elif isinstance(record, md.FeatureLevelRecord):
            self.features[record.name] = record.level

    def _apply_partition(self, record: md.PartitionRecord) -> None:
        topic = self.topics_by_id.get(record.topic_id)
        if topic is not None:
            topic.partitions[record.partition] = PartitionImage(
                record.partition,
                record.leader,
                record.leader_epoch,
                record.partition_epoch,
                record.replicas,
                record.isr,
            )

    def _apply_change(self, record: md.PartitionChangeRecord) -> None:
        topic = self.topics_by_id.get(record.topic_id)
        part = topic.partitions.get(record.partition) if topic is not None else None
        if part is None:
            return
        if record.leader != md.LEADER_UNCHANGED:
            # Kafka bumps the leader epoch whenever a change record names a leader
            # (PartitionRegistration.merge), even the same one (a forced epoch bump).
            part.leader = record.leader
            part.leader_epoch += 1
        if record.isr is not None:
            part.isr = record.isr
        if record.replicas is not None:
            part.replicas = record.replicas
        part.partition_epoch += 1

    def _apply_config(self, record: md.ConfigRecord) -> None:
        if record.resource_type == md.RESOURCE_TOPIC:
            table = self.topic_configs
        elif record.resource_type == md.RESOURCE_BROKER:
            table = self.broker_configs
        else:
            return  # client metrics, groups, ...: not rlm's business
        if record.value is None:
            keys = table.get(record.resource_name)
            if keys is not None:
                keys.pop(record.name, None)
                if not keys:
                    del table[record.resource_name]
        else:
            table.setdefault(record.resource_name, {})[record.name] = record.value

    def topic(self, name: str) -> TopicImage | None:
        return self.topics_by_name.get(name)


def list_snapshots(directory: Path) -> list[tuple[int, int, Path]]:
    """``(end offset, epoch, path)`` of every complete snapshot, oldest first (``.part`` and
    ``.deleted`` files do not match the name)."""
    try:
        names = [p.name for p in directory.iterdir()]
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        m = _SNAPSHOT_RE.fullmatch(name)
        if m:
            found.append((int(m.group(1)), int(m.group(2)), directory / name))
    return sorted(found)


def find_metadata_log(log_dirs: list[Path] | tuple[Path, ...]) -> Path | None:
    """The first ``<log dir>/__cluster_metadata-0`` that exists, else ``None``."""
    for log_dir in log_dirs:
        candidate = Path(log_dir) / METADATA_LOG_DIR
        try:
            if candidate.is_dir():
                return candidate
        except OSError:  # a name too long or unreadable: there is no metadata log to follow there
            continue
    return None


def read_node_id(log_dirs: list[Path] | tuple[Path, ...]) -> str | None:
    """This broker's id (``node.id``, or ``broker.id`` in ZooKeeper mode) from the first log dir's
    ``meta.properties``, as the text broker ConfigRecords are keyed by; ``None`` when unknown."""
    for log_dir in log_dirs:
        try:
            text = (Path(log_dir) / "meta.properties").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):  # missing, a name too long, unreadable: unknown
            continue
        props = dict(
            line.split("=", 1)
            for line in text.splitlines()
            if "=" in line and not line.lstrip().startswith("#")
        )
        for key in ("node.id", "broker.id"):
            if key in props:
                return props[key].strip()
    return None


def _records(
    buf: Buffer, path: Path, start: int, after: int
) -> Iterator[tuple[int, int, int, int, list[tuple[int, md.MetadataRecord]]]]:
    """Per complete batch from byte ``start``: (position, end, crc, last offset, [(offset, record)])
    with the data records at offsets > ``after`` (none for control batches). Errors name ``path``."""
    try:
        for batch in iter_batches(buf, start):
            decoded: list[tuple[int, md.MetadataRecord]] = []
            if not batch.is_control and batch.last_offset > after:
                for rec in decode_records(buf, batch):
                    if rec.offset > after:
                        decoded.append((rec.offset, md.decode_metadata_record(rec.value, offset=rec.offset)))
            yield batch.position, batch.end_position, batch.crc, batch.last_offset, decoded
    except RlmError as err:
        raise err.in_file(path) from err


def _snapshot_image(path: Path) -> MetadataImage:
    """A fresh image from one ``.checkpoint`` (header, data batches, footer)."""
    image = MetadataImage(snapshot=path.name)
    try:
        buf = path.read_bytes()
    except OSError as err:  # removed by the controller's cleaner meanwhile, unreadable, ...
        raise LogDirError(f"cannot read the metadata snapshot: {err}", file=path) from err
    kinds: list[int] = []
    try:
        for batch in iter_batches(buf):
            if batch.is_control:
                kinds += [parse_control_record(r).type for r in decode_records(buf, batch)]
    except RlmError as err:
        raise err.in_file(path) from err
    if ControlRecordType.SNAPSHOT_FOOTER not in kinds:
        raise CorruptRecordError("snapshot has no SnapshotFooter (incomplete file)", file=path)
    for _pos, _end, _crc, _last, records in _records(buf, path, 0, -1):
        for _offset, record in records:
            image.apply(record)
    return image


class KraftMetadataLog:
    """Incremental reader of one ``__cluster_metadata-0`` directory; thread-safe.

    :meth:`poll` reads what is new and returns the current image. The returned image is never
    changed afterwards (a poll that applies records works on a copy), so callers may keep it.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._image = MetadataImage()
        self._next_offset = 0  # first offset not yet applied
        self._snapshot_end = -1  # end offset of the snapshot loaded, -1 = none
        self._segment: int | None = None  # base offset of the segment being read
        self._position = 0  # byte position of the next batch in it
        self._last_batch: tuple[int, int] | None = None  # (position, crc) of the last batch read
        self._pending: list[md.MetadataRecord] | None = None  # inside a metadata transaction
        self._work: MetadataImage | None = None  # the copy one poll changes (see _edit)
        self._read_to = -1  # offset of the last record read (the image's offset after the poll)

    @property
    def image(self) -> MetadataImage:
        return self._image

    @property
    def next_offset(self) -> int:
        """The first offset of the metadata log not yet applied."""
        return self._next_offset

    def poll(self) -> MetadataImage:
        """Apply everything appended since the last poll (a full reload when needed, see module)."""
        with self._lock:
            try:
                return self._poll()
            except RlmError:
                self._reset()  # half-applied state is never kept: the next poll starts over
                raise

    def _poll(self) -> MetadataImage:
        snapshots = list_snapshots(self.directory)
        newest = snapshots[-1] if snapshots else None
        if newest is not None and newest[0] > max(self._next_offset, self._snapshot_end):
            self._load_snapshot(newest[0], newest[2])
        if not self._read_segments() and self._next_offset > 0:
            log.warning(
                "%s: the metadata log was truncated below offset %d; reloading",
                self.directory,
                self._next_offset,
            )
            self._reset()
            if newest is not None:
                self._load_snapshot(newest[0], newest[2])
            self._read_segments()
        return self._image

    def _load_snapshot(self, end_offset: int, path: Path) -> None:
        image = _snapshot_image(path)
        image.offset = end_offset - 1
        self._image, self._next_offset, self._snapshot_end = image, end_offset, end_offset
        self._segment, self._position, self._last_batch, self._pending = None, 0, None, None

    def _read_segments(self) -> bool:
        """Read new batches; False when the log no longer holds what was read (truncated)."""
        segments = list_segments(self.directory)
        bases = [s.base_offset for s in segments]
        if (
            self._segment is not None
            and self._segment not in bases
            and (not bases or max(bases) < self._segment)
        ):
            return False
        self._work = None
        for index, seg in enumerate(segments):
            next_base = bases[index + 1] if index + 1 < len(bases) else None
            if next_base is not None and next_base <= self._next_offset:
                continue  # read entirely before
            resume = seg.base_offset == self._segment
            if resume and not self._still_there(seg.log, seg.size):
                return False
            if not resume and seg.base_offset > self._next_offset:
                gap = (
                    f"offsets {self._next_offset}-{seg.base_offset - 1} are in no segment or snapshot "
                    "(deleted before they were read)"
                )
                self._edit().gaps.append(gap)
                log.warning("%s: %s: topic configs changed there are not known", self.directory, gap)
            if not resume:
                self._last_batch = None  # the CRC check applies to the segment it was read from
            self._read_one(seg.log, self._position if resume else 0)
            self._segment = seg.base_offset
        if self._work is not None:
            self._work.offset = max(self._work.offset, self._read_to)
            self._image, self._work = self._work, None
        elif self._image.offset < self._read_to:  # only records that change nothing it holds
            self._image = dataclasses.replace(self._image, offset=self._read_to)
        return True

    def _edit(self) -> MetadataImage:
        """The image this poll changes: a copy made on the first change, so images handed out by
        earlier polls never change under their holders."""
        if self._work is None:
            self._work = copy.deepcopy(self._image)
        return self._work

    def _still_there(self, path: Path, size: int) -> bool:
        """Whether the bytes read before are unchanged: long enough, same CRC on the last batch."""
        if size < self._position:
            return False
        if self._last_batch is None:
            return True
        pos, crc = self._last_batch
        try:
            with path.open("rb") as fh:
                fh.seek(pos + _CRC_AT)
                raw = fh.read(4)
        except FileNotFoundError:
            return True  # deleted after a snapshot: the next segment continues
        except OSError as err:
            raise LogDirError(f"cannot read the metadata log: {err}", file=path) from err
        return len(raw) == 4 and _U32.unpack(raw)[0] == crc

    def _read_one(self, path: Path, start: int) -> None:
        """Apply the complete batches of one segment from byte ``start``."""
        self._position = start
        try:
            with path.open("rb") as fh:
                if fh.seek(0, 2) <= start:
                    return
                with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                    for pos, end, crc, last, records in _records(buf, path, start, self._next_offset - 1):
                        for offset, record in records:
                            self._replay(offset, record)
                        self._next_offset = max(self._next_offset, last + 1)
                        self._position, self._last_batch = end, (pos, crc)
        except FileNotFoundError:
            log.debug("%s vanished while reading the metadata log", path)
        except OSError as err:  # unreadable: an RlmError, so the reader keeps its last image
            raise LogDirError(f"cannot read the metadata log: {err}", file=path) from err

    def _replay(self, offset: int, record: md.MetadataRecord) -> None:
        """Apply one record. The image is copied (:meth:`_edit`) only for a record that changes
        what it holds: the controller appends a NoOpRecord every 500 ms and brokers' heartbeats
        change registrations, and a deep copy per poll of a 10 000-partition image was most of
        an idle sidecar's CPU (bench/idle_bench.py)."""
        self._read_to = offset
        if self._pending is None and not isinstance(record, _IMAGE_RECORDS):
            return  # nothing held changes; the offset the poll reached is set when it ends
        image = self._edit()
        if isinstance(record, md.BeginTransactionRecord):
            self._pending = []
        elif isinstance(record, md.EndTransactionRecord):
            for held in self._pending or ():
                image.apply(held)
            self._pending = None
        elif isinstance(record, md.AbortTransactionRecord):
            self._pending = None
        elif self._pending is not None:
            self._pending.append(record)
        else:
            image.apply(record)
        image.offset = offset
