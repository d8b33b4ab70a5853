"""The one exception hierarchy of rlm, rooted in :class:`RlmError`.

Every error that can reach a user carries the context needed to act on it: the file, the byte
position inside it and the Kafka offset involved, whichever are known. Pure format code does not
know file names; it raises with ``position``/``offset`` and the layer that opened the file adds
the name with :meth:`RlmError.in_file` (returns a copy, the original is chained).

Each class also says how it surfaces, in ONE place: the class attributes ``http_status`` (the HTTP
API's answer, docs/http-api.md §5), ``exit_code`` (the CLI's, docs/cli.md §1) and ``kafka_error`` (the
name of the Kafka error code the listener answers with, docs/kafka-listener.md), and
``default_field``, the request field blamed when the raise site names none. The HTTP app, the CLI
and the Kafka listener read these; none of them looks at an error's text. A raise site that knows
which input was wrong says so: ``InvalidArgumentError("offset -1 is negative", field="offset")``.

Tree (HTTP status / exit code)::

    RlmError                           500 / 1
    ├── FormatError                    bytes that do not follow docs/formats.md
    │   ├── CorruptRecordError         bad batch size / CRC / record framing inside a .log
    │   ├── UnsupportedMagicError      a magic byte rlm does not know
    │   ├── CompressionError           a payload that does not decompress / unknown codec
    │   ├── CorruptIndexError          .index / .timeindex / remote offset+time index
    │   ├── CorruptRemoteIndexError    .remotelogindex entry: bad magic, length or CRC
    │   ├── CheckpointError            Kafka checkpoint text files
    │   ├── CorruptMetadataRecordError a KRaft metadata record value that does not decode
    │   ├── PartitionMetadataError     a partition dir's ``partition.metadata`` (topic id)
    │   ├── CorruptObjectError         a stored object whose size / CRC-32C differs from its manifest
    │   └── CorruptSnapshotError       a producer-state ``.snapshot``: version, CRC, entry count
    ├── LogDirError                    layout of a log directory (names, missing files)
    │   └── IdentityConflictError      the tiered data is not this partition's log (re-created topic)
    ├── PartitionNotFoundError   404/1 the topic-partition is in no configured log dir
    ├── ConfigError              500/2 invalid configuration
    ├── InvalidArgumentError     400/2 invalid API / CLI parameters
    │   └── OffsetOutOfRangeError 416/2 a fetch below the log start / above the high watermark
    ├── UnauthorizedError        401/1 an HTTP request without the right bearer token
    ├── ForbiddenError           403/1 a deleting request where nobody can be authenticated
    ├── NotLeaderError           421/1 delete-records sent to a sidecar that does not lead
    ├── StorageError             502/1 remote store failures, translated once from SDK/OS errors
    │   ├── ObjectNotFoundError        also a FileNotFoundError (docs/storage.md)
    │   ├── ObjectExistsError          a conditional "create only if absent" lost
    │   ├── TransientStorageError      throttling, 5xx, timeouts: safe to retry
    │   ├── StoreLayoutError     502/2 also a ConfigError: the store's key layout is another one
    │   ├── StoreUnavailableError 503/1 the store is known unreachable: fail fast
    │   └── BackendNotFoundError 502/2 unknown / uninstalled backend name
    ├── ProtectionError          500/1 protected (encrypted) remote data cannot be opened (docs/protection.md)
    │   ├── KeyNotFoundError           the key id that wrapped a data key is not in the key ring
    │   ├── WrongKeyError              the key under that id does not unwrap the data key
    │   └── TamperedObjectError  502/1 an authentication tag does not match: bytes changed or moved
    ├── SegmentQuarantined             a segment failed verification before upload (docs/broker-files.md)
    ├── SegmentVanished                the log store deleted a segment before rlm could pin it
    ├── PinRoomExhausted               a copy waits: its pin does not fit tiering.max_pinned_bytes
    ├── StateDirLockedError            another `rlm run` owns the state dir (one daemon per dir)
    ├── StreamInterruptedError         a streamed read ended without its end (rlm.http.client)
    ├── RlmHttpError                   rlm.http.client: the server answered 4xx/5xx
    ├── ExportOutputExistsError        `rlm export --out` exists and --overwrite was not given
    ├── NativeExtensionError           a compiled extension that was required is not built
    ├── TableError                     an export's table cannot take this export (docs/iceberg.md)
    ├── ExecutorEnvironmentError       a Spark executor runs another build of rlm than the driver
    └── KafkaProtocolError             a Kafka-protocol request the listener closes the connection on
    UploadAbandoned                    not an error: shutdown stops an in-flight upload
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from typing import ClassVar

__all__ = [
    "BackendNotFoundError",
    "CheckpointError",
    "CompressionError",
    "ConfigError",
    "CorruptIndexError",
    "CorruptMetadataRecordError",
    "CorruptObjectError",
    "CorruptRecordError",
    "CorruptRemoteIndexError",
    "CorruptSnapshotError",
    "ExecutorEnvironmentError",
    "ExportOutputExistsError",
    "ForbiddenError",
    "FormatError",
    "IdentityConflictError",
    "InvalidArgumentError",
    "KafkaProtocolError",
    "KeyNotFoundError",
    "LogDirError",
    "NativeExtensionError",
    "NotLeaderError",
    "ObjectExistsError",
    "ObjectNotFoundError",
    "OffsetInGapError",
    "OffsetOutOfRangeError",
    "PartitionMetadataError",
    "PartitionNotFoundError",
    "PinRoomExhausted",
    "ProtectionError",
    "RlmError",
    "RlmHttpError",
    "SegmentQuarantined",
    "SegmentVanished",
    "StateDirLockedError",
    "StorageError",
    "StoreLayoutError",
    "StoreUnavailableError",
    "StreamInterruptedError",
    "TableError",
    "TamperedObjectError",
    "TransientStorageError",
    "UnauthorizedError",
    "UnsupportedMagicError",
    "UploadAbandoned",
    "WrongKeyError",
]


class RlmError(Exception):
    """Base of every error rlm raises on purpose.

    ``reason`` is the human text; ``file``, ``position`` (byte position in ``file``) and
    ``offset`` (Kafka offset) are optional context rendered into ``str(err)`` as
    ``<file>: byte <position>: offset <offset>: <reason>``. ``field`` names the request parameter
    that was wrong (HTTP answers carry it; default: the class's ``default_field``).
    """

    #: The HTTP status of an API answer carrying this error (docs/http-api.md §5).
    http_status: ClassVar[int] = 500
    #: Headers added to that answer (``Retry-After``, ``WWW-Authenticate``).
    http_headers: ClassVar[Mapping[str, str]] = {}
    #: The CLI's exit code (docs/cli.md §1): 1 a failed operation or bad data, 2 bad usage.
    exit_code: ClassVar[int] = 1
    #: The name of the Kafka error code the Kafka listener answers a partition with
    #: (``rlm.kafka.protocol.Codes``; docs/kafka-listener.md).
    kafka_error: ClassVar[str] = "UNKNOWN_SERVER_ERROR"
    #: The request field blamed when the raise site names none.
    default_field: ClassVar[str | None] = None

    def __init__(
        self,
        reason: str,
        *,
        field: str | None = None,
        file: str | os.PathLike[str] | None = None,
        position: int | None = None,
        offset: int | None = None,
    ) -> None:
        self.reason = reason
        self.field = field if field is not None else self.default_field
        self.file = os.fspath(file) if file is not None else None
        self.position = position
        self.offset = offset
        super().__init__(reason)

    def __str__(self) -> str:
        parts: list[str] = []
        if self.file is not None:
            parts.append(self.file)
        if self.position is not None:
            parts.append(f"byte {self.position}")
        if self.offset is not None:
            parts.append(f"offset {self.offset}")
        parts.append(self.reason)
        return ": ".join(parts)

    def in_file(self, file: str | os.PathLike[str], *, base_position: int = 0) -> RlmError:
        """Return a copy naming ``file``; ``base_position`` is added to a relative position.

        Used by the layer that read the bytes (pure code only knows positions in a buffer).
        """
        clone = copy.copy(self)
        clone.file = os.fspath(file)
        if clone.position is not None:
            clone.position += base_position
        clone.__cause__ = self
        return clone


class FormatError(RlmError):
    """Bytes that do not follow the binary formats of docs/formats.md."""


class CorruptRecordError(FormatError):
    """A record batch / legacy message is corrupt: bad size, bad CRC, bad record framing."""


class UnsupportedMagicError(FormatError):
    """A magic byte (record batch or remote index entry) that rlm does not know."""


class CompressionError(FormatError):
    """A compressed payload that does not decompress, or an unknown compression codec."""


class CorruptIndexError(FormatError):
    """An offset or time index (Kafka's or rlm's remote one) that fails a sanity check."""


class CorruptRemoteIndexError(FormatError):
    """A ``.remotelogindex`` entry with a bad magic, length or CRC."""


class CheckpointError(FormatError):
    """A Kafka checkpoint text file with an unknown version or a wrong entry count."""


class CorruptMetadataRecordError(FormatError):
    """A record of the KRaft metadata log (``__cluster_metadata``) whose value does not decode."""


class PartitionMetadataError(FormatError):
    """A ``partition.metadata`` file (version and topic id) that does not follow Kafka's format."""


class CorruptObjectError(FormatError):
    """A stored object whose size or CRC-32C differs from what its manifest recorded (``rlm
    restore``, docs/restore.md): the store's copy is damaged; the error names the object key."""


class CorruptSnapshotError(FormatError):
    """A producer-state ``.snapshot`` (Kafka's ``ProducerStateManager``) with an unknown version,
    a CRC-32C mismatch or an entry count that does not match its size (docs/formats.md §4.5)."""


class LogDirError(RlmError):
    """A log directory that does not have Kafka's layout (bad names, missing files)."""


class IdentityConflictError(LogDirError):
    """The data tiered for a partition cannot belong to its local log (a topic re-created under the
    same name without a topic id, or a log truncated below what was tiered): nothing is tiered or
    served for it until resolved (docs/topic-identity.md)."""


class PartitionNotFoundError(RlmError):
    """The topic/partition is not in any configured log dir: HTTP 404 (field ``partition``), Kafka's
    UNKNOWN_TOPIC_OR_PARTITION; the CLI exits 1 (the arguments are well-formed)."""

    http_status = 404
    kafka_error = "UNKNOWN_TOPIC_OR_PARTITION"
    default_field = "partition"


class ConfigError(RlmError):
    """Invalid configuration; the CLI exits with code 2. HTTP 500 (a server's own configuration)."""

    exit_code = 2


class InvalidArgumentError(RlmError):
    """An invalid parameter given to the CLI or the API: HTTP 400 naming ``field`` where the raise
    site knows it; the CLI exits with code 2. To the Kafka listener, only a topic name can be
    invalid: UNKNOWN_TOPIC_OR_PARTITION, as Kafka answers a name it would never accept."""

    http_status = 400
    exit_code = 2
    kafka_error = "UNKNOWN_TOPIC_OR_PARTITION"


class OffsetOutOfRangeError(InvalidArgumentError):
    """A fetch offset below the log start offset or above the high watermark (Kafka's
    OFFSET_OUT_OF_RANGE): HTTP 416, CLI exit code 2. A fetch AT the high watermark is not an
    error (no records)."""

    http_status = 416
    kafka_error = "OFFSET_OUT_OF_RANGE"
    default_field = "offset"


class OffsetInGapError(OffsetOutOfRangeError):
    """A fetch offset inside a recorded gap (docs/visibility.md, "Gaps"): offsets the broker deleted
    before rlm tiered them, so no tier holds them. Answered as out of range (HTTP 416, CLI exit 2,
    Kafka OFFSET_OUT_OF_RANGE, as a broker answers for offsets it does not have); ``first_offset``
    / ``last_offset`` name the gap (inclusive)."""

    def __init__(
        self, message: str, *, offset: int | None = None, first_offset: int = -1, last_offset: int = -1
    ) -> None:
        super().__init__(message, offset=offset)
        self.first_offset = first_offset
        self.last_offset = last_offset


class UnauthorizedError(RlmError):
    """An HTTP request without the configured bearer token, or with another one: 401 with
    ``WWW-Authenticate: Bearer`` (docs/security.md)."""

    http_status = 401
    http_headers: ClassVar[Mapping[str, str]] = {"WWW-Authenticate": "Bearer"}
    default_field = "authorization"


class ForbiddenError(RlmError):
    """A deleting request where nobody can be authenticated: 403 (docs/security.md)."""

    http_status = 403
    kafka_error = "TOPIC_AUTHORIZATION_FAILED"
    default_field = "authorization"


class NotLeaderError(RlmError):
    """A write to a partition this sidecar does not lead (docs/cluster.md): 421, Kafka's
    NOT_LEADER_OR_FOLLOWER. ``leader``: the node id that leads, None when unknown."""

    http_status = 421
    kafka_error = "NOT_LEADER_OR_FOLLOWER"
    default_field = "partition"
    leader: int | None = None


class StorageError(RlmError):
    """A remote store failed. SDK/OS errors are translated to this family exactly once. HTTP 502;
    the Kafka listener answers KAFKA_STORAGE_ERROR (clients back off and fetch again)."""

    http_status = 502
    kafka_error = "KAFKA_STORAGE_ERROR"


class ObjectNotFoundError(StorageError, FileNotFoundError):
    """The object (or byte range start) does not exist. Also a :class:`FileNotFoundError`, so code
    that reads "a file or an object" handles a missing one the same way whichever tier it is in;
    ``errno`` stays None (no OS call failed) and ``str()`` is rlm's one-line text."""


class ObjectExistsError(StorageError):
    """A conditional create found the object already present."""


class TransientStorageError(StorageError):
    """Throttling (e.g. 503 SlowDown), a 5xx or a timeout: the operation may be retried.

    Backends raise it and never retry themselves; the one retry layer, where the store is opened
    (rlm.storage.retry, docs/storage.md), sets ``attempts`` and adds "gave up after N attempts"
    to the text when it has exhausted them.
    """

    attempts: int | None = None


class StoreLayoutError(ConfigError, StorageError):
    """The configured key layout (``[remote] prefix_spread``) is not the one the store was written
    with (docs/key-spread.md): the CLI exits with code 2 (a ConfigError) instead of seeing an empty
    store; found by a store call (a store that did not answer at start), it is the store's refusal
    (a StorageError: store health counts it as an answer, the probe does not fail on it)."""

    http_status = 502
    exit_code = 2
    kafka_error = "KAFKA_STORAGE_ERROR"


class StoreUnavailableError(StorageError):
    """The store is known to be unreachable (every call failed for a while, or one hangs).

    Raised without touching the store, until a probe succeeds (see ``rlm/storage/health.py`` and
    docs/operations.md). Deliberately not a :class:`TransientStorageError`: retry loops must not
    spin on it. HTTP answers 503; the CLI exits 1 like any store failure.
    """

    http_status = 503
    http_headers: ClassVar[Mapping[str, str]] = {"Retry-After": "5"}


class BackendNotFoundError(StorageError):
    """No storage backend is installed under the configured name: the CLI exits 2 (a usage
    error, like a bad config value)."""

    exit_code = 2


class ProtectionError(RlmError):
    """Protected remote data cannot be turned back into plaintext (docs/protection.md). The message
    names the object (``file``), the offset where known and the key id; never any key material.
    The CLI exits 1; the API answers 500 for a key problem (field ``key``: this server's key ring),
    502 for a tampered object."""

    default_field: ClassVar[str | None] = "key"

    def __init__(
        self,
        reason: str,
        *,
        key_id: str | None = None,
        field: str | None = None,
        file: str | os.PathLike[str] | None = None,
        position: int | None = None,
        offset: int | None = None,
    ) -> None:
        super().__init__(reason, field=field, file=file, position=position, offset=offset)
        self.key_id = key_id


class KeyNotFoundError(ProtectionError):
    """The key id recorded with a wrapped data key is not in ``[remote.encryption] key_files``."""


class WrongKeyError(ProtectionError):
    """The key configured under the recorded id does not unwrap the data key (a replaced key file)."""


class TamperedObjectError(ProtectionError):
    """An AES-GCM tag or a manifest MAC failed: stored bytes were changed, moved or forged.
    HTTP 502: the store served bytes that are not what rlm wrote (no field: not the request's)."""

    http_status = 502
    default_field = None


class SegmentQuarantined(RlmError):
    """The segment failed verification; it is not uploaded and blocks its partition's tiering.

    ``cause`` says why in one word (docs/broker-files.md): ``empty`` (a rolled ``.log`` of 0
    bytes), ``torn_tail`` (it ends inside a batch) or ``corrupt`` (a CRC or framing error).
    ``version`` is the failed ``.log``'s (device, inode, size, mtime_ns) as
    ``rlm.logdir.indexcheck.file_version`` gives it: the quarantine lasts while it is unchanged.
    """

    def __init__(
        self,
        reason: str,
        *,
        cause: str = "corrupt",
        file: str | os.PathLike[str] | None = None,
        position: int | None = None,
        offset: int | None = None,
        version: tuple[int, int, int, int] | None = None,
    ) -> None:
        super().__init__(reason, file=file, position=position, offset=offset)
        self.cause = cause
        self.version = version


class SegmentVanished(RlmError):
    """The log store deleted the segment before it could be pinned."""


class PinRoomExhausted(RlmError):
    """A copy's pin does not fit ``tiering.max_pinned_bytes`` while another copy of the log dir
    is already past it (rlm.tiering.local.pin_ledger): the partition's copies wait for the next pass."""


class UploadAbandoned(Exception):
    """Raised from a throttled upload stream when shutdown asks in-flight uploads to stop
    (rlm.tiering.local.throttle). Deliberately not an :class:`RlmError`: a shutdown signal, not a
    failure; the handlers that count and report failed copies (``except RlmError``) must not take
    it for one."""


class StateDirLockedError(RlmError):
    """Another ``rlm run`` holds the lock of a state directory (one daemon per state dir)."""


class StreamInterruptedError(RlmError):
    """A streamed read (``GET .../records/stream``) ended before its terminating chunk: the server
    failed mid-stream or the connection broke. What was yielded before is whole and valid; resume
    from the offset after the last batch received (docs/streaming.md)."""


class RlmHttpError(RlmError):
    """A 4xx/5xx answer of the HTTP API to :class:`rlm.http.client.RlmClient`: ``status``, and the
    ``field`` the server blamed (None when global). The CLI exits 1."""

    def __init__(self, status: int, field: str | None, reason: str) -> None:
        super().__init__(f"HTTP {status}: {reason}" + (f" (field {field})" if field else ""), field=field)
        self.status = status
        self.server_reason = reason  # the answer's own text, without the status

    def __reduce__(self) -> tuple[object, ...]:
        # copy (RlmError.in_file) and pickle rebuild it from its own arguments, not from ``args``
        return (type(self), (self.status, self.field, self.server_reason), self.__dict__)


class ExportOutputExistsError(RlmError):
    """The output of an export already exists and overwriting was not asked for (docs/export.md).
    Not an :class:`InvalidArgumentError`: the arguments are valid, the destination is taken (exit
    code 1, like Spark's ``errorifexists``)."""


class NativeExtensionError(RlmError):
    """A compiled extension was required (``RLM_REQUIRE_NATIVE=1``, or ``RLM_SCAN=native``) but
    does not import: ``make install`` builds it. Without the requirement rlm falls back to the
    pure-Python code and logs one line saying so (docs/scan.md)."""


class TableError(RlmError):
    """An Iceberg table that cannot take this export: another schema or partition spec, data
    already present without ``--incremental``, or a concurrent commit (docs/iceberg.md)."""


class ExecutorEnvironmentError(RlmError):
    """A Spark executor cannot run the job as the driver planned it: it imports another build of rlm
    than the driver (tasks are pickled rlm classes). Install the driver's rlm on the executors
    (docs/spark-cluster.md)."""


class KafkaProtocolError(RlmError):
    """A Kafka-protocol request the listener cannot answer with an error code: a frame above
    ``kafka.max_request_bytes``, bytes that are not a request, an API key or version it does not
    serve, a request before SASL authentication. The connection is closed, as Kafka's broker
    closes it (docs/kafka-listener.md)."""
