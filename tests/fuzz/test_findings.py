"""Regression tests for what the fuzz suite found, one per finding, named after it (docs/fuzzing.md)."""

from __future__ import annotations

import json
import mmap
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rlm.config import load_settings
from rlm.errors import CheckpointError, CompressionError, ConfigError, CorruptRecordError, FormatError
from rlm.formats.checkpoint import parse_leader_epoch_checkpoint, parse_offset_checkpoint
from rlm.formats.compression import MAX_DECOMPRESSED_BYTES, Compression, compress, decompress
from rlm.formats.indexes.remote_index import RemoteDataIdentifier, RemoteLogIndexEntry
from rlm.formats.records import RecordSpec, build_batch, decode_records, iter_batches
from rlm.storage.memory import MemoryBackend
from rlm.testing.daemon import rlm_cli
from rlm.tiering.expire.policy import TopicPolicyResolver
from rlm.tiering.local.index_family import RemoteIndexFamily
from rlm.tiering.local.journal import Journal, JournalEvent
from rlm.tiering.local.state import Progress
from rlm.tiering.store.manifest import SegmentManifest, StoredObject
from rlm.tiering.store.remote_state import RemoteState
from tests.formats.test_records import legacy_message
from tests.fuzz.bombs import BOMBS
from tests.fuzz.harness import fix_crcs

REPO = Path(__file__).resolve().parents[2]


def test_legacy_unknown_codec_error_names_position_and_offset() -> None:
    # Finding: a v0/v1 message with codec bits 5-7 raised CompressionError without a position or
    # offset, so `rlm dump` and the copier could not say where the bad message was.
    data = legacy_message(0, 1, None, b"v") + legacy_message(7, 0, None, b"x", attrs=7)
    with pytest.raises(CompressionError) as info:
        list(iter_batches(data))
    assert info.value.position == len(legacy_message(0, 1, None, b"v"))
    assert info.value.offset == 7
    assert "codec id 7" in str(info.value)


# Finding: a batch of 2 MiB (gzip), 8 MiB (lz4) or 64 KiB (zstd RLE blocks) inflated to 2 GiB and
# decode_records allocated ~4 GiB (output + copy) before the record framing failed. Measured in a
# fresh interpreter (tests/fuzz/bombs.py): peak RSS growth now stays near the 256 MiB limit for gzip
# (inflated incrementally up to it) and near nothing for the codecs whose framing bounds the output.
_RSS_BUDGET_KIB = {"gzip": (MAX_DECOMPRESSED_BYTES >> 10) * 7 // 4}


@pytest.mark.integration  # a fresh interpreter per bomb
@pytest.mark.parametrize("name", sorted(BOMBS))
def test_decompression_bomb_is_refused_with_bounded_memory(name: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.bombs", name],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    size, grown_kib, outcome = proc.stdout.split(" ", 2)
    assert int(size) < 9 << 20  # a small batch ...
    assert outcome.startswith("CompressionError: byte 0: offset 0: "), outcome  # ... refused, located
    assert int(grown_kib) < _RSS_BUDGET_KIB.get(name, 64 << 10), f"{name}: peak RSS grew {grown_kib} KiB"


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.SNAPPY], ids=lambda c: c.label)
def test_decompression_limit_is_exact_for_gzip_and_snappy(codec: Compression) -> None:
    data = compress(codec, b"x" * 5000)
    assert decompress(codec, data, max_size=5000) == b"x" * 5000
    with pytest.raises(CompressionError, match="over the limit of 4999 bytes"):
        decompress(codec, data, max_size=4999)


@pytest.mark.parametrize("codec", [Compression.LZ4, Compression.ZSTD], ids=lambda c: c.label)
def test_decompression_limit_bounds_lz4_and_zstd_by_their_framing(codec: Compression) -> None:
    # The bound is the framing's (a compressed block counts as its maximum size): a payload of
    # whole blocks is accepted at exactly its size, one byte less is refused before decoding.
    payload = b"y" * (256 << 10)  # 4 Kafka lz4 blocks of 64 KiB, 2 zstd blocks of 128 KiB
    data = compress(codec, payload)
    assert decompress(codec, data, max_size=len(payload)) == payload
    with pytest.raises(CompressionError, match="over the limit"):
        decompress(codec, data, max_size=len(payload) - 1)


