"""Fuzz the text formats rlm reads: Kafka checkpoints and partition.metadata, segment manifests,
config files and env overrides, and the state files rlm reads back (journal lines, progress.json).

Seeds: checkpoints written by rlm's formatter and LogWriter plus the real broker ones, a manifest
from ``SegmentManifest.to_json``, the repo's own configs/*.toml.
"""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from rlm.config import load_settings
from rlm.errors import PartitionMetadataError
from rlm.formats.checkpoint import (
    EpochEntry,
    format_leader_epoch_checkpoint,
    format_offset_checkpoint,
    parse_leader_epoch_checkpoint,
    parse_offset_checkpoint,
)
from rlm.formats.partition_metadata import (
    format_partition_metadata,
    parse_partition_metadata,
    validate_topic_id,
)
from rlm.logdir.discovery import read_topic_id
from rlm.tiering.expire.policy import TopicPolicyResolver
from rlm.tiering.local.journal import Journal
from rlm.tiering.local.state import Progress
from rlm.tiering.store.manifest import SegmentManifest, StoredObject
from tests.fuzz.harness import expect_clean, fuzz_settings, mutated
from tests.fuzz.seeds import fixture_files

REPO = Path(__file__).resolve().parents[2]
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@functools.cache
def checkpoint_seeds() -> list[bytes]:
    seeds = [
        format_offset_checkpoint({("orders", 0): 12, ("a.b_c-d", 17): 2**62}).encode(),
        format_leader_epoch_checkpoint([EpochEntry(0, 0), EpochEntry(3, 1234)]).encode(),
    ]
    seeds += [
        data
        for name, data in sorted(fixture_files("checkpoint", max_bytes=4096, limit=40).items())
        if not name.endswith(".checkpoint")
    ][:8]  # skip KRaft snapshots (binary, fuzzed as logs)
    return seeds


def read_checkpoint(data: bytes, as_text: bool) -> None:
    text: str | bytes = data.decode("utf-8", "replace") if as_text else data
    for parse in (parse_offset_checkpoint, parse_leader_epoch_checkpoint):
        try:
            parse(text)
        except Exception as err:  # each parser on its own: both must only raise CheckpointError
            from rlm.errors import CheckpointError

            if not isinstance(err, CheckpointError):
                raise


_DIGITS = st.integers(21, 6000).map(lambda n: "9" * n)


@fuzz_settings(3)
@given(
    st.sampled_from(checkpoint_seeds()).flatmap(mutated)
    | st.binary(max_size=300)
    | _DIGITS.map(lambda d: f"0\n1\norders 0 {d}\n".encode()),
    st.booleans(),
)
def test_checkpoints(data: bytes, as_text: bool) -> None:
    expect_clean(read_checkpoint, data, as_text)


# --- manifests ----------------------------------------------------------------------------------


@functools.cache
def manifest_seed() -> bytes:
    m = SegmentManifest(
        "orders",
        3,
        100,
        199,
        1_700_000_000_000,
        1_700_000_001_000,
        4096,
        7,
        2,
        "a1b2",
        1_700_000_002_000,
        {"log": StoredObject("t/3/100.log", 4096, 123), "index": StoredObject("t/3/100.idx", 64, 9)},
        ((0, 0), (2, 150)),
        extra={"future_field": [1, 2]},
    )
    return m.to_json()


def use_manifest(data: bytes) -> None:
    """Parse, then touch what the copier, retention, lookups and verify read."""
    m = SegmentManifest.from_json(data, key="t/3/100.manifest")
    m.log.size + m.log.crc32c, m.next_offset, m.size_bytes + m.record_batches + m.created_ms
    m.same_segment_as(m), sorted(m.objects), [e + o for e, o in m.leader_epochs]
    m.max_timestamp - m.first_timestamp, m.attempt_id.encode(), m.topic.encode(), m.partition + 1
    SegmentManifest.from_json(m.to_json())


@st.composite
def manifest_docs(draw: st.DrawFn) -> bytes:
    doc = json.loads(manifest_seed())
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(sorted(doc)))
        if draw(st.booleans()):
            doc[key] = draw(_JSON)
        elif key == "objects" and isinstance(doc[key], dict) and doc[key]:
            obj = draw(st.sampled_from(sorted(doc[key])))
            doc[key][obj] = draw(_JSON)
        else:
            del doc[key]
    return json.dumps(doc).encode()


@fuzz_settings(3)
@given(
    manifest_docs()
    | mutated(manifest_seed())
    | st.binary(max_size=200)
    | st.integers(1, 100_000).map(lambda n: b"[" * n)
)
def test_manifests(data: bytes) -> None:
    expect_clean(use_manifest, data)


# --- config files and environment overrides -------------------------------------------------------


