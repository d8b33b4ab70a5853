"""The pure layouts of docs/protection.md and docs/formats.md §5.1 magic 1: entries encode and
decode, seal and open; the associated data binds an entry to its place; objects to their key."""

from __future__ import annotations

import os

import pytest

from rlm.errors import CompressionError, InvalidArgumentError, TamperedObjectError
from rlm.formats.indexes.remote_index import (
    STORED_ENTRY_MAGIC,
    TRANSFORM_AES_GCM,
    TRANSFORM_ZSTD,
    RemoteDataIdentifier,
    RemoteLogIndexEntry,
    decode_entry,
    iter_entries,
)
from rlm.formats.sealed import (
    EntryBinding,
    compressible,
    open_entry,
    open_object,
    seal_entry,
    seal_object,
)

URL = "file:///store/t-0/data/00000000000000000000-a/segment.log"
BIND = EntryBinding("t", 0, 0, "0189-abcd")


def _entry(first: int, plain: bytes, stored: bytes, transform: int, position: int) -> RemoteLogIndexEntry:
    return RemoteLogIndexEntry(
        first,
        first + 9,
        1,
        2,
        len(plain),
        RemoteDataIdentifier(URL, position),
        STORED_ENTRY_MAGIC,
        transform,
        len(stored),
    )


def test_magic_1_entry_round_trip_and_mixing_with_magic_0() -> None:
    e1 = RemoteLogIndexEntry(0, 9, 1, 2, 1000, RemoteDataIdentifier(URL, 0), STORED_ENTRY_MAGIC, 3, 321)
    e0 = RemoteLogIndexEntry(10, 19, 3, 4, 500, RemoteDataIdentifier(URL, 321))
    blob = e1.encode() + e0.encode()
    assert len(e1.encode()) == e1.encoded_size == 51 + len(str(e1.rdi))
    decoded = [d.entry for d in iter_entries(blob)]
    assert decoded == [e1, e0]
    assert e1.byte_range == (0, 321) and e0.byte_range == (321, 821)
    bad = bytearray(e1.encode())
    bad[48] ^= 0x01  # the transform byte: the CRC catches it
    with pytest.raises(Exception, match="CRC"):
        decode_entry(bytes(bad), 0)
    with pytest.raises(InvalidArgumentError):
        RemoteLogIndexEntry(0, 9, 1, 2, 10, RemoteDataIdentifier(URL, 0), STORED_ENTRY_MAGIC, 0, 5)
    with pytest.raises(InvalidArgumentError):
        RemoteLogIndexEntry(0, 9, 1, 2, 10, RemoteDataIdentifier(URL, 0), 0, TRANSFORM_ZSTD, 5)


@pytest.mark.parametrize("level,encrypt", [(3, False), (None, True), (3, True)])
def test_seal_open_entry(level: int | None, encrypt: bool) -> None:
    key = os.urandom(32) if encrypt else None
    plain = b"a record value that repeats " * 200
    stored, transform = seal_entry(
        plain, compress_level=level, key=key, binding=BIND, first_offset=5, last_offset=14, stored_position=77
    )
    assert bool(transform & TRANSFORM_ZSTD) == (level is not None)
    assert bool(transform & TRANSFORM_AES_GCM) == encrypt
    assert plain[:20] not in stored or not encrypt  # zstd alone keeps the first literal
    entry = RemoteLogIndexEntry(
        5, 14, 1, 2, len(plain), RemoteDataIdentifier(URL, 77), STORED_ENTRY_MAGIC, transform, len(stored)
    )
    assert open_entry(stored, entry, key=key, binding=BIND) == plain


def test_incompressible_entries_are_stored_as_they_are() -> None:
    plain = os.urandom(4000)
    stored, transform = seal_entry(
        plain, compress_level=3, key=None, binding=BIND, first_offset=0, last_offset=1, stored_position=0
    )
    assert (stored, transform) == (plain, 0)
    assert compressible([0, 0x10, 0x20]) and not compressible([4, 1, 0x13])  # attribute codec bits
    assert compressible([0, 4])  # mixed producers: the uncompressed batches are worth a try


def test_associated_data_binds_the_entry_to_its_place() -> None:
    key = os.urandom(32)
    plain = b"x" * 300
    stored, transform = seal_entry(
        plain, compress_level=None, key=key, binding=BIND, first_offset=5, last_offset=14, stored_position=77
    )
    right = _entry(5, plain, stored, transform, 77)
    assert open_entry(stored, right, key=key, binding=BIND) == plain
    moved = [
        (_entry(5, plain, stored, transform, 78), BIND),  # another position
        (_entry(5, plain, stored, transform, 77), EntryBinding("t", 1, 0, BIND.attempt_id)),  # partition
        (_entry(5, plain, stored, transform, 77), EntryBinding("t", 0, 0, "other")),  # attempt
        (_entry(15, plain, stored, transform, 77), BIND),  # another entry's offsets
    ]
    for entry, binding in moved:
        with pytest.raises(TamperedObjectError):
            open_entry(stored, entry, key=key, binding=binding)
    with pytest.raises(TamperedObjectError):
        open_entry(stored, right, key=os.urandom(32), binding=BIND)
    flipped = bytearray(stored)
    flipped[3] ^= 1
    with pytest.raises(TamperedObjectError, match="authentication"):
        open_entry(bytes(flipped), right, key=key, binding=BIND)


def test_a_bad_zstd_frame_is_a_compression_error_not_wrong_bytes() -> None:
    plain = b"y" * 5000
    stored, transform = seal_entry(
        plain, compress_level=3, key=None, binding=BIND, first_offset=0, last_offset=1, stored_position=0
    )
    entry = _entry(0, plain, stored, transform, 0)
    short = RemoteLogIndexEntry(0, 9, 1, 2, 4000, entry.rdi, STORED_ENTRY_MAGIC, transform, len(stored))
    with pytest.raises(CompressionError):
        open_entry(stored, short, key=None, binding=None)
    with pytest.raises(CompressionError):
        open_entry(stored[:-3], entry, key=None, binding=None)


def test_objects_are_bound_to_their_key() -> None:
    key = os.urandom(32)
    stored = seal_object(b"index bytes", key=key, object_key="t-0/data/x/segment.index")
    assert stored[:4] == b"\xff\xff\xff\xff" and b"index bytes" not in stored
    assert open_object(stored, key=key, object_key="t-0/data/x/segment.index") == b"index bytes"
    with pytest.raises(TamperedObjectError):
        open_object(stored, key=key, object_key="t-0/data/y/segment.index")
    with pytest.raises(TamperedObjectError):
        open_object(stored[:-1], key=key, object_key="t-0/data/x/segment.index")
    with pytest.raises(TamperedObjectError):
        open_object(b"short", key=key, object_key="k")
