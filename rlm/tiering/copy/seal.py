"""Step 3 of a copy (rlm/tiering/copy/copier.py): upload one attempt's objects, protected when configured.

Plaintext (no ``[remote.compression]`` / ``[remote.encryption]``): every file is uploaded as it
is, as before. Protected (docs/protection.md): the ``.log`` is *sealed* into a stored form in the
pin dir first — each remote index entry compressed (zstd, unless its batches are already
compressed) and/or encrypted (AES-256-GCM with the segment's fresh data key), the stored entries
back to back — and its entries become magic 1 entries naming their stored ranges. With
encryption on, every other object is encrypted whole. The manifest's ``protection`` field
(:class:`~rlm.tiering.store.manifest.Protection`) records how.

Either way the stored ``.log`` is proven to be what was produced: the CRC-32C computed while
uploading equals the one computed while producing it, and the plaintext read while sealing has
the CRC-32C the checksum walk computed (the pinned file did not change in between).
"""

from __future__ import annotations

import functools
import mmap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rlm.errors import StorageError
from rlm.formats.indexes.remote_index import (
    REMOTE_LOG_INDEX_MAGIC,
    STORED_ENTRY_MAGIC,
    RemoteDataIdentifier,
    RemoteLogIndexEntry,
)
from rlm.formats.records import RecordBatch
from rlm.formats.records.scan import crc32c as crc32c_of
from rlm.formats.sealed import EntryBinding, compressible, seal_entry, seal_object
from rlm.tiering.copy.upload import UploadControl, upload_bytes, upload_file, upload_together
from rlm.tiering.local import PartitionContext
from rlm.tiering.store import (
    ENTRIES_OBJECT,
    INDEX_OBJECT,
    LEADER_EPOCHS_OBJECT,
    LOG_OBJECT,
    PRODUCER_SNAPSHOT_OBJECT,
    TIME_INDEX_OBJECT,
    TXN_INDEX_OBJECT,
    Protection,
    StoredObject,
    StoreProtection,
    object_keys,
)

__all__ = ["Uploaded", "upload_attempt"]

#: Objects uploaded beside the ``.log``: pinned role → manifest name.
_COMPANIONS = (
    (object_keys.OFFSET_INDEX, INDEX_OBJECT),
    (object_keys.TIME_INDEX, TIME_INDEX_OBJECT),
    (object_keys.LEADER_EPOCHS, LEADER_EPOCHS_OBJECT),
    (object_keys.PRODUCER_SNAPSHOT, PRODUCER_SNAPSHOT_OBJECT),
)


@dataclass(frozen=True, slots=True)
class Uploaded:
    """What one attempt stored: objects by manifest name, the entries as stored, how."""

    objects: dict[str, StoredObject]
    entries: list[RemoteLogIndexEntry]
    protection: Protection | None


@dataclass(frozen=True, slots=True)
class _Sealed:
    path: Path
    entries: list[RemoteLogIndexEntry]
    crc32c: int  # of the stored bytes
    plain_crc32c: int  # of the plaintext read while sealing


def _seal_log(
    src: Path,
    dst: Path,
    entries: Sequence[RemoteLogIndexEntry],
    batches: Sequence[RecordBatch],
    protection: StoreProtection,
    data_key: bytes | None,
    binding: EntryBinding,
) -> _Sealed:
    """Write the stored form of the pinned ``.log`` ``src`` to ``dst``, entry by entry."""
    level = protection.compression.level if protection.compression.enabled else None
    out_entries: list[RemoteLogIndexEntry] = []
    stored_crc = plain_crc = position = 0
    b = 0
    with (
        src.open("rb") as fh,
        mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf,
        dst.open("wb") as out,
    ):
        for e in entries:
            start, end = e.byte_range
            attrs = []
            while b < len(batches) and batches[b].position < end:
                attrs.append(batches[b].attributes)
                b += 1
            plain = buf[start:end]  # a copy: a view would pin the map open past its close
            plain_crc = crc32c_of(plain, plain_crc)
            stored, transform = seal_entry(
                plain,
                compress_level=level if compressible(attrs) else None,
                key=data_key,
                binding=binding,
                first_offset=e.first_offset,
                last_offset=e.last_offset,
                stored_position=position,
            )
            out.write(stored)
            stored_crc = crc32c_of(stored, stored_crc)
            out_entries.append(
                RemoteLogIndexEntry(
                    e.first_offset,
                    e.last_offset,
                    e.first_timestamp,
                    e.last_timestamp,
                    e.data_length,
                    RemoteDataIdentifier(e.rdi.url, position),
                    STORED_ENTRY_MAGIC if transform else REMOTE_LOG_INDEX_MAGIC,
                    transform,
                    len(stored) if transform else 0,
                )
            )
            position += len(stored)
    return _Sealed(dst, out_entries, stored_crc, plain_crc)


