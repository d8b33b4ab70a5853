"""Readers' side of protection (docs/protection.md §5): stored entry bytes → the entry's batches,
knowing only the entry's object key (lookups, fetches, read-ahead).

An encrypted entry needs its segment's manifest (the wrapped data key, the attempt bound into the
entry): the one the process's :class:`~rlm.tiering.store.store_protection.StoreProtection` remembers (the
daemon's copier and sync feed it), else read once per segment per process through
:class:`~rlm.tiering.store.remote_state.RemoteState` — the one reader of manifests — at the key the
entry's object key names (rlm/tiering/store/object_keys.py). Plain and compressed-only entries need
nothing but the entry. It sits above remote_state (which imports store_protection), so
store_protection stays the mechanism and knows nothing of where manifests are read.
"""

from __future__ import annotations

from rlm.errors import FormatError, StorageError
from rlm.formats.indexes.remote_index import TRANSFORM_AES_GCM, RemoteLogIndexEntry
from rlm.formats.sealed import open_entry
from rlm.storage.api import StorageBackend
from rlm.tiering.store.manifest import SegmentManifest
from rlm.tiering.store.remote_state import RemoteState
from rlm.tiering.store.store_protection import StoreProtection

__all__ = ["EntryOpener"]


class EntryOpener:
    """Opens entries of any partition of ``backend`` (its reads retried by the store's layer)."""

    def __init__(self, protection: StoreProtection, backend: StorageBackend) -> None:
        self.protection = protection
        self.backend = backend

    def manifest_for(self, log_key: str) -> SegmentManifest:
        """The committed manifest of the segment whose log object is ``log_key``: remembered, or
        one manifest read; StorageError when the key is no segment data key or the manifest
        commits another attempt (an uncommitted attempt's entry)."""
        hit = self.protection.known(log_key)
        if hit is not None:
            return hit
        found = RemoteState.of_data_key(self.backend, log_key, self.protection)
        if found is None:
            raise StorageError(
                "an encrypted entry's object key is not a segment data key: its "
                "manifest (and data key) cannot be found",
                file=log_key,
            )
        state, ref = found
        m = state.manifest_at(ref.base_offset)
        if m.log.key != log_key:
            raise StorageError(
                f"the segment's manifest names log object {m.log.key}, not this one "
                "(an uncommitted attempt's entry)",
                file=log_key,
            )
        return m

    def open(self, entry: RemoteLogIndexEntry, stored: bytes, *, log_key: str) -> bytes:
        """The entry's batches; its stored bytes as they are when it is a magic 0 entry."""
        if not entry.transformed:
            return stored
        if entry.transform & TRANSFORM_AES_GCM:
            return self.protection.open_entry(self.manifest_for(log_key), entry, stored)
        try:
            return open_entry(stored, entry, key=None, binding=None)
        except FormatError as err:
            raise err.in_file(log_key) from err