_TOPICS_SECTION = b"""
[topics]
include = ["*", "__consumer_offsets"]
exclude = ["scratch-*", "[a-"]
follow_kafka_configs = false

[topics.overrides."audit-*"]
retention_ms = 31536000000
retention_bytes = -1

[topics.overrides."cdc.*"]
archive_compacted = true
enabled = false
"""


@functools.cache
def config_seeds() -> list[bytes]:
    repo = [p.read_bytes() for p in sorted((REPO / "configs").glob("*.toml"))]
    return [*repo, repo[0] + _TOPICS_SECTION]  # the [topics] policy (docs/topic-policy.md)


_ENV = st.dictionaries(
    st.sampled_from(
        (
            "RLM_TIERING__RETENTION_MS",
            "RLM_LOG__DIRS",
            "RLM_SERVER__PORT",
            "RLM_LOG",
            "RLM___",
            "RLM_REMOTE__OPTIONS__X",
            "RLM_TIERING__X__Y",
            "RLM_SERVER__TOKEN",
            "RLM_A__B",
        )
    )
    | st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ_", max_size=20).map(lambda s: "RLM_" + s),
    st.text(max_size=20) | st.sampled_from(("[1,", "inf", "nan", "9" * 5000, "{a=1}", "[[1]]", '"x"')),
    max_size=3,
)


def load_config(text: bytes, environ: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rlm.toml"
        path.write_bytes(text)
        settings = load_settings(path, environ)
    # What the engine does with a valid configuration's topic policy: resolve some topics.
    resolver = TopicPolicyResolver(settings)
    for topic in ("orders", "audit-1", "cdc.users", "scratch-9", "__consumer_offsets", "[a-"):
        resolver.policy(topic)


@fuzz_settings(3)
@given(
    st.sampled_from(config_seeds()).flatmap(lambda s: mutated(s, max_ops=3))
    | st.binary(max_size=200)
    | st.integers(1, 3000).map(lambda n: b"x = " + b"[" * n)
    | st.just(b"[tiering]\nretention_ms = " + b"9" * 5000),
    _ENV,
)
def test_config_files_and_env(text: bytes, environ: dict[str, str]) -> None:
    expect_clean(load_config, text, environ)


# --- state files rlm reads back ---------------------------------------------------------------------


def _journal_line(doc: Any) -> str:
    return json.dumps(doc)


@st.composite
def journal_texts(draw: st.DrawFn) -> bytes:
    good = {"type": "COPY_STARTED", "base": 0, "attempt": "a", "at": 1}
    lines = []
    for _ in range(draw(st.integers(0, 5))):
        doc = dict(good)
        if draw(st.booleans()):
            doc[draw(st.sampled_from(sorted(good)))] = draw(_JSON)
        lines.append(json.dumps(doc))
    text = ("\n".join(lines) + "\n").encode()
    return draw(
        st.just(text)
        | mutated(text)
        | st.sampled_from(
            (b'{"type": "COPY_STARTED", "base": Infinity, "attempt": "a", "at": 1}\n', b"[" * 50_000 + b"\n")
        )
    )


def read_state(directory: Path, journal: bytes, progress: bytes) -> None:
    (directory / "journal.jsonl").write_bytes(journal)
    (directory / "progress.json").write_bytes(progress)
    Journal(directory / "journal.jsonl").open_attempts()
    Progress.load(directory / "progress.json")


@fuzz_settings(2)
@given(
    journal_texts(),
    _JSON.map(lambda d: json.dumps(d).encode())
    | st.sampled_from((b'{"highest_tiered_offset": Infinity, "remote_log_start_offset": 0}', b"[" * 50_000)),
)
def test_journal_and_progress(journal: bytes, progress: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        expect_clean(read_state, Path(tmp), journal, progress)


# --- partition.metadata (docs/topic-identity.md) ---------------------------------------------------


@functools.cache
def partition_metadata_seeds() -> list[bytes]:
    seeds = [
        format_partition_metadata("h21Hd1FxRjC-20k1lF5oYA"),
        b"version: 0\ntopic_id: tN6Lm1YVQuaKXNYm9RWOVg\n",
    ]
    return seeds + list(fixture_files("partition.metadata", max_bytes=200, limit=4).values())


def read_partition_metadata(data: bytes) -> None:
    """The parser, then the file-level read discovery does (which must name the file)."""
    try:
        validate_topic_id(parse_partition_metadata(data).topic_id)
    except PartitionMetadataError as err:
        assert err.reason
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "partition.metadata").write_bytes(data)
        try:
            read_topic_id(Path(tmp))
        except PartitionMetadataError as err:
            assert "partition.metadata" in str(err)


@fuzz_settings(3)
@given(
    st.sampled_from(partition_metadata_seeds()).flatmap(mutated)
    | st.binary(max_size=200)
    | st.text(alphabet="version:topic_id 0123456789AaZz_-\n\r\t", max_size=80).map(str.encode)
)
def test_partition_metadata(data: bytes) -> None:
    expect_clean(read_partition_metadata, data)
