"""Store sync (rlm/tiering/converge/sync.py): a second sidecar learns what another tiered, a lineage marker
cuts a segment mid-entry, the leader uncommits what is diverged, a rewind restores the index."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from pathlib import Path
from typing import Any

import pytest

from rlm.cli.generate import generate_log_dir
from rlm.config import load_settings
from rlm.formats.checkpoint import parse_leader_epoch_checkpoint
from rlm.formats.indexes.remote_index import iter_entries
from rlm.formats.partition_metadata import format_partition_metadata
from rlm.formats.records import iter_batches
from rlm.logdir.discovery import list_segments
from rlm.storage.local import LocalBackend
from rlm.storage.spread import open_spread
from rlm.testing.configs import write_config
from rlm.tiering.converge.sync import sync_partition
from rlm.tiering.local.metrics import TieringMetrics
from rlm.tiering.local.remote_root import of_context
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read.readers import TieredReaders
from rlm.tiering.store import object_keys
from rlm.tiering.store.lineage import LineageMarker
from rlm.tiering.store.manifest import ENTRIES_OBJECT
from tests.tiering.helpers import local_index_files

TOPIC = "sync"


def _replicas(tmp_path: Path) -> tuple[Path, Path, Path]:
    a = tmp_path / "a"
    generate_log_dir(a, [(TOPIC, 1)], seed=11, records=600, segment_bytes=8 * 1024)
    b = tmp_path / "b"
    shutil.copytree(a, b)
    return a, b, tmp_path / "store"


def _manager(
    tmp_path: Path,
    name: str,
    log_dir: Path,
    store: Path,
    *,
    trust: bool = True,
    spread: int = 0,
    cluster: dict[str, Any] | None = None,
) -> RemoteLogManager:
    cfg = write_config(
        tmp_path / f"{name}.toml",
        [log_dir],
        root=store,
        index_entry_bytes=2048,
        trust_local_state=trust,
        prefix_spread=spread,
        cluster=cluster,
    )
    backend = open_spread(LocalBackend(root=str(store)), spread)  # docs/key-spread.md
    return RemoteLogManager(load_settings(cfg), backend, metrics=TieringMetrics())


def _index_files(log_dir: Path) -> dict[str, bytes]:
    return {k.split("/", 1)[1]: v for k, v in local_index_files([log_dir]).items()}


def _served(mgr: RemoteLogManager) -> dict[int, bytes]:
    """Offset → bytes of the batch the local index serves it from (read from the store)."""
    ctx = next(mgr.contexts())
    remote, out = of_context(ctx), {}
    for index_set in ctx.family.sets:
        for decoded in index_set.entries():
            e = decoded.entry
            key = mgr.store.key_for_url(e.rdi.url)
            data = remote.read_range(key, e.rdi.position, e.rdi.position + e.data_length)
            for batch in iter_batches(data):
                out[batch.base_offset] = bytes(data[batch.position : batch.position + batch.size])
    return out


def _local_batches(part: Path) -> dict[int, Any]:
    found = {}
    for seg in list_segments(part):
        data = seg.log.read_bytes()
        for batch in iter_batches(data):
            found[batch.base_offset] = (batch, bytes(data[batch.position : batch.position + batch.size]))
    return found


@pytest.mark.parametrize("spread", [0, 2])
def test_a_second_sidecar_learns_everything_and_a_marker_cuts_mid_entry(tmp_path: Path, spread: int) -> None:
    a_dir, b_dir, store = _replicas(tmp_path)
    a = _manager(tmp_path, "a", a_dir, store, spread=spread)
    a.run_once()
    b = _manager(tmp_path, "b", b_dir, store, spread=spread)
    b.run_once()  # B finds everything committed: it uploads nothing and indexes all of it
    assert _index_files(a_dir) == _index_files(b_dir) != {}
    local = _local_batches(a_dir / f"{TOPIC}-0")
    served = _served(b)
    assert served and all(served[o] == local[o][1] for o in served)

    # An unclean election: the new leader's lineage says epoch 7 starts at T, in the middle of a
    # remote index entry of a segment that is not the last one.
    ctx_b = next(b.contexts())
    links = ctx_b.store.chain.links
    assert len(links) >= 3
    seg = links[1].manifest
    inside = sorted(o for o in local if seg.base_offset < o <= seg.last_offset)
    cut = inside[len(inside) // 2]
    lineage = (*((e, s) for e, s in seg.leader_epochs if s < cut), (7, cut))
    of_context(ctx_b).create_lineage_marker(LineageMarker(7, lineage, cut, 3, 0))
    marker = object_keys.lineage_marker_key(TOPIC, 0, 7, ctx_b.key_id)
    head = hashlib.sha256(f"{TOPIC}-0".encode()).hexdigest()[:spread] + "/" if spread else ""
    assert (store / f"{head}{marker}").is_file()  # stored under the partition's hash prefix

    result = sync_partition(ctx_b, leader=False)
    assert result.chain.highest == cut - 1 and result.rebuilt_from == seg.base_offset  # that link re-indexed
    assert ctx_b.family.last_offset == cut - 1
    served = _served(b)
    assert max(served) < cut and all(served[o] == local[o][1] for o in served)
    assert set(served) == {o for o in local if o < cut}
    assert result.uncommitted == ()  # a follower never deletes
    bases = {m.base_offset for m in ctx_b.store.chain.manifests}
    assert bases == {lk.manifest.base_offset for lk in links if lk.manifest.base_offset <= seg.base_offset}

    # The leader (A) uncommits the wholly diverged segments; the cut one stays, served up to T-1.
    ctx_a = next(a.contexts())
    result = sync_partition(ctx_a, leader=True)
    later = [lk.manifest.base_offset for lk in links if lk.manifest.base_offset > seg.base_offset]
    assert sorted(result.uncommitted) == later
    remote_a = of_context(ctx_a)
    remaining = {b for b, _ in remote_a.manifest_keys(remote_a.list_manifests_prefix())}
    assert remaining == bases
    assert ctx_a.family.last_offset == cut - 1


def test_restart_checks_local_entries_and_rewinds_only_what_differs(tmp_path: Path) -> None:
    a_dir, _b_dir, store = _replicas(tmp_path)
    a = _manager(tmp_path, "a", a_dir, store)
    a.run_once()
    before = local_index_files([a_dir])
    # A fresh process over the same dirs: the local entries match the chain, nothing is rewritten.
    again = _manager(tmp_path, "a", a_dir, store)
    again.run_once()
    assert local_index_files([a_dir]) == before
    # Someone replaced the newest manifest with another attempt of the same segment: the local
    # entries of that segment name the old object, so recovery re-indexes from there only.
    ctx = next(again.contexts())
    assert ctx.manifests  # a trusted restart parses its manifest snapshot on first use
    newest = ctx.store.chain.links[-1].manifest
    older = [
        d.entry for s in ctx.family.sets for d in s.entries() if d.entry.last_offset < newest.base_offset
    ]
    remote = of_context(ctx)
    key = object_keys.manifest_key(TOPIC, 0, newest.base_offset, ctx.key_id)
    moved = newest.log.key.replace(newest.attempt_id, "0000000000000-beef")
    doc = newest.to_json().replace(newest.attempt_id.encode(), b"0000000000000-beef")
    for name, obj in newest.objects.items():
        data = ctx.shared.backend.read(obj.key)
        if name == ENTRIES_OBJECT:  # a real attempt's entries name its own object
            data = b"".join(
                dataclasses.replace(
                    d.entry,
                    rdi=dataclasses.replace(
                        d.entry.rdi, url=d.entry.rdi.url.replace(newest.attempt_id, "0000000000000-beef")
                    ),
                ).encode()
                for d in iter_entries(data)
            )
        ctx.shared.backend.put(obj.key.replace(newest.attempt_id, "0000000000000-beef"), data)
    remote.delete(key)
    ctx.shared.backend.put(key, doc)
    # A restart trusting its local state would not look (docs/remote-state.md): recover from the
    # store, as cluster mode, a failed pass or `trust_local_state = false` do.
    third = _manager(tmp_path, "a", a_dir, store, trust=False)
    third.run_once()
    ctx3 = next(third.contexts())
    assert ctx3.store.chain.links[-1].manifest.log.key == moved
    entries = [d.entry for s in ctx3.family.sets for d in s.entries()]
    assert entries[-1].rdi.url.endswith(moved)
    assert all(not e.rdi.url.endswith(newest.log.key) for e in entries)
    assert ctx3.family.last_offset == newest.last_offset
    assert [e for e in entries if e.last_offset < newest.base_offset] == older != []


def test_restart_keeps_the_local_index_of_a_partition_with_a_topic_id(tmp_path: Path) -> None:
    # Every KRaft partition has a topic id, so its keys hold "=" (`t-0=<id>/...`), which an object
    # URL percent-encodes: the restart check must compare keys, not the URL's text (found beside a
    # live cluster, where every sidecar restart re-indexed every segment from offset 0).
    a_dir, _b_dir, store = _replicas(tmp_path)
    topic_id = "AAAAAAAAAAAAAAAAAAAAAQ"
    (a_dir / f"{TOPIC}-0" / "partition.metadata").write_bytes(format_partition_metadata(topic_id))
    _manager(tmp_path, "a", a_dir, store).run_once()
    before = local_index_files([a_dir])
    again = _manager(tmp_path, "a", a_dir, store, trust=False)
    again.run_once()
    ctx = next(again.contexts())
    assert ctx.key_id == topic_id and "%3D" in ctx.family.sets[0].entries()[0].entry.rdi.url
    ctx.store.held = None  # what a restart knows of its local index: nothing but the files
    result = sync_partition(ctx, leader=False)
    assert (result.rebuilt_from, result.appended_links) == (None, 0)
    assert local_index_files([a_dir]) == before


def test_a_replica_whose_own_log_left_the_lineage_serves_nothing_from_there(tmp_path: Path) -> None:
    # Live: an old leader took acks=1 writes alone, tiered them and died; the stale follower was
    # elected uncleanly and its sidecar wrote a marker. The old leader's sidecar, back before its
    # broker (which truncates only when it rejoins), served those records from its own log — and,
    # reading its dead broker's last metadata, which names it leader, would copy them again.
    a_dir, b_dir, store = _replicas(tmp_path)
    a = _manager(tmp_path, "a", a_dir, store)
    a.run_once()
    checkpoint = b_dir / f"{TOPIC}-0" / "leader-epoch-checkpoint"
    middle = parse_leader_epoch_checkpoint(checkpoint.read_text()).entries[1].start_offset // 2
    cut = min(b for b in _local_batches(b_dir / f"{TOPIC}-0") if b >= middle)  # epochs start a batch
    of_context(next(a.contexts())).create_lineage_marker(LineageMarker(7, ((0, 0), (7, cut)), cut, 3, 0))
    stale_leader = {"leadership": "static", "node_id": 2, "leaders": {f"{TOPIC}-0": 2}}
    b = _manager(tmp_path, "b", b_dir, store, cluster=stale_leader)
    (result,) = b.run_once()
    assert result.error is None and result.copied == []  # its records past the cut are not copied
    live = TieredReaders(b.settings, LocalBackend(root=str(store)), progress=b.live_progress)
    persisted = TieredReaders(b.settings, LocalBackend(root=str(store)))  # a CLI reader beside it
    for readers in (live, persisted):
        reader = readers.reader(TOPIC, 0)
        assert reader.lookup_offset(cut - 1).found and not reader.lookup_offset(cut).found
        ranges = reader.offsets()
        assert (ranges.visible_end_offset, ranges.high_watermark_source) == (cut, "diverged")
        assert ranges.high_watermark is not None and ranges.high_watermark > cut
    assert [r["local_diverged_from_offset"] for r in b.status()] == [cut]
    # its broker rejoins: once its checkpoint is the lineage's, the next pass serves to its HW again
    checkpoint.write_text(f"0\n2\n0 0\n7 {cut}\n")
    b.run_once()
    assert [r["local_diverged_from_offset"] for r in b.status()] == [None]
    assert live.reader(TOPIC, 0).offsets().high_watermark_source == "checkpoint"
