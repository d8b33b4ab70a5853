"""Compression and envelope encryption of what rlm stores (docs/protection.md), on the local
backend: nothing stored is plaintext, compressible data shrinks, everything reads back
byte-identical from the remote tier, rotation, mixing with plaintext segments, lookup cost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlm.errors import KeyNotFoundError, TamperedObjectError
from rlm.formats.indexes.remote_index import (
    STORED_ENTRY_MAGIC,
    TRANSFORM_AES_GCM,
    TRANSFORM_ZSTD,
    iter_entries,
)
from rlm.formats.records import iter_batches
from rlm.storage.local import LocalBackend
from rlm.storage.memory import MemoryBackend
from rlm.testing.counting import CountingBackend
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.read.readers import TieredReaders
from rlm.tiering.store.keyring import KeyRing
from rlm.tiering.store.rewrap import rewrap_store
from tests.lookup.helpers import BruteLog, delete_local_segments
from tests.protection.helpers import (
    TOPIC,
    key_file,
    plaintext_found,
    settings,
    stored_objects,
    write_secrets,
)


def _tier(s, backend) -> None:  # type: ignore[no-untyped-def]
    results = RemoteLogManager(s, backend).run_once()
    assert all(r.error is None for r in results) and results[0].copied, results


def _read_all(readers: TieredReaders, brute: BruteLog, start: int, end: int) -> bytes:
    """Every batch from ``start`` while below ``end`` through fetches (1 KiB at a time, so answers
    cross entries and segments), joined."""
    reader = readers.reader(TOPIC, 0)
    out, offset = [], start
    while offset < end:
        got = reader.fetch(offset, 1024)
        assert got.batches, offset
        out.append(bytes(got.data))
        offset = got.batches[-1].last_offset + 1
    return b"".join(out)


def _expected(brute: BruteLog, start: int, end: int) -> bytes:
    return b"".join(b.data for b in brute.batches if start <= b.batch.base_offset < end)


def test_nothing_stored_is_plaintext_and_everything_reads_back(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    brute = write_secrets(logs)
    keys = {"k1": key_file(tmp_path / "keys", "k1")}
    s = settings(tmp_path, logs, keys=keys, active="k1")
    backend = LocalBackend(root=str(tmp_path / "store"))
    _tier(s, backend)

    objects = stored_objects(backend)
    assert plaintext_found(objects, brute) == []
    manifests = [json.loads(v) for k, v in objects.items() if "/manifests/" in k]
    assert len(manifests) >= 5
    for m in manifests:
        assert m["protection"]["encryption"]["key_id"] == "k1" and m["protection"]["compression"] == "zstd"
        assert m["objects"]["log"]["size"] == len(objects[m["objects"]["log"]["key"]])
    # every local entry is stored transformed: encrypted, and compressed (entries mixing gzip'd and
    # plain batches are compressed too; test_formats checks the all-compressed rule)
    local = [
        d.entry
        for p in sorted((logs / f"{TOPIC}-0").glob("*.remotelogindex"))
        for d in iter_entries(p.read_bytes())
    ]
    assert local and all(e.magic == STORED_ENTRY_MAGIC and e.transform & TRANSFORM_AES_GCM for e in local)
    assert any(e.transform & TRANSFORM_ZSTD for e in local)

    deleted = delete_local_segments(logs / f"{TOPIC}-0")
    end = brute.records[-1].offset + 1
    local_start = max(deleted) + 1
    readers = TieredReaders(s, LocalBackend(root=str(tmp_path / "store")))
    remote_start = brute.records[0].offset
    got = _read_all(readers, brute, remote_start, end)
    assert got == _expected(brute, remote_start, end)
    assert readers.reader(TOPIC, 0).lookup_offset(0).tier == "remote"
    reader = readers.reader(TOPIC, 0)
    for rec in brute.records[:local_start:37]:
        found = reader.lookup_timestamp(rec.timestamp)
        assert found.found and found.offset == rec.offset and found.tier == "remote"


def test_the_plaintext_check_sees_an_unprotected_store(tmp_path: Path) -> None:
    """The control of the test above: without protection the same search finds the records."""
    logs = tmp_path / "logs"
    brute = write_secrets(logs, batches=40)
    backend = LocalBackend(root=str(tmp_path / "store"))
    _tier(settings(tmp_path, logs, codec=None), backend)
    assert any(k.endswith("segment.log") for k in plaintext_found(stored_objects(backend), brute))


@pytest.mark.parametrize("encrypt", [False, True])
def test_compressible_data_stores_at_most_half(tmp_path: Path, encrypt: bool) -> None:
    logs = tmp_path / "logs"
    write_secrets(logs)
    keys = {"k1": key_file(tmp_path / "keys", "k1")} if encrypt else None
    s = settings(tmp_path, logs, keys=keys, active="k1" if encrypt else None)
    backend = LocalBackend(root=str(tmp_path / "store"))
    _tier(s, backend)
    objects = stored_objects(backend)
    manifests = [json.loads(v) for k, v in objects.items() if "/manifests/" in k]
    plaintext = sum(m["size_bytes"] for m in manifests)
    stored = sum(len(v) for k, v in objects.items() if "/data/" in k)  # every object of every segment
    assert stored <= 0.5 * plaintext, (stored, plaintext)


def test_rotation_keeps_old_segments_readable(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    brute = write_secrets(logs, batches=240)
    keys = {"old": key_file(tmp_path / "keys", "old"), "new": key_file(tmp_path / "keys", "new")}
    store = LocalBackend(root=str(tmp_path / "store"))
    segments = sorted((logs / f"{TOPIC}-0").glob("*.log"))
    half = segments[len(segments) // 2]
    hidden = [p for p in segments if p.name >= half.name]
    moved = {p: p.with_name(p.name + ".later") for p in hidden[1:]}
    for p, q in moved.items():  # only the first half is rolled while "old" is active
        p.rename(q)
    _tier(settings(tmp_path, logs, keys={"old": keys["old"]}, active="old"), store)
    for p, q in moved.items():
        q.rename(p)
    s = settings(tmp_path, logs, keys=keys, active="new")
    _tier(s, store)

    ids = {
        json.loads(v)["protection"]["encryption"]["key_id"]
        for k, v in stored_objects(store).items()
        if "/manifests/" in k
    }
    assert ids == {"old", "new"}
    delete_local_segments(logs / f"{TOPIC}-0")
    end = brute.records[-1].offset + 1
    start = brute.records[0].offset
    assert _read_all(TieredReaders(s, store), brute, start, end) == _expected(brute, start, end)

    # without the old key the old segments cannot be opened: one error naming the key id
    only_new = settings(tmp_path, logs, keys={"new": keys["new"]}, active="new")
    with pytest.raises(KeyNotFoundError) as err:
        TieredReaders(only_new, store).reader(TOPIC, 0).fetch(0, 1024)
    text = str(err.value)
    # the first thing the lost key stops is the check of the segment's manifest (its MAC)
    assert "'old'" in text and f"{TOPIC}-0 segment 0" in text and "manifests/" in text
    assert "\n" not in text


def test_plaintext_and_protected_segments_mix(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    brute = write_secrets(logs, batches=200)
    store = LocalBackend(root=str(tmp_path / "store"))
    segments = sorted((logs / f"{TOPIC}-0").glob("*.log"))
    later = {p: p.with_name(p.name + ".later") for p in segments[len(segments) // 2 + 1 :]}
    for p, q in later.items():
        p.rename(q)
    _tier(settings(tmp_path, logs, codec=None), store)  # an existing plaintext store
    for p, q in later.items():
        q.rename(p)
    keys = {"k": key_file(tmp_path / "keys", "k")}
    s = settings(tmp_path, logs, keys=keys, active="k")
    _tier(s, store)  # copying goes on: it trusts its own journal, not the older manifests
    # ... but the plaintext manifests carry no MAC: a reader with keys refuses them by name until
    # `rlm rewrap --authenticate` trusts them once (docs/protection.md §9)
    # (this host's own index of them is trusted: a view built from the store is not)
    delete_local_segments(logs / f"{TOPIC}-0")
    with pytest.raises(TamperedObjectError, match="rlm rewrap --authenticate"):
        RemoteLogManager(s, store).rebuild_index()
    ring = KeyRing.from_settings(s.remote.encryption)
    assert ring is not None and rewrap_store(store, ring, "k", authenticate=True).authenticated > 0
    RemoteLogManager(s, store).rebuild_index()
    manifests = [json.loads(v) for k, v in stored_objects(store).items() if "/manifests/" in k]
    assert {"protection" in m for m in manifests} == {True, False}
    entries = [
        d.entry
        for p in sorted((logs / f"{TOPIC}-0").glob("*.remotelogindex"))
        for d in iter_entries(p.read_bytes())
    ]
    assert {e.magic for e in entries} == {0, 1}
    start, end = brute.records[0].offset, brute.records[-1].offset + 1
    assert _read_all(TieredReaders(s, store), brute, start, end) == _expected(brute, start, end)


def test_a_tampered_entry_never_yields_bytes(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_secrets(logs)
    keys = {"k1": key_file(tmp_path / "keys", "k1")}
    s = settings(tmp_path, logs, keys=keys, active="k1")
    _tier(s, LocalBackend(root=str(tmp_path / "store")))
    delete_local_segments(logs / f"{TOPIC}-0")
    log_obj = sorted((tmp_path / "store").rglob("segment.log"))[0]
    data = bytearray(log_obj.read_bytes())
    data[100] ^= 0x01
    log_obj.write_bytes(bytes(data))
    with pytest.raises(TamperedObjectError) as err:
        TieredReaders(s, LocalBackend(root=str(tmp_path / "store"))).reader(TOPIC, 0).fetch(0, 1024)
    text = str(err.value)
    assert "segment.log" in text and "offset 0" in text and "'k1'" in text and "authentication" in text


@pytest.mark.parametrize(("encrypt", "shared"), [(False, False), (True, False), (True, True)])
def test_a_lookup_costs_one_ranged_get(tmp_path: Path, encrypt: bool, shared: bool) -> None:
    """A remote lookup reads one entry with one ranged GET. An encrypted segment's manifest (its
    wrapped data key) is read once per segment and process — and not at all by readers sharing the
    copier's StoreProtection, as the daemon's do (rlm/cli/wiring.py)."""
    logs = tmp_path / "logs"
    brute = write_secrets(logs)
    keys = {"k1": key_file(tmp_path / "keys", "k1")} if encrypt else None
    s = settings(tmp_path, logs, keys=keys, active="k1" if encrypt else None, backend="memory", options={})
    backend = CountingBackend(MemoryBackend())
    manager = RemoteLogManager(s, backend)
    results = manager.run_once()
    assert all(r.error is None for r in results) and results[0].copied
    deleted = delete_local_segments(logs / f"{TOPIC}-0")
    readers = TieredReaders(s, backend, protection=manager.shared.protection if shared else None)
    readers.resources.read_ahead = False
    reader = readers.reader(TOPIC, 0)
    remote = [r for r in brute.records if r.offset < max(deleted)]
    seen_segments: set[int] = set()
    for rec in remote[::23]:
        segment = max(b for b in deleted if b <= rec.offset)
        before = backend.total
        found = reader.lookup_offset(rec.offset)
        cost = backend.total - before
        assert found.found and found.offset == rec.offset and found.tier == "remote"
        first_in_segment = segment not in seen_segments
        seen_segments.add(segment)
        # cached entry: 0; else one ranged GET, plus the segment's manifest the first time when
        # the reader does not share the copier's knowledge
        manifest_read = encrypt and first_in_segment and not shared
        assert cost <= 1 + manifest_read, (rec.offset, cost)
        if first_in_segment:
            assert cost == 1 + manifest_read, (rec.offset, cost)
    batches = list(iter_batches(reader.fetch(0, 1 << 20).data))
    assert batches and batches[0].base_offset == 0