@pytest.mark.parametrize("parse", [parse_offset_checkpoint, parse_leader_epoch_checkpoint])
def test_checkpoint_with_a_5000_digit_number_is_a_checkpoint_error(parse: Callable[[str], object]) -> None:
    # Finding: int() raised ValueError ("Exceeds the limit (4300 digits)") out of the parser.
    huge = "9" * 5000
    text = f"0\n1\norders 0 {huge}\n" if parse is parse_offset_checkpoint else f"0\n1\n0 {huge}\n"
    with pytest.raises(CheckpointError, match="line 3: malformed entry") as info:
        parse(text)
    assert info.value.position == 4
    with pytest.raises(CheckpointError, match="line 1: version"):
        parse(f"{huge}\n0\n")


def test_config_file_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    # Finding: a config file with a non-UTF-8 byte raised UnicodeDecodeError (a traceback at startup).
    path = tmp_path / "rlm.toml"
    path.write_bytes(b'[server]\nhost = "\x80"\n')
    with pytest.raises(ConfigError, match=r"rlm.toml is not UTF-8: byte 17"):
        load_settings(path, {})


def test_config_integer_past_4300_digits_is_a_config_error(tmp_path: Path) -> None:
    # Finding: tomllib raised a plain ValueError for an integer longer than Python's 4300-digit
    # limit, in the file and in an RLM_* override alike.
    path = tmp_path / "rlm.toml"
    path.write_bytes(b"[tiering]\nretention_ms = " + b"9" * 5000 + b"\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_settings(path, {})
    path.write_bytes(b"")
    with pytest.raises(ConfigError, match=r"config key tiering\.retention_ms = '999"):
        load_settings(path, {"RLM_TIERING__RETENTION_MS": "9" * 5000})


def _manifest_doc() -> dict[str, Any]:
    log = StoredObject("t/0/100.log", 4096, 1)
    m = SegmentManifest("t", 0, 100, 199, 5, 9, 4096, 7, 2, "a1", 11, {"log": log}, ((0, 0),))
    doc: dict[str, Any] = json.loads(m.to_json())
    return doc


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("last_offset", None, "manifest field last_offset = None: must be a non-negative integer"),
        ("max_timestamp", "9", "manifest field max_timestamp = '9': must be an integer"),
        ("topic", None, "manifest field topic = None: must be a string"),
        ("partition", True, "manifest field partition = True"),
        ("objects", {"index": {"key": "k", "size": 1, "crc32c": 2}}, "manifest field objects = "),
        ("objects", {"log": {"key": "k", "size": None, "crc32c": 2}}, "manifest field objects.log = "),
        ("leader_epochs", [[0, "x"]], "manifest field leader_epochs = "),
    ],
)
def test_manifest_with_a_mistyped_field_is_a_format_error(field: str, value: Any, says: str) -> None:
    # Finding: from_json accepted null / string / bool values for integer fields (and a missing
    # log object), and the copier, retention or lookups later failed with a TypeError.
    doc = _manifest_doc()
    doc[field] = value
    with pytest.raises(FormatError) as info:
        SegmentManifest.from_json(json.dumps(doc).encode(), key="t/0/100.manifest")
    assert str(info.value).startswith(f"t/0/100.manifest: {says}")


def test_manifest_nested_too_deeply_is_a_format_error() -> None:
    # Finding: json.loads raised RecursionError for 100 000 nested arrays.
    with pytest.raises(FormatError, match="m: malformed manifest: JSON nested too deeply"):
        SegmentManifest.from_json(b"[" * 100_000, key="m")
    with pytest.raises(FormatError, match="m: manifest is not a JSON object"):
        SegmentManifest.from_json(b"[1]", key="m")


_TORN_JOURNAL = [
    b'{"type": ["COPY_STARTED"], "base": 0, "attempt": "a", "at": 1}',  # unhashable type
    b'{"type": "COPY_STARTED", "base": Infinity, "attempt": "a", "at": 1}',  # OverflowError
    b'{"type": "COPY_STARTED", "base": 0, "attempt": "\x80", "at": 1}',  # bad UTF-8
    b"[" * 100_000,  # RecursionError
    b'{"type": "COPY_STARTED", "base": true, "attempt": "a", "at": 1}',  # a bool is not an offset
    b'{"type": "NOT_AN_EVENT", "base": 0, "attempt": "a", "at": 1}',
]


