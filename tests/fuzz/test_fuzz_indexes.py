"""Fuzz both Kafka index kinds (.index, .timeindex) and rlm's remote index family
(.remotelogindex entries, .remoteoffsetindex, .remotetimeindex), as bytes and as files on disk.

Seeds: indexes built by rlm's builders, the indexes LogWriter writes, real broker indexes, and a
remote index set built entry by entry (RemoteIndexSetBuilder). Entry CRCs are re-fixed after
mutation in half the cases so the checks behind the CRC are reached.
"""

from __future__ import annotations

import functools
import struct
import tempfile
import zlib
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from rlm.formats.indexes.offset_index import OffsetIndex, OffsetIndexBuilder
from rlm.formats.indexes.remote_index import (
    RemoteDataIdentifier,
    RemoteLogIndexEntry,
    decode_entry,
    iter_entries,
    scan_entries,
)
from rlm.formats.indexes.remote_index_derived import (
    RemoteIndexSetBuilder,
    derive_remote_indexes,
    find_entry_for_offset,
    find_entry_for_timestamp,
)
from rlm.formats.indexes.time_index import TimeIndex, TimeIndexBuilder
from rlm.tiering.local.index_family import RemoteIndexFamily
from tests.fuzz.harness import INTERESTING, expect_clean, fuzz_settings, mutated
from tests.fuzz.seeds import fixture_files

BASE = 1000
_TARGETS = st.sampled_from(INTERESTING) | st.integers(-(2**64), 2**64)


@functools.cache
def kafka_index_seeds() -> dict[str, tuple[int, bytes]]:
    """name -> (base offset, bytes) for offset (``*.index``) and time (``*.timeindex``) indexes."""
    from tests.lookup.helpers import write_generated

    offsets, times = OffsetIndexBuilder(BASE), TimeIndexBuilder(BASE)
    for i in range(1, 40):
        offsets.append(BASE + 3 * i, 97 * i)
        times.maybe_append(1_700_000_000_000 + 11 * i, BASE + 3 * i)
    seeds = {"built.index": (BASE, offsets.to_bytes()), "built.timeindex": (BASE, times.to_bytes())}
    with tempfile.TemporaryDirectory() as tmp:
        write_generated(Path(tmp), "fuzz", 0, batches=60, seed=5, segment_bytes=1 << 30)
        for path in sorted((Path(tmp) / "fuzz-0").glob("*index")):
            seeds[f"logwriter{path.suffix}"] = (int(path.stem), path.read_bytes())
    for suffix in (".index", ".timeindex"):
        for name, data in fixture_files(suffix, max_bytes=1 << 16, limit=3).items():
            seeds[name] = (int(Path(name).stem), data)
    return seeds


