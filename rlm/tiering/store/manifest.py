"""The per-segment manifest: written last, with "create only if absent" — the commit point.

A segment exists for readers iff its manifest exists. The manifest names the attempt whose data
objects are authoritative and carries what lookups, retention and verification need without
touching the data: offsets, timestamps, sizes, checksums, leader epochs. JSON, UTF-8, one object;
unknown fields are preserved on read (forward compatibility), an unknown ``format_version`` is an
error rather than a guess.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field, fields, replace
from typing import Any

from rlm.errors import FormatError
from rlm.tiering.store.keyring import MAC_BYTES, WrappedKey

__all__ = [
    "COMPRESSIONS",
    "ENCRYPTION_ALG",
    "ENTRIES_OBJECT",
    "FORMAT_VERSION",
    "INDEX_OBJECT",
    "LEADER_EPOCHS_OBJECT",
    "LOG_OBJECT",
    "MAX_MANIFEST_BYTES",
    "PRODUCER_SNAPSHOT_OBJECT",
    "TIME_INDEX_OBJECT",
    "TXN_INDEX_OBJECT",
    "TXN_INDEX_SOURCES",
    "ManifestAuth",
    "Protection",
    "SegmentManifest",
    "StoredObject",
]

FORMAT_VERSION = 1
#: A manifest is ~1-2 KiB; a stored object larger than this is refused unread, never buffered
#: (a hostile bucket may serve anything under a manifest key).
MAX_MANIFEST_BYTES = 1 << 20

_INT_FIELDS = (
    "partition",
    "base_offset",
    "last_offset",
    "first_timestamp",
    "max_timestamp",
    "size_bytes",
    "record_batches",
    "index_entries",
    "created_ms",
)
_NON_NEGATIVE = frozenset(
    ("partition", "base_offset", "last_offset", "size_bytes", "record_batches", "index_entries")
)
_OBJECT_FIELDS = {"key": str, "size": int, "crc32c": int}

# The names of a manifest's ``objects`` (docs/formats.md §6.3): the one keying of an attempt's stored
# objects. Each names the object's role; the file it is stored as is rlm/tiering/store/object_keys.py's. These
# exact strings are in every stored manifest, so they never change — the entries object is named
# after its file only because manifests were first written that way.
LOG_OBJECT = "log"
INDEX_OBJECT = "index"
TIME_INDEX_OBJECT = "timeindex"
LEADER_EPOCHS_OBJECT = "leader_epoch_checkpoint"
PRODUCER_SNAPSHOT_OBJECT = "producer_snapshot"
TXN_INDEX_OBJECT = "txn_index"
ENTRIES_OBJECT = "segment.remotelogindex"
#: Present only in the manifest of a partial copy (docs/cluster-copy.md); absent in older manifests.
_OPTIONAL_NON_NEGATIVE = ("source_base_offset", "source_position")
#: ``txn_index.source``: the broker's ``.txnindex`` as checked, or one rebuilt from the batches.
TXN_INDEX_SOURCES = ("broker", "rebuilt")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_fields(doc: dict[str, Any], key: str) -> None:
    """Every known field has the type readers rely on, so a damaged manifest fails here, once, as
    a FormatError naming the object and the field, instead of as a TypeError somewhere later."""

    def bad(name: str, value: Any, allowed: str) -> FormatError:
        return FormatError(f"{key}: manifest field {name} = {repr(value)[:60]}: {allowed}")

    for name in ("topic", "attempt_id"):
        if not isinstance(doc.get(name), str):
            raise bad(name, doc.get(name), "must be a string")
    for name in _INT_FIELDS:
        value: Any = doc.get(name)
        if not _is_int(value) or (name in _NON_NEGATIVE and value < 0):
            raise bad(
                name,
                value,
                "must be a non-negative integer" if name in _NON_NEGATIVE else "must be an integer",
            )
    for name in _OPTIONAL_NON_NEGATIVE:
        if name in doc and (not _is_int(doc[name]) or doc[name] < 0):
            raise bad(name, doc[name], "must be a non-negative integer when present")
    txn = doc.get("txn_index")
    if txn is not None and (
        not isinstance(txn, dict)
        or txn.get("source") not in TXN_INDEX_SOURCES
        or not _is_int(txn.get("entries"))
        or txn["entries"] < 0
    ):
        raise bad("txn_index", txn, "must be {source: broker|rebuilt, entries: non-negative integer}")
    opened = txn.get("open_at_end") if isinstance(txn, dict) else None
    if opened is not None and (
        not isinstance(opened, list)
        or not all(
            isinstance(p, list) and len(p) == 2 and all(_is_int(v) and v >= 0 for v in p) for p in opened
        )
    ):
        raise bad(
            "txn_index.open_at_end",
            opened,
            "must be a list of [producer id, first offset] non-negative integer pairs",
        )
    objects = doc.get("objects")
    if not isinstance(objects, dict) or LOG_OBJECT not in objects:
        raise bad("objects", objects, "must be an object with a 'log' entry")
    for name, obj in objects.items():
        if (
            not isinstance(obj, dict)
            or set(obj) != set(_OBJECT_FIELDS)
            or not all(
                isinstance(obj[f], t) and not isinstance(obj[f], bool) for f, t in _OBJECT_FIELDS.items()
            )
        ):
            raise bad(f"objects.{name}", obj, "must be {key: string, size: integer, crc32c: integer}")
    epochs = doc.get("leader_epochs", [])
    if not isinstance(epochs, list) or not all(
        isinstance(e, list) and len(e) == 2 and all(_is_int(v) for v in e) for e in epochs
    ):
        raise bad("leader_epochs", epochs, "must be a list of [epoch, start offset] integer pairs")


@dataclass(frozen=True, slots=True)
class StoredObject:
    """One uploaded object of an attempt: its key, size in bytes and CRC-32C of its bytes."""

    key: str
    size: int
    crc32c: int


#: ``protection.compression`` values; ``protection.encryption.alg`` values.
COMPRESSIONS = ("none", "zstd")
ENCRYPTION_ALG = "AES-256-GCM"


@dataclass(frozen=True, slots=True)
class Protection:
    """A manifest's ``protection`` field: how the segment's objects are stored (docs/protection.md).

    JSON: ``{"compression": "none"|"zstd", "log_crc32c": <uint32>, "encryption": {"alg":
    "AES-256-GCM", "key_id": "<id>", "wrapped_key": "<base64>"}}`` (``encryption`` absent when only
    compressed). ``compression`` is the codec entries *may* use (each entry's transform byte says
    whether it did); ``log_crc32c`` is the CRC-32C of the plaintext segment bytes (the manifest's
    ``objects.log`` describes the stored bytes). ``encryption`` holds the segment's data key wrapped
    by a master key of the ring; every object of the attempt is then encrypted with it. A manifest
    without the field (every manifest before this existed) is plaintext.
    """

    compression: str = "none"
    log_crc32c: int = 0
    encryption: WrappedKey | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"compression": self.compression, "log_crc32c": self.log_crc32c}
        if self.encryption is not None:
            doc["encryption"] = {"alg": ENCRYPTION_ALG, **self.encryption.to_json()}
        return doc

    @classmethod
    def from_json(cls, doc: Any, *, key: str) -> Protection:
        if (
            not isinstance(doc, dict)
            or doc.get("compression") not in COMPRESSIONS
            or not _is_int(doc.get("log_crc32c"))
            or not 0 <= doc["log_crc32c"] < 2**32
        ):
            raise FormatError(
                f"{key}: manifest field protection = {repr(doc)[:80]}: must be "
                "{compression: none|zstd, log_crc32c: uint32, [encryption]}"
            )
        enc = doc.get("encryption")
        if enc is not None and (not isinstance(enc, dict) or enc.get("alg") != ENCRYPTION_ALG):
            raise FormatError(
                f"{key}: manifest field protection.encryption.alg = "
                f"{enc.get('alg') if isinstance(enc, dict) else enc!r}: this rlm reads "
                f"{ENCRYPTION_ALG}"
            )
        wrapped = None if enc is None else WrappedKey.from_json(enc, where=key)
        return cls(doc["compression"], doc["log_crc32c"], wrapped)


@dataclass(frozen=True, slots=True)
class ManifestAuth:
    """A manifest's ``auth`` field (docs/protection.md §9): HMAC-SHA256 of
    :meth:`SegmentManifest.signed_bytes` under the MAC key derived from master key ``key_id``.
    JSON: ``{"key_id": "<id>", "hmac_sha256": "<base64 of 32 bytes>"}``."""

    key_id: str
    mac: bytes

    def to_json(self) -> dict[str, str]:
        return {"key_id": self.key_id, "hmac_sha256": base64.b64encode(self.mac).decode("ascii")}

    @classmethod
    def from_json(cls, doc: Any, *, key: str) -> ManifestAuth:
        mac = b""
        if isinstance(doc, dict) and isinstance(doc.get("hmac_sha256"), str):
            try:
                mac = base64.b64decode(doc["hmac_sha256"], validate=True)
            except (binascii.Error, ValueError):
                mac = b""
        if not isinstance(doc, dict) or not isinstance(doc.get("key_id"), str) or len(mac) != MAC_BYTES:
            raise FormatError(
                f"{key}: manifest field auth = {repr(doc)[:80]}: must be "
                f"{{key_id: string, hmac_sha256: base64 of {MAC_BYTES} bytes}}"
            )
        return cls(doc["key_id"], mac)


#: Bound into every manifest MAC before the manifest's store key (docs/protection.md §9).
_SIGNED_PREFIX = b"rlm-manifest-v1\x00"


@dataclass(frozen=True, slots=True)
class SegmentManifest:
    """What one copied segment is (offsets inclusive; timestamps in ms since the epoch).

    ``size_bytes`` is the segment's valid bytes (the uploaded ``.log``); ``first_timestamp`` is the
    first batch's base timestamp (-1 for magic 0/1), ``max_timestamp`` the largest batch max
    timestamp; ``leader_epochs`` are the ``(epoch, start_offset)`` entries of the partition's
    leader-epoch cache that apply to the segment's offsets.

    A *partial copy* (docs/cluster-copy.md) uploads only the tail of a local segment file: the
    batches above the highest offset another replica's sidecar had tiered. Its ``base_offset`` is
    then the first uploaded batch's base offset (keys, journal and chain name it by that), and two
    more fields say where the bytes came from: ``source_base_offset``, the base offset of the local
    segment file (its name), and ``source_position``, the byte position in that file where the
    uploaded ``.log`` object starts. Both are None (absent from the JSON) for a whole-segment copy
    and in manifests written before partial copies existed.

    ``txn_index`` says the segment's aborted transactions were captured (docs/transactions.md):
    ``{"source": "broker" | "rebuilt", "entries": n}``, with the entries in the ``txn_index``
    object when ``n > 0``; ``entries: 0`` means the segment aborts nothing. None (absent) is a
    segment tiered before rlm captured them: readers must scan its control batches. Its optional
    ``open_at_end``, ``[[producer id, first offset], ...]``, lists the transactions still open
    after ``last_offset`` when the copy knew the state before its first batch; absent = unknown.

    ``protection`` (:class:`Protection`) says the objects are compressed and/or encrypted; None
    (absent) = stored as plaintext. ``size_bytes`` is always the plaintext segment size.

    ``auth`` (:class:`ManifestAuth`) authenticates the manifest at its store key: written by
    every process with an encryption key, required by every reader with one (docs/protection.md
    §9); None (absent) in stores without encryption and in manifests written before it existed.
    """

    topic: str
    partition: int
    base_offset: int
    last_offset: int
    first_timestamp: int
    max_timestamp: int
    size_bytes: int
    record_batches: int
    index_entries: int
    attempt_id: str
    created_ms: int
    objects: dict[str, StoredObject]
    leader_epochs: tuple[tuple[int, int], ...] = ()
    source_base_offset: int | None = None
    source_position: int | None = None
    txn_index: dict[str, Any] | None = None
    protection: Protection | None = None
    auth: ManifestAuth | None = None
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def log(self) -> StoredObject:
        return self.objects[LOG_OBJECT]

    @property
    def partial(self) -> bool:
        """True when the ``.log`` object is a tail of a local segment file (see the class doc)."""
        return self.source_position is not None

    @property
    def encrypted(self) -> bool:
        return self.protection is not None and self.protection.encryption is not None

    @property
    def content_crc32c(self) -> int:
        """CRC-32C of the segment's plaintext bytes (``objects.log`` describes the stored bytes)."""
        return self.protection.log_crc32c if self.protection is not None else self.log.crc32c

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    def same_segment_as(self, other: SegmentManifest) -> bool:
        """True when both describe the same bytes (the copier's already-committed check, attempt ignored)."""
        return (self.topic, self.partition, self.base_offset, self.last_offset, self.size_bytes) == (
            other.topic,
            other.partition,
            other.base_offset,
            other.last_offset,
            other.size_bytes,
        ) and self.content_crc32c == other.content_crc32c

    def to_json(self) -> bytes:
        # A shallow dict, not dataclasses.asdict (its deep copy was ~75 % of this): the manifest
        # snapshot encodes every manifest of a partition at each commit (manifest_snapshot.save).
        doc = {name: getattr(self, name) for name in _JSON_FIELDS}
        doc["objects"] = {name: _object_json(o) for name, o in self.objects.items()}
        doc["leader_epochs"] = [list(e) for e in self.leader_epochs]
        doc["protection"] = None if self.protection is None else self.protection.to_json()
        doc["auth"] = None if self.auth is None else self.auth.to_json()
        for name in (*_OPTIONAL_NON_NEGATIVE, "txn_index", "protection", "auth"):
            if doc[name] is None:
                del doc[name]  # a whole-segment copy: the manifest reads as before partial copies
        doc.update(self.extra)
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")

    def signed_bytes(self, key: str) -> bytes:
        """What ``auth`` authenticates: a version prefix, the manifest's store key (its topic,
        partition, topic id root and base offset), a NUL, then :meth:`to_json` without ``auth``
        (every field, unknown ones too: canonical, keys sorted)."""
        return _SIGNED_PREFIX + key.encode("utf-8") + b"\x00" + replace(self, auth=None).to_json()

    @classmethod
    def from_json(cls, data: bytes, *, key: str = "<manifest>") -> SegmentManifest:
        """Parse and type-check a manifest; anything malformed → :class:`FormatError` naming ``key``."""
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict):
                raise FormatError(f"{key}: manifest is not a JSON object")
            version = doc.get("format_version")
            if version != FORMAT_VERSION:
                raise FormatError(
                    f"{key}: manifest format_version {version!r} is not supported "
                    f"(this rlm reads {FORMAT_VERSION})"
                )
            _check_fields(doc, key)
            known = {f for f in cls.__dataclass_fields__ if f != "extra"}
            values = {k: doc[k] for k in known if k in doc}
            values["objects"] = {name: StoredObject(**o) for name, o in doc["objects"].items()}
            values["leader_epochs"] = tuple((int(e), int(o)) for e, o in doc.get("leader_epochs", []))
            if values.get("txn_index") is not None:
                values["txn_index"] = dict(values["txn_index"])
            if values.get("protection") is not None:
                values["protection"] = Protection.from_json(values["protection"], key=key)
            if values.get("auth") is not None:
                values["auth"] = ManifestAuth.from_json(values["auth"], key=key)
            extra = {k: v for k, v in doc.items() if k not in known}
            return cls(**values, extra=extra)
        except FormatError:
            raise
        except RecursionError:
            raise FormatError(f"{key}: malformed manifest: JSON nested too deeply") from None
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise FormatError(f"{key}: malformed manifest: {err}") from err


#: The fields :meth:`SegmentManifest.to_json` writes (``extra``'s keys are merged in instead).
_JSON_FIELDS = tuple(f.name for f in fields(SegmentManifest) if f.name != "extra")


def _object_json(obj: StoredObject) -> dict[str, Any]:
    """One object as the manifest JSON writes it (the fields :data:`_OBJECT_FIELDS` checks)."""
    return {name: getattr(obj, name) for name in _OBJECT_FIELDS}
