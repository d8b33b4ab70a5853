"""The transactions open at a segment's first offset, from Kafka's producer-state snapshot
(docs/transactions.md, "The last stable offset").

Kafka writes ``<base>.snapshot`` into the partition dir when it rolls to the segment ``<base>``:
the state of every producer after the batches below ``base``. rlm pins and uploads it with that
segment (the manifest object ``producer_snapshot``), so the snapshot of a local segment is the
file beside it and that of a remote one is its object. A snapshot that is absent, unreadable or
fails its CRC is *no answer* (None), never an empty state: the caller then replays more batches.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rlm.errors import CorruptSnapshotError, ObjectNotFoundError
from rlm.formats.producer_snapshot import parse_producer_snapshot
from rlm.storage.api import StorageBackend
from rlm.tiering.store.manifest import PRODUCER_SNAPSHOT_OBJECT, SegmentManifest
from rlm.tiering.store.store_protection import StoreProtection

__all__ = ["open_at_end", "open_at_local", "open_at_remote", "producer_snapshot_key"]

log = logging.getLogger(__name__)


def producer_snapshot_key(manifest: SegmentManifest, first_offset: int) -> str | None:
    """The key of the snapshot describing the state at ``first_offset`` for the segment of
    ``manifest``, or None: none uploaded, or a partial copy (its snapshot is its source file's,
    at another offset than the manifest's base), or a source starting elsewhere than the base."""
    stored = manifest.objects.get(PRODUCER_SNAPSHOT_OBJECT)
    if stored is None or manifest.partial or manifest.base_offset != first_offset:
        return None
    return stored.key


def open_at_end(manifest: SegmentManifest) -> tuple[tuple[int, int], ...] | None:
    """``(producer id, first offset)`` of the transactions open after the segment's last offset,
    as its copy recorded them (``txn_index.open_at_end``, docs/formats.md §6.3); None = unknown."""
    recorded = manifest.txn_index.get("open_at_end") if manifest.txn_index is not None else None
    if recorded is None:
        return None
    return tuple((int(pid), int(first)) for pid, first in recorded)


def _parse(raw: bytes, where: str) -> dict[int, int] | None:
    try:
        return parse_producer_snapshot(raw).open_transactions()
    except CorruptSnapshotError as err:
        log.warning("%s; replaying earlier batches instead (docs/transactions.md)", err.in_file(where))
        return None


def open_at_local(path: str) -> dict[int, int] | None:
    """The open transactions of a local snapshot file (None: gone or damaged). Kafka writes a
    snapshot in place, so a caller caches the answer per version of the file (a torn one may be
    completed later)."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    return _parse(raw, path)


def open_at_remote(
    backend: StorageBackend,
    protection: StoreProtection,
    key: str,
    manifest: SegmentManifest | None,
) -> dict[int, int] | None:
    """The open transactions of a stored snapshot (``manifest``: set when stored protected)."""
    try:
        raw = backend.read(key)
    except ObjectNotFoundError:
        return None  # deleted by retention meanwhile
    if manifest is not None:
        raw = protection.open_object(manifest, key, raw)
    return _parse(raw, key)