def read_kafka_index(name: str, base: int, data: bytes, target: int, preallocated: bool) -> None:
    """Everything a reader does with an index: open (sanity checks), look up, iterate."""
    if name.endswith(".timeindex"):
        t = TimeIndex(base, data, preallocated=preallocated)
        t.lookup(target), t.ceiling(target), t.last_entry, list(t), t[: len(t) // 2], repr(t)
    else:
        o = OffsetIndex(base, data, preallocated=preallocated)
        o.lookup(target), o.last_offset, list(o), o[: len(o) // 2], repr(o)


@fuzz_settings(2)
@given(
    st.sampled_from(sorted(kafka_index_seeds())).flatmap(
        lambda n: st.tuples(st.just(n), mutated(kafka_index_seeds()[n][1]) | st.binary(max_size=400))
    ),
    _TARGETS,
    st.booleans(),
    st.sampled_from((0, BASE)) | st.integers(-(2**63), 2**63 - 1),
)
def test_kafka_indexes(case: tuple[str, bytes], target: int, preallocated: bool, base: int) -> None:
    name, data = case
    expect_clean(read_kafka_index, name, base, data, target, preallocated, located=True)


# --- the remote index family ------------------------------------------------------------------


@functools.cache
def remote_set() -> tuple[bytes, bytes, bytes]:
    """(.remotelogindex, .remoteoffsetindex, .remotetimeindex) of a 12-entry set based at BASE."""
    builder = RemoteIndexSetBuilder(BASE)
    log = bytearray()
    for i in range(12):
        first = BASE + 10 * i + (3 if i == 5 else 0)  # a compaction gap
        last_ts = 1_700_000_000_000 + 50 * i - (70 if i == 7 else 0)  # timestamps may go backwards
        rdi = RemoteDataIdentifier(f"s3://b/k/{i // 4}.log#x", 600 * i)
        entry = RemoteLogIndexEntry(first, BASE + 10 * i + 9, 1_700_000_000_000 + i, last_ts, 500 + i, rdi)
        log += builder.append(entry).log_index
    return bytes(log), builder.offset_index_bytes(), builder.time_index_bytes()


def fix_entry_crcs(data: bytes) -> bytes:
    """Recompute each walkable entry's CRC-32 over [8, end) (length field at 2, int16)."""
    buf = bytearray(data)
    pos = 0
    while len(buf) - pos >= 8:
        (length,) = struct.unpack_from(">h", buf, pos + 2)
        end = pos + 4 + length
        if length < 4 or end > len(buf):
            break
        struct.pack_into(">I", buf, pos + 4, zlib.crc32(bytes(buf[pos + 8 : end])))
        pos = end
    return bytes(buf)


def read_remote_log_index(data: bytes, pos: int) -> None:
    list(iter_entries(data))
    scan = scan_entries(data)
    derive_remote_indexes(data[: scan.valid_length], BASE)
    RemoteIndexSetBuilder.from_log_index(data[: scan.valid_length], BASE)
    decode_entry(data, min(pos, len(data)))


_LOG_INDEX = st.one_of(
    mutated(remote_set()[0]), mutated(remote_set()[0]).map(fix_entry_crcs), st.binary(max_size=300)
)


@fuzz_settings(3)
@given(_LOG_INDEX, st.integers(0, 700))
def test_remote_log_index_entries(data: bytes, pos: int) -> None:
    # scan_entries must never raise: it is how a torn tail is found and cut.
    scan = expect_clean(scan_entries, data)
    assert not isinstance(scan, Exception)
    expect_clean(read_remote_log_index, data, pos, located=True)


@st.composite
def remote_triples(draw: st.DrawFn) -> tuple[bytes, bytes, bytes]:
    # Mutate one or more files of the set: the lookups must notice that the files disagree.
    files = list(remote_set())
    for i in draw(st.sets(st.integers(0, 2), min_size=1)):
        files[i] = draw(mutated(files[i]).map(fix_entry_crcs) if i == 0 else mutated(files[i]))
    return files[0], files[1], files[2]


def remote_lookups(files: tuple[bytes, bytes, bytes], target: int) -> None:
    log, offsets, times = files
    offset_index = OffsetIndex(BASE, offsets, preallocated=False)
    time_index = TimeIndex(BASE, times, preallocated=False)
    find_entry_for_offset(offset_index, log, target)
    find_entry_for_timestamp(time_index, offset_index, log, max(0, target))


@fuzz_settings(3)
@given(remote_triples(), _TARGETS | st.integers(BASE - 5, BASE + 130))
def test_remote_index_lookups(files: tuple[bytes, bytes, bytes], target: int) -> None:
    expect_clean(remote_lookups, files, target, located=True)


def open_family(directory: Path, files: tuple[bytes, bytes, bytes], meta: bytes) -> None:
    suffixes = (".remotelogindex", ".remoteoffsetindex", ".remotetimeindex")
    for suffix, data in zip(suffixes, files, strict=True):
        (directory / f"{BASE:020d}{suffix}").write_bytes(data)
    (directory / "meta.json").write_bytes(meta)
    family = RemoteIndexFamily(directory, directory / "meta.json", rotate_bytes=1 << 20, rotate_ms=1 << 40)
    family.open()
    assert family.last_offset >= -1 and family.first_offset != -2
    for index_set in family.sets:
        index_set.entries()


_META = st.sampled_from((b'{"1000": 5}', b"[]", b'{"1000": Infinity}', b'{"x": 1}', b"")) | st.binary(
    max_size=30
)


@fuzz_settings(0.5, cap=1000)  # files on disk, fsynced
@given(remote_triples(), _META)
def test_remote_index_family_files_on_disk(files: tuple[bytes, bytes, bytes], meta: bytes) -> None:
    # What the daemon does at startup with the partition's remote index files (repairs included).
    with tempfile.TemporaryDirectory() as tmp:
        expect_clean(open_family, Path(tmp), files, meta)