@pytest.mark.parametrize("bad", _TORN_JOURNAL, ids=range(len(_TORN_JOURNAL)))
def test_journal_line_of_any_shape_is_a_torn_line(tmp_path: Path, bad: bytes) -> None:
    # Finding: a journal line with a list "type", an Infinity offset, invalid UTF-8 or deep
    # nesting raised TypeError / OverflowError / UnicodeDecodeError / RecursionError out of
    # recovery; such a line is torn like any other and its neighbours are kept.
    good = b'{"type": "COPY_STARTED", "base": 7, "attempt": "b", "at": 2}'
    (tmp_path / "journal").write_bytes(bad + b"\n" + good + b"\n")
    assert Journal(tmp_path / "journal").open_attempts() == [JournalEvent("COPY_STARTED", 7, "b", 2)]


@pytest.mark.parametrize(
    "bad",
    [
        b'{"highest_tiered_offset": Infinity, "remote_log_start_offset": 0}',
        b"[" * 100_000,
        b"\x80",
        b"[1, 2]",
        b'{"highest_tiered_offset": 5.5, "remote_log_start_offset": 0}',
        b'{"highest_tiered_offset": 5, "remote_log_start_offset": 0, "delete_records_offset": null}',
    ],
)
def test_progress_file_of_any_shape_reads_as_nothing_tiered(tmp_path: Path, bad: bytes) -> None:
    # Finding: Progress.load raised OverflowError (Infinity) and RecursionError (deep nesting).
    (tmp_path / "progress.json").write_bytes(bad)
    assert Progress.load(tmp_path / "progress.json") == Progress()
    Progress(12, 3, 7).save(tmp_path / "progress.json")
    assert Progress.load(tmp_path / "progress.json") == Progress(12, 3, 7)
    (tmp_path / "progress.json").write_bytes(b'{"highest_tiered_offset": 5, "remote_log_start_offset": 0}')
    assert Progress.load(tmp_path / "progress.json") == Progress(5, 0, -1)  # written before DeleteRecords


@pytest.mark.parametrize("meta", [b"[]", b'{"1000": Infinity}', b"[" * 100_000, b'{"x": 1, "1000": "5"}'])
def test_remote_index_meta_of_any_shape_is_ignored(tmp_path: Path, meta: bytes) -> None:
    # Finding: RemoteIndexFamily.open raised AttributeError for a JSON list and OverflowError for
    # Infinity in meta.json (which only holds set creation times for rotation by age).
    (tmp_path / "meta.json").write_bytes(meta)
    family = RemoteIndexFamily(
        tmp_path, tmp_path / "meta.json", rotate_bytes=1 << 20, rotate_ms=1 << 40, clock_ms=lambda: 42
    )
    entry = RemoteLogIndexEntry(1000, 1009, 1, 2, 10, RemoteDataIdentifier("s3://b/k", 0))
    family.open()
    family.append_segment([entry])
    assert family.last_offset == 1009
    (tmp_path / "meta.json").write_bytes(meta)
    reopened = RemoteIndexFamily(
        tmp_path, tmp_path / "meta.json", rotate_bytes=1 << 20, rotate_ms=1 << 40, clock_ms=lambda: 77
    )
    reopened.open()
    assert [s.created_ms for s in reopened.sets] == [77]  # unreadable age: restarts now


def test_config_nested_too_deeply_is_a_config_error(tmp_path: Path) -> None:
    # Finding: tomllib raised RecursionError for 3000 nested arrays, in the file and in an override.
    path = tmp_path / "rlm.toml"
    path.write_bytes(b"x = " + b"[" * 3000)
    with pytest.raises(ConfigError, match=r"rlm\.toml is not valid TOML: nested too deeply"):
        load_settings(path, {})
    path.write_bytes(b"")
    with pytest.raises(ConfigError, match=r"config key server\.port = .*must be an integer"):
        load_settings(path, {"RLM_SERVER__PORT": "[" * 3000})


