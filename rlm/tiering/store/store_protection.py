"""The one place stored bytes become plaintext (docs/protection.md): the protection mechanism, under
the settings of rlm/config/protection_settings.py, over the byte forms of rlm/formats/sealed.py.

Every reader of rlm's stored objects goes through :class:`StoreProtection` (whole objects, with
the segment's manifest at hand), directly or through
:class:`~rlm.tiering.store.entry_opener.EntryOpener` (remote index entries, with only the entry's
object key at hand: lookups, fetches, read-ahead). A segment without a manifest ``protection``
field, and a magic 0 entry, pass through unchanged, so plaintext stores cost nothing.

Its :meth:`StoreProtection.read_manifest` / :meth:`~StoreProtection.load_manifest` are the one
parse-and-trust mechanism of manifests; the one module that calls it is
rlm/tiering/store/remote_state.py (docs/remote-state.md), which every reader of manifests asks.

Errors name the object, the partition and offset where known, and the key id, on one line:
:class:`KeyNotFoundError`, :class:`WrongKeyError`, :class:`TamperedObjectError` (rlm/errors.py).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from rlm.config import RemoteSettings
from rlm.config.protection_settings import CompressionSettings
from rlm.errors import FormatError, KeyNotFoundError, ProtectionError, WrongKeyError
from rlm.formats.indexes.remote_index import TRANSFORM_AES_GCM, RemoteLogIndexEntry, iter_entries
from rlm.formats.sealed import EntryBinding, open_entry, open_object
from rlm.storage.api import StorageBackend
from rlm.tiering.store.keyring import KeyRing
from rlm.tiering.store.manifest import ENTRIES_OBJECT, MAX_MANIFEST_BYTES, SegmentManifest
from rlm.tiering.store.manifest_trust import check_manifest, seal_manifest

__all__ = ["StoreProtection"]

#: Encrypted segments' manifests a :class:`StoreProtection` keeps (a manifest is ~1 KiB): the data
#: keys of the segments readers touched recently are unwrapped once, not per entry.
_SEGMENTS_KEPT = 4096


def _where(m: SegmentManifest) -> str:
    return f"{m.topic}-{m.partition} segment {m.base_offset}"


def binding_of(m: SegmentManifest) -> EntryBinding:
    return EntryBinding(m.topic, m.partition, m.base_offset, m.attempt_id)


class StoreProtection:
    """How this process writes (``compression``, the ring's active key) and reads protected data."""

    def __init__(self, compression: CompressionSettings | None = None, ring: KeyRing | None = None) -> None:
        self.compression = compression or CompressionSettings()
        self.ring = ring
        # Encrypted segments' manifests this process wrote or read, by log object key (bounded
        # LRU): the daemon's readers share this object with its copier and sync, so a lookup into
        # a segment the process already knows costs no manifest read (docs/protection.md).
        self._manifests: OrderedDict[str, SegmentManifest] = OrderedDict()
        self._lock = threading.Lock()
        self._settings: RemoteSettings | None = None  # what from_settings built it from (pickling)

    def remember(self, m: SegmentManifest) -> None:
        """Keep ``m`` (when encrypted) for :meth:`known`; a newer version of it replaces the old."""
        if not m.encrypted:
            return
        with self._lock:
            self._manifests[m.log.key] = m
            self._manifests.move_to_end(m.log.key)
            while len(self._manifests) > _SEGMENTS_KEPT:
                self._manifests.popitem(last=False)

    def known(self, log_key: str) -> SegmentManifest | None:
        """The remembered manifest of the segment whose log object is ``log_key``, or None."""
        with self._lock:
            hit = self._manifests.get(log_key)
            if hit is not None:
                self._manifests.move_to_end(log_key)
            return hit

    def read_manifest(
        self, read: Callable[[str, int, int], bytes], key: str, *, trust_unauthenticated: bool = False
    ) -> SegmentManifest:
        """:meth:`load_manifest` of the object at ``key``, read through ``read(key, start, end)``
        at most :data:`MAX_MANIFEST_BYTES` + 1 bytes: a larger object is a FormatError, unbuffered."""
        data = read(key, 0, MAX_MANIFEST_BYTES + 1)
        if len(data) > MAX_MANIFEST_BYTES:
            raise FormatError(
                f"the manifest is larger than {MAX_MANIFEST_BYTES} bytes: not what rlm wrote", file=key
            )
        return self.load_manifest(data, key, trust_unauthenticated=trust_unauthenticated)

    def load_manifest(self, data: bytes, key: str, *, trust_unauthenticated: bool = False) -> SegmentManifest:
        """The manifest stored at ``key`` as a reader may trust it: parsed, checked against its key
        and (with a key ring) its MAC (rlm/tiering/store/manifest_trust.py), then remembered."""
        m = SegmentManifest.from_json(data, key=key)
        check_manifest(self.ring, m, key, trust_unauthenticated=trust_unauthenticated)
        self.remember(m)
        return m

    def seal_manifest(self, m: SegmentManifest, key: str) -> SegmentManifest:
        """``m`` as this process stores it at ``key``: with a MAC when it has an active key."""
        return seal_manifest(self.ring, m, key)

    @classmethod
    def from_settings(cls, remote: RemoteSettings) -> StoreProtection:
        made = cls(remote.compression, KeyRing.from_settings(remote.encryption))
        made._settings = remote
        return made

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as what built it (job executors get a :class:`RemoteState` with it): the
        settings, whose key files the executor reads itself, so no key material is shipped; the
        lock and the manifest cache stay behind."""
        if self._settings is not None:
            return StoreProtection.from_settings, (self._settings,)
        if self.ring is not None:
            raise TypeError(
                "a StoreProtection with a key ring not built from settings is not "
                "picklable: it would ship key material"
            )
        return StoreProtection, (self.compression, None)

    @property
    def encrypts(self) -> bool:
        """New segments are encrypted (an active key is configured)."""
        return self.ring is not None and self.ring.active_id is not None

    @property
    def writes_protected(self) -> bool:
        return self.compression.enabled or self.encrypts

    def data_key(self, m: SegmentManifest) -> bytes | None:
        """The segment's data key (None: not encrypted); unwrapped once, memoized by the ring."""
        if m.protection is None or m.protection.encryption is None:
            return None
        wrapped = m.protection.encryption
        if self.ring is None:
            raise KeyNotFoundError(
                f"{_where(m)}: encrypted with key {wrapped.key_id!r}, but "
                "[remote.encryption] is not configured",
                key_id=wrapped.key_id,
                file=m.log.key,
                offset=m.base_offset,
            )
        try:
            return self.ring.unwrap(wrapped, where=_where(m))
        except ProtectionError as err:
            raise err.in_file(m.log.key) from err

    def open_object(self, m: SegmentManifest, key: str, stored: bytes) -> bytes:
        """An object of ``m``'s attempt (its store key ``key``) as plaintext."""
        data_key = self.data_key(m)
        if data_key is None:
            return stored
        try:
            return open_object(stored, key=data_key, object_key=key)
        except ProtectionError as err:
            raise _named(err, m, key, None) from err

    def open_entry(self, m: SegmentManifest, entry: RemoteLogIndexEntry, stored: bytes) -> bytes:
        """One entry's batches from its stored bytes (the ranged read of ``entry.byte_range``)."""
        if not entry.transformed:
            return stored
        data_key = self.data_key(m) if entry.transform & TRANSFORM_AES_GCM else None
        try:
            return open_entry(stored, entry, key=data_key, binding=binding_of(m))
        except (ProtectionError, FormatError) as err:
            raise _named(err, m, m.log.key, entry.first_offset) from err

    def open_log(self, backend: StorageBackend, m: SegmentManifest, stored: bytes) -> bytes:
        """The whole segment's plaintext from its whole stored ``.log`` (its entries object read to
        find the stored entries; each entry opened)."""
        if m.protection is None:
            return stored
        blob = self.read_object(backend, m, ENTRIES_OBJECT)
        try:
            entries = [d.entry for d in iter_entries(blob)]
        except FormatError as err:
            raise err.in_file(m.objects[ENTRIES_OBJECT].key) from err
        return self.open_entries(m, entries, stored, 0)

    def open_entries(
        self, m: SegmentManifest, entries: Sequence[RemoteLogIndexEntry], stored: bytes, start: int
    ) -> bytes:
        """The plaintext of consecutive ``entries`` whose stored bytes are ``stored``, read from
        byte ``start`` of the object (one ranged read of a job task)."""
        view = memoryview(stored)
        parts = []
        for e in entries:
            lo, hi = e.byte_range
            parts.append(self.open_entry(m, e, bytes(view[lo - start : hi - start])))
        return b"".join(parts)

    def read_object(self, backend: StorageBackend, m: SegmentManifest, name: str) -> bytes:
        """Read ``m.objects[name]`` whole — at most the size its manifest records: a larger stored
        object is a FormatError naming it, never buffered — and open it."""
        stored = m.objects[name]
        return self.open_object(m, stored.key, backend.read_at_most(stored.key, stored.size, what=name))


def _named(err: Exception, m: SegmentManifest, key: str, offset: int | None) -> Exception:
    """``err`` naming the object, the offset, the partition's segment and the key id (one line)."""
    assert isinstance(err, ProtectionError | FormatError)
    key_id = m.protection.encryption.key_id if m.protection and m.protection.encryption else None
    clone = err.in_file(key)
    if not isinstance(err, KeyNotFoundError | WrongKeyError):  # those already name both
        clone.reason += f" ({_where(m)}, key {key_id!r})" if key_id else f" ({_where(m)})"
    if offset is not None and clone.offset is None:
        clone.offset = offset
    if isinstance(clone, ProtectionError) and clone.key_id is None:
        clone.key_id = key_id
    return clone
