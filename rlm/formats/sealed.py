"""Stored forms of protected data (docs/protection.md): one entry's batches, one whole object.

Pure: buffers and keys in, bytes out. Which key and which binding to use is the caller's
(rlm/tiering/store/store_protection.py); this module only defines the byte layouts.

**An entry** (a magic 1 ``.remotelogindex`` entry, docs/formats.md §5.1) is stored as::

    zstd frame of the entry's batches     when transform has TRANSFORM_ZSTD (else the batches)
    → AES-256-GCM ciphertext ‖ tag (16)   when transform has TRANSFORM_AES_GCM

The GCM nonce (12 bytes) is not stored: ``00 00 00 00`` ‖ the entry's first offset (int64,
big-endian). The segment's data key is fresh (32 random bytes) for every copy attempt and entries
of one segment have distinct first offsets, so a (key, nonce) pair is never used twice. The
associated data binds the entry to its place (:func:`entry_ad`): topic, partition, segment base
offset, attempt id, the entry's offsets, plaintext length, transform and stored byte position —
an entry swapped with another, moved, or relabelled in the index fails authentication.

**A whole object** (the segment's ``.index``, ``.timeindex``, leader-epoch checkpoint, producer
snapshot, ``.txnindex`` and entries object) is stored as::

    off size
      0  12  nonce: ff ff ff ff ‖ 8 random bytes
     12   n  AES-256-GCM ciphertext of the object
   12+n  16  tag; associated data = b"rlm-object-v1:" + the object's key (UTF-8)

Object nonces start ``ff ff ff ff`` and entry nonces ``00 00 00 00``, so the two never meet; a
segment has at most six objects, so 64 random bits make a repeat among them negligible (2⁻⁶⁰).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass

import cramjam
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from rlm.errors import CompressionError, TamperedObjectError
from rlm.formats.indexes.offset_index import Buffer
from rlm.formats.indexes.remote_index import TRANSFORM_AES_GCM, TRANSFORM_ZSTD, RemoteLogIndexEntry

__all__ = [
    "OBJECT_OVERHEAD",
    "TAG_BYTES",
    "EntryBinding",
    "compressible",
    "entry_ad",
    "open_entry",
    "open_object",
    "seal_entry",
    "seal_object",
]

TAG_BYTES = 16
_NONCE_BYTES = 12
OBJECT_OVERHEAD = _NONCE_BYTES + TAG_BYTES
_OBJECT_NONCE_PREFIX = b"\xff\xff\xff\xff"
_ENTRY_NONCE = struct.Struct(">Iq")
_OBJECT_AD = b"rlm-object-v1:"
_ENTRY_AD = struct.Struct(">iqqqiiBq")  # partition, base, first, last, dataLength, storedPosition…
_CODEC_MASK = 0x07  # batch attributes bits 0-2 (docs/formats.md §3.2)


@dataclass(frozen=True, slots=True)
class EntryBinding:
    """Where a segment's entries belong: bound into every entry's associated data."""

    topic: str
    partition: int
    base_offset: int
    attempt_id: str


def entry_ad(
    binding: EntryBinding,
    *,
    first_offset: int,
    last_offset: int,
    data_length: int,
    transform: int,
    stored_position: int,
) -> bytes:
    """``b"rlm-entry-v1:" ‖ topic ‖ 0x00 ‖ attempt ‖ 0x00 ‖`` partition int32, base, first, last
    offsets int64, dataLength int32, 0 int32 (reserved), transform uint8, stored position int64
    (big-endian). Topic names and attempt ids hold no NUL, so the text part parses one way only."""
    text = f"rlm-entry-v1:{binding.topic}\x00{binding.attempt_id}\x00".encode()
    return text + _ENTRY_AD.pack(
        binding.partition,
        binding.base_offset,
        first_offset,
        last_offset,
        data_length,
        0,
        transform,
        stored_position,
    )


def _entry_nonce(first_offset: int) -> bytes:
    return _ENTRY_NONCE.pack(0, first_offset)


def compressible(attributes: Iterable[int]) -> bool:
    """True unless every batch of the entry (their attribute fields) is already compressed: a
    topic whose producers mix codecs still has uncompressed batches worth compressing (whether
    it pays is :func:`seal_entry`'s size check)."""
    return not all(a & _CODEC_MASK != 0 for a in attributes)


def seal_entry(
    plain: Buffer,
    *,
    compress_level: int | None,
    key: bytes | None,
    binding: EntryBinding,
    first_offset: int,
    last_offset: int,
    stored_position: int,
) -> tuple[bytes, int]:
    """``(stored bytes, transform)`` of one entry's batches ``plain``. zstd is applied when
    ``compress_level`` is set and it makes the entry smaller; AES-256-GCM when ``key`` is set (the
    associated data :func:`entry_ad` binds ``binding``, the offsets, the length, the transform and
    ``stored_position``, the entry's byte position in the stored object). ``transform`` 0 means
    "store as is" (a magic 0 entry)."""
    data: Buffer = plain
    transform = 0
    if compress_level is not None:
        packed = bytes(cramjam.zstd.compress(plain, level=compress_level))
        if len(packed) < len(memoryview(plain)):
            data, transform = packed, TRANSFORM_ZSTD
    if key is None:
        return bytes(data), transform
    transform |= TRANSFORM_AES_GCM
    ad = entry_ad(
        binding,
        first_offset=first_offset,
        last_offset=last_offset,
        data_length=len(memoryview(plain)),
        transform=transform,
        stored_position=stored_position,
    )
    return AESGCM(key).encrypt(_entry_nonce(first_offset), bytes(data), ad), transform


def open_entry(
    stored: Buffer, entry: RemoteLogIndexEntry, *, key: bytes | None, binding: EntryBinding | None
) -> bytes:
    """The batches of ``entry`` (``data_length`` bytes) from its stored bytes. A GCM tag that fails
    is :class:`TamperedObjectError`; a zstd frame that does not inflate to exactly ``data_length``
    bytes is :class:`CompressionError` (when encrypted it cannot happen: the tag covers it). A magic
    0 entry is returned as is."""
    first = entry.first_offset
    if not entry.transformed:
        return bytes(stored)
    data: Buffer = stored
    if entry.transform & TRANSFORM_AES_GCM:
        if key is None or binding is None:
            raise TamperedObjectError("entry is encrypted but no data key was given", offset=first)
        ad = entry_ad(
            binding,
            first_offset=first,
            last_offset=entry.last_offset,
            data_length=entry.data_length,
            transform=entry.transform,
            stored_position=entry.rdi.position,
        )
        try:
            data = AESGCM(key).decrypt(_entry_nonce(first), bytes(stored), ad)
        except InvalidTag:
            raise TamperedObjectError(
                "entry fails authentication (AES-256-GCM tag): its stored bytes "
                "were changed, truncated or moved",
                offset=first,
            ) from None
    if not entry.transform & TRANSFORM_ZSTD:
        return bytes(data)
    out = bytearray(entry.data_length)
    try:
        n = cramjam.zstd.decompress_into(data, out)
    except cramjam.DecompressionError as err:
        raise CompressionError(
            f"entry does not inflate to its {entry.data_length} bytes: {err}", offset=first
        ) from None
    if n != entry.data_length:
        raise CompressionError(
            f"entry inflates to {n} bytes, its index entry says {entry.data_length}", offset=first
        )
    return bytes(out)


def seal_object(plain: Buffer, *, key: bytes, object_key: str) -> bytes:
    """A whole object in its stored form (module doc), bound to ``object_key``."""
    nonce = _OBJECT_NONCE_PREFIX + os.urandom(_NONCE_BYTES - len(_OBJECT_NONCE_PREFIX))
    return nonce + AESGCM(key).encrypt(nonce, bytes(plain), _OBJECT_AD + object_key.encode())


def open_object(stored: Buffer, *, key: bytes, object_key: str) -> bytes:
    """The plaintext of :func:`seal_object`'s form; any change → :class:`TamperedObjectError`."""
    view = memoryview(stored)
    if len(view) < OBJECT_OVERHEAD or bytes(view[:4]) != _OBJECT_NONCE_PREFIX:
        raise TamperedObjectError(
            f"object is {len(view)} bytes, not an encrypted object (nonce ‖ ciphertext ‖ tag)"
        )
    try:
        return AESGCM(key).decrypt(
            bytes(view[:_NONCE_BYTES]), bytes(view[_NONCE_BYTES:]), _OBJECT_AD + object_key.encode()
        )
    except InvalidTag:
        raise TamperedObjectError(
            "object fails authentication (AES-256-GCM tag): its bytes were "
            "changed, truncated or it was moved to another key"
        ) from None
