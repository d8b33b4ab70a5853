"""Shared helpers of the tiering acceptance tests: configs, the CLI as a subprocess, and one
independent checker of the invariants of docs/architecture.md §5 and docs/formats.md §5, §6.

The checker reads the store through the backend contract and the local index files through the
format readers only (never through the tiering engine), so an engine bug cannot hide itself.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlm.formats import naming
from rlm.formats.records import iter_batches
from rlm.formats.remote_index import RemoteLogIndexEntry, iter_entries
from rlm.formats.remote_index_derived import derive_remote_indexes
from rlm.logdir.scan import (
    SegmentFiles,
    discover_partitions,
    eligible_segments,
    list_segments,
    partition_state,
    read_checkpoints,
)
from rlm.storage.api import StorageBackend
from rlm.testing.toml import toml_value
from rlm.tiering import keys

REPO = Path(__file__).resolve().parents[2]


def write_config(
    path: Path,
    log_dirs: list[Path],
    *,
    root: Path | None = None,
    backend: str = "local",
    options: dict[str, Any] | None = None,
    eligibility: str = "high-watermark",
    server_port: int | None = None,
    topics: dict[str, Any] | None = None,
    cluster: dict[str, Any] | None = None,
    prefix_spread: int = 0,
    **tiering: Any,
) -> Path:
    """A TOML config; ``tiering`` values become ``[tiering]`` keys (gc_grace_ms defaults to 0),
    ``prefix_spread`` the ``[remote]`` key (docs/key-spread.md; 0 = not written),
    ``topics`` values ``[topics]`` keys (a dict value such as ``overrides`` becomes sub-tables),
    ``cluster`` values ``[cluster]`` keys (``leaders`` becomes the ``[cluster.leaders]`` table)."""
    tiering.setdefault("gc_grace_ms", 0)

    opts = dict(options) if options is not None else {"root": str(root)}
    lines = [
        "[log]",
        f"dirs = {toml_value([str(d) for d in log_dirs])}",
        f"eligibility = {toml_value(eligibility)}",
        "[remote]",
        f"backend = {toml_value(backend)}",
    ]
    lines += [f"prefix_spread = {prefix_spread}"] if prefix_spread else []
    lines += ["[remote.options]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in opts.items()]
    lines += ["[tiering]"] + [f"{k} = {toml_value(v)}" for k, v in tiering.items()]
    if server_port is not None:
        lines += ["[server]", f"port = {server_port}"]
    if topics:
        lines += ["[topics]"] + [f"{k} = {toml_value(v)}" for k, v in topics.items() if k != "overrides"]
        for pattern, table in (topics.get("overrides") or {}).items():
            lines += [f"[topics.overrides.{json.dumps(pattern)}]"]
            lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    if cluster:  # docs/cluster.md; a "leaders" dict becomes [cluster.leaders]
        lines += ["[cluster]"] + [f"{k} = {toml_value(v)}" for k, v in cluster.items() if k != "leaders"]
        if "leaders" in cluster:
            lines += ["[cluster.leaders]"] + [f"{json.dumps(k)} = {v}" for k, v in cluster["leaders"].items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def rlm_cli(
    *args: str | Path, env: dict[str, str] | None = None, timeout: float = 120, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m rlm ARGS`` as a real subprocess (never raises on a non-zero exit)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RLM_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "rlm", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=full_env,
        cwd=cwd or REPO,
    )


def roll_after_last(partition_dir: Path) -> int:
    """Add the empty next segment a broker roll leaves: ``<last offset + 1>.log``; return its base."""
    segments = list_segments(partition_dir)
    data = segments[-1].log.read_bytes()
    last = None
    for batch in iter_batches(data):
        last = batch
    assert last is not None, partition_dir
    base = last.last_offset + 1
    (partition_dir / naming.segment_file_name(base, naming.LOG)).write_bytes(b"")
    return base


def copy_partition_as(log_dir: Path, source: str, target: str) -> Path:
    """Copy partition dir ``source`` of ``log_dir`` to ``target`` (another topic's name), with its
    entries in the log dir's offset checkpoints; e.g. a compacted internal log as a user topic."""
    src_topic, _, partition = source.rpartition("-")
    dst_topic, _, dst_partition = target.rpartition("-")
    assert partition == dst_partition, (source, target)
    shutil.copytree(log_dir / source, log_dir / target)
    for name in (
        "replication-offset-checkpoint",
        "recovery-point-offset-checkpoint",
        "log-start-offset-checkpoint",
    ):
        path = log_dir / name
        if not path.exists():
            continue
        lines = path.read_text().splitlines()
        if len(lines) < 2:
            continue
        copies = [
            f"{dst_topic} {rest}"
            for line in lines[2:]
            for topic, _, rest in [line.partition(" ")]
            if topic == src_topic and rest.split(" ")[0] == partition
        ]
        body = lines[2:] + copies
        path.write_text("\n".join([lines[0], str(len(body)), *body]) + "\n")
    return log_dir / target


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# --- the checker ----------------------------------------------------------------------------------


@dataclass
class PartitionCheck:
    name: str
    manifests: list[dict[str, Any]] = field(default_factory=list)
    local_entries: list[RemoteLogIndexEntry] = field(default_factory=list)
    eligible_bases: list[int] = field(default_factory=list)
    set_bases: list[int] = field(default_factory=list)


@dataclass
class StoreCheck:
    partitions: dict[str, PartitionCheck]
    unreferenced: set[str]  # keys under */data/ that no manifest names

    def remote_bases(self, name: str) -> list[int]:
        return [m["base_offset"] for m in self.partitions[name].manifests]


def local_batches(segments: list[SegmentFiles], first: int, last: int) -> bytes | None:
    """The bytes of the local batches with base offsets in ``[first, last]``, or None unless they
    end exactly at ``last`` and none of the range was deleted locally."""
    out, covered_from, end = bytearray(), None, -1
    for seg in segments:
        data = seg.log.read_bytes()
        for b in iter_batches(data):
            if first <= b.base_offset <= last:
                covered_from = b.base_offset if covered_from is None else covered_from
                out += data[b.position : b.end_position]
                end = b.last_offset
    if covered_from is None or end != last or segments[0].base_offset > first:
        return None
    return bytes(out)


def _manifests(backend: StorageBackend, root: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for info in backend.list(f"{root}manifests/"):
        out.append((info.key, json.loads(backend.read(info.key))))
    return out


def check_store(
    log_dirs: list[Path],
    backend: StorageBackend,
    *,
    eligibility: str = "high-watermark",
    complete: bool = True,
    deep: bool = False,
    local_may_lag: bool = False,
    url_backend: StorageBackend | None = None,
    not_tiered: frozenset[str] = frozenset(),
) -> StoreCheck:
    """Assert every invariant; ``complete``: every eligible segment must be remote; ``deep``: compare
    uploaded bytes with the local .log and decode every entry's byte range; ``local_may_lag``: the
    local index may be a strict prefix of the committed entries (only right after a failed pass);
    ``url_backend``: the backend that wrote the RDIs (a wrapper names objects its own way);
    ``not_tiered``: topics the topic policy excludes (nothing of theirs may be remote).

    Retention may have removed a prefix of the remote segments; the local index must then start at
    the first remaining manifest.
    """
    referenced: set[str] = set()
    results: dict[str, PartitionCheck] = {}
    for part in discover_partitions(log_dirs):
        name = part.name
        pc = PartitionCheck(name)
        results[name] = pc
        segments = list_segments(part)
        state = partition_state(part, read_checkpoints(part.log_dir))
        eligible = eligible_segments(segments, state, eligibility)  # type: ignore[arg-type]
        if naming.is_internal_topic(part.topic) or part.topic in not_tiered:
            eligible = []  # Kafka's internal logs are never tiered: nothing may be remote
        pc.eligible_bases = [s.base_offset for s in eligible]

        # Remote: manifests parse, name their own base, and every object they name exists.
        remote_entries: list[RemoteLogIndexEntry] = []
        previous_last = -1
        # The incarnation's root: name-only, or <name>=<topic id>/ (docs/topic-identity.md).
        root = keys.root(part.topic, part.partition, part.topic_id)
        for key, doc in _manifests(backend, root):
            assert key == f"{root}manifests/{doc['base_offset']:020d}.json", key
            assert doc["format_version"] == 1
            assert doc["base_offset"] <= doc["last_offset"]
            assert doc["base_offset"] > previous_last, f"{key}: overlaps the previous segment"
            previous_last = doc["last_offset"]
            for obj in doc["objects"].values():
                assert backend.head(obj["key"]).size == obj["size"], f"{key}: object {obj['key']}"
                referenced.add(obj["key"])
            pc.manifests.append(doc)
            blob = backend.read(doc["objects"]["segment.remotelogindex"]["key"])
            entries = [d.entry for d in iter_entries(blob)]
            assert len(entries) == doc["index_entries"]
            log_key = doc["objects"]["log"]["key"]
            # Entries cover exactly the segment's bytes, back to back, and resolve to its log.
            position = 0
            for e in entries:
                assert (url_backend or backend).key_for_url(e.rdi.url) == log_key
                assert e.rdi.position == position
                position += e.data_length
            assert position == doc["size_bytes"] == doc["objects"]["log"]["size"]
            assert entries[0].first_offset >= doc["base_offset"]
            assert entries[-1].last_offset == doc["last_offset"]
            if deep:
                # The local log's batches of the same offsets (wherever this replica rolled).
                local = local_batches(segments, doc["base_offset"], doc["last_offset"])
                if local is not None:
                    assert backend.read(log_key) == local, f"{key}: bytes differ"
                for e in entries:
                    start, end = e.byte_range
                    batches = list(iter_batches(backend.read(log_key, start, end)))
                    assert batches[0].base_offset == e.first_offset
                    assert batches[-1].last_offset == e.last_offset
                    assert batches[-1].position + batches[-1].size == e.data_length
                    assert max(b.max_timestamp for b in batches) == e.last_timestamp
            remote_entries.extend(entries)

        # Local: every set CRC-valid, named after its first entry, derived files matching.
        sets = sorted(part.path.glob("*" + naming.REMOTE_LOG_INDEX))
        per_set: list[list[RemoteLogIndexEntry]] = []
        for path in sets:
            base = naming.parse_base_offset(path.name)
            buf = path.read_bytes()
            decoded = list(iter_entries(buf))  # CRC-verified, strict
            assert decoded, f"{path}: empty set left behind"
            assert decoded[0].entry.first_offset == base, path
            offset_bytes, time_bytes = derive_remote_indexes(buf, base)
            assert path.with_suffix(naming.REMOTE_OFFSET_INDEX).read_bytes() == offset_bytes, path
            assert path.with_suffix(naming.REMOTE_TIME_INDEX).read_bytes() == time_bytes, path
            pc.set_bases.append(base)
            per_set.append([d.entry for d in decoded])
            pc.local_entries.extend(d.entry for d in decoded)
        # Retention: entries of deleted segments may remain only in a set that still holds live
        # entries; a set entirely below the remote log start must be gone.
        remote_start = pc.manifests[0]["base_offset"] if pc.manifests else None
        for entries_of_set in per_set:
            assert remote_start is not None and entries_of_set[-1].last_offset >= remote_start, (
                f"{name}: a local set lies entirely below the remote log start {remote_start}"
            )
        live = [e for e in pc.local_entries if remote_start is not None and e.last_offset >= remote_start]
        # Exactly the committed segments, each once, in order: nothing lost, nothing twice.
        if local_may_lag:
            assert live == remote_entries[: len(live)], f"{name}: local index is not a committed prefix"
        else:
            assert live == remote_entries, f"{name}: local index != committed manifests"
        firsts = [e.first_offset for e in pc.local_entries]
        assert firsts == sorted(set(firsts))
        for a, b in itertools.pairwise(pc.local_entries):
            assert a.last_offset < b.first_offset, f"{name}: entries overlap"

        if complete:
            remote_bases = {m["base_offset"] for m in pc.manifests}
            first_remote = min(remote_bases, default=None)
            for seg in eligible:
                if seg.size == 0 or (first_remote is not None and seg.base_offset < first_remote):
                    continue
                assert seg.base_offset in remote_bases, f"{name}: eligible {seg.base_offset} not remote"
            # ... and nothing that was not eligible.
            assert remote_bases <= set(pc.eligible_bases), f"{name}: a non-eligible segment is remote"

    unreferenced = {
        info.key for info in backend.list("") if "/data/" in info.key and info.key not in referenced
    }
    return StoreCheck(results, unreferenced)


def assert_manifests_complete(backend: StorageBackend) -> set[str]:
    """What a reader may see right after a crash: every manifest parses and its objects exist.
    Returns the data keys no manifest references."""
    referenced = set()
    for info in backend.list(""):
        if "/manifests/" in info.key:
            doc = json.loads(backend.read(info.key))
            for obj in doc["objects"].values():
                assert backend.head(obj["key"]).size == obj["size"], f"{info.key}: {obj['key']} missing"
                referenced.add(obj["key"])
    return {i.key for i in backend.list("") if "/data/" in i.key and i.key not in referenced}


def local_index_files(log_dirs: list[Path]) -> dict[str, bytes]:
    """Every ``*.remote*`` file of the log dirs: relative path → bytes."""
    out = {}
    for d in log_dirs:
        for path in sorted(d.glob("*/*.remote*")):
            out[str(path.relative_to(d.parent))] = path.read_bytes()
    return out