@pytest.mark.integration  # ends with `rlm dump` as a subprocess
def test_decode_records_error_leaves_an_mmap_closable(tmp_path: Path) -> None:
    # Finding: `rlm dump --records` on a segment with a corrupt compressed batch printed
    # "BufferError: cannot close exported pointers exist" instead of the error: the failed
    # decoder's frames (kept by the error) held a memoryview of the mapped file.
    spec = RecordSpec(1, None, b"v" * 100)
    batch = bytearray(build_batch([spec], base_offset=0, compression=Compression.ZSTD))
    batch[-3] ^= 0xFF
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(fix_crcs(bytes(batch)))
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        (parsed,) = iter_batches(mm)
        with pytest.raises(CompressionError) as info:
            decode_records(mm, parsed)
        error = info.value  # still referenced, as dump keeps it to report after the listing
        mm.close()  # would raise BufferError while a view is alive
    assert error.position == 0
    proc = rlm_cli("dump", "--records", path, timeout=60, cwd=REPO)
    assert proc.returncode == 1
    expected = f"rlm: error: {path}: byte 0: offset 0: zstd: cannot decompress"
    assert proc.stderr.startswith(expected), proc.stderr


@pytest.mark.integration  # `rlm dump` as a subprocess
def test_dump_of_a_non_utf8_checkpoint_names_the_file_and_byte(tmp_path: Path) -> None:
    # Finding: `rlm dump` read checkpoints with read_text, so a bad byte printed
    # "rlm: error: UnicodeDecodeError: ..." without the file; the parser now decodes and says where.
    path = tmp_path / "replication-offset-checkpoint"
    path.write_bytes(b"0\n1\n\x80 0 1\n")
    proc = rlm_cli("dump", path, timeout=60, cwd=REPO)
    assert proc.returncode == 1
    assert proc.stderr == f"rlm: error: {path}: byte 4: offset checkpoint is not UTF-8: invalid start byte\n"


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.ZSTD], ids=lambda c: c.label)
def test_record_count_beyond_the_bytes_present_is_refused_before_parsing(codec: Compression) -> None:
    # Hardening asked by issue #20: a header's record count is checked against the bytes present
    # (a record takes at least 7) before any record is parsed.
    batch = bytearray(build_batch([RecordSpec(1, None, b"v")] * 3, base_offset=5, compression=codec))
    struct.pack_into(">i", batch, 57, 2**31 - 1)
    data = fix_crcs(bytes(batch))
    (parsed,) = iter_batches(data)
    with pytest.raises(CorruptRecordError, match=r"record count 2147483647 cannot fit in \d+ bytes") as info:
        decode_records(data, parsed)
    assert info.value.offset == 5
    assert info.value.position == (61 if codec is Compression.NONE else 0)


def test_topic_policy_with_an_impossible_log_dir_path_is_not_an_oserror(tmp_path: Path) -> None:
    # Finding: a [log] dirs entry longer than the file system allows (here from an RLM_LOG__DIRS
    # override) made find_metadata_log / read_node_id raise OSError (ENAMETOOLONG) out of the
    # topic policy resolver; such a directory has no metadata log and no node id.
    path = tmp_path / "rlm.toml"
    path.write_bytes(b"")
    settings = load_settings(path, {"RLM_LOG__DIRS": "9" * 5000})
    resolver = TopicPolicyResolver(settings)
    assert resolver.metadata_dir is None and resolver.node_id is None
    assert resolver.policy("orders").tiered


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ("RLM_LOG__DIRS", "log.dirs"),
        ("RLM_TIERING__STATE_DIR", "tiering.state_dir"),
        ("RLM_TOPICS__METADATA_LOG_DIR", "topics.metadata_log_dir"),
    ],
)
def test_config_path_with_a_nul_byte_is_a_config_error(tmp_path: Path, env: str, key: str) -> None:
    # Finding: a NUL byte in a path (here from an RLM_* override) passed validation and the first
    # file-system call raised ValueError("embedded null byte") out of the topic policy resolver.
    path = tmp_path / "rlm.toml"
    path.write_bytes(b"")
    with pytest.raises(ConfigError, match=rf"config key {key} = .*: a path cannot contain a NUL byte"):
        load_settings(path, {env: "/data\x00x"})


def test_identity_marker_nested_too_deeply_is_a_format_error() -> None:
    # Finding (the manifest finding, checked in RemoteState.read_marker by hand): an owner.json /
    # retired.json object of 100 000 nested arrays in the store raised RecursionError.
    backend = MemoryBackend()
    backend.put("t-0/owner.json", b"[" * 100_000)
    with pytest.raises(FormatError, match=r"owner\.json: malformed marker object: JSON nested too deeply"):
        RemoteState(backend, "t", 0).read_marker("owner.json")