def upload_attempt(
    ctx: PartitionContext,
    pinned: dict[str, Path],
    txn_path: Path | None,
    entries: list[RemoteLogIndexEntry],
    batches: Sequence[RecordBatch],
    base: int,
    attempt: str,
    key: Callable[[str], str],
    plain_crc32c: int,
    log_upload: Callable[[], StoredObject] | None = None,
    control: UploadControl | None = None,
) -> Uploaded:
    """Upload the attempt's objects (the ``.log`` on this thread, its companions and the entries
    object beside it: :func:`upload_together`) under the shared upload slots; raise
    :class:`StorageError` when the ``.log`` changed meanwhile.

    ``log_upload`` (plaintext only) is the result of a ``.log`` upload the caller already started,
    under an upload slot it holds: the companions go beside it and this waits for it. ``control``
    signals to and from the ``.log``'s upload (:class:`~rlm.tiering.copy.upload.UploadControl`)."""
    protection = ctx.shared.protection
    log_path, log_key, entries_key = (
        pinned[object_keys.LOG],
        key(object_keys.LOG),
        key(object_keys.SEGMENT_ENTRIES),
    )
    files = [(key(role), name, pinned[role]) for role, name in _COMPANIONS if role in pinned]
    if txn_path is not None:
        files.append((key(object_keys.TXN_INDEX), TXN_INDEX_OBJECT, txn_path))
    if not protection.writes_protected:
        blob = b"".join(e.encode() for e in entries)
        objects = _upload_objects(
            ctx, (log_key, log_path), files, entries_key, blob, None, log_upload, control
        )
        _check(objects[LOG_OBJECT].crc32c, plain_crc32c, log_path, base)
        return Uploaded(objects, entries, None)
    if log_upload is not None:
        raise ValueError("a protected .log is sealed before its upload: it cannot have started")

    data_key, wrapped = (
        protection.ring.new_data_key() if protection.ring and protection.encrypts else (None, None)
    )
    sealed = _seal_log(
        log_path,
        log_path.with_name(object_keys.LOG + ".stored"),
        entries,
        batches,
        protection,
        data_key,
        EntryBinding(ctx.topic, ctx.partition, base, attempt),
    )
    _check(sealed.plain_crc32c, plain_crc32c, log_path, base)
    blob = b"".join(e.encode() for e in sealed.entries)
    objects = _upload_objects(
        ctx, (log_key, sealed.path), files, entries_key, blob, data_key, control=control
    )
    _check(objects[LOG_OBJECT].crc32c, sealed.crc32c, sealed.path, base)
    return Uploaded(objects, sealed.entries, Protection(protection.compression.codec, plain_crc32c, wrapped))


def _upload_objects(
    ctx: PartitionContext,
    log: tuple[str, Path],
    files: list[tuple[str, str, Path]],
    entries_key: str,
    entries_blob: bytes,
    data_key: bytes | None,
    log_upload: Callable[[], StoredObject] | None = None,
    control: UploadControl | None = None,
) -> dict[str, StoredObject]:
    """The stored ``.log`` (key, file) on this thread and the companion ``files`` (key, manifest
    name, file) and entries object beside it (:func:`upload_together`), under one upload slot;
    each object but the ``.log`` encrypted whole with ``data_key`` when given. With ``log_upload``
    (a ``.log`` upload already running under the caller's slot) this thread waits for that one."""

    def put(object_key: str, data: bytes) -> StoredObject:
        stored = data if data_key is None else seal_object(data, key=data_key, object_key=object_key)
        return upload_bytes(ctx, object_key, stored)

    def put_file(object_key: str, path: Path) -> StoredObject:
        if data_key is None:
            return upload_file(ctx, object_key, path)
        return put(object_key, path.read_bytes())

    rest = {name: functools.partial(put_file, object_key, path) for object_key, name, path in files}
    rest[ENTRIES_OBJECT] = functools.partial(put, entries_key, entries_blob)
    if log_upload is not None:
        stored_log, more = upload_together(ctx.shared.companion_pool(), log_upload, rest)
        return {LOG_OBJECT: stored_log, **more}
    with ctx.shared.upload_slots:
        stored_log, more = upload_together(
            ctx.shared.companion_pool(),
            functools.partial(upload_file, ctx, log[0], log[1], watch_half=True, control=control),
            rest,
        )
    return {LOG_OBJECT: stored_log, **more}


def _check(actual: int, expected: int, path: Path, base: int) -> None:
    if actual != expected:
        raise StorageError("segment changed while it was uploaded (CRC-32C differs)", file=path, offset=base)
