"""A hostile bucket writer without keys (docs/protection.md §9, docs/security.md §1): it can put
any object, but under `[remote.encryption]` no manifest it makes or moves is trusted.

Each attack is what issue #31 found, done with real stores tiered by the real manager:
- commit plaintext segments into an encrypted store (a copy of a plaintext store's manifests and
  data objects beyond the encrypted store's end): before manifests were authenticated, every
  reader that builds its view from the store (a new host's rebuild, sync, restore, export)
  served them;
- copy a genuine encrypted manifest to another partition's key;
- edit a field of a genuine manifest;
- without encryption, a manifest moved to another key is still refused (its placement).
Refusals are one line naming the manifest key (and the key id where there is one).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlm.errors import FormatError, TamperedObjectError
from rlm.storage.local import LocalBackend
from rlm.testing.daemon import rlm_cli
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.store.manifest import MAX_MANIFEST_BYTES
from rlm.tiering.store.remote_state import RemoteState
from rlm.tiering.store.store_protection import StoreProtection
from tests.lookup.helpers import delete_local_segments
from tests.protection.helpers import TOPIC, key_file, settings, write_secrets, write_toml


def _tier(s, store: Path) -> None:  # type: ignore[no-untyped-def]
    results = RemoteLogManager(s, LocalBackend(root=str(store))).run_once()
    assert all(r.error is None for r in results) and any(r.copied for r in results), results


def _hide_later_segments(log_dir: Path) -> dict[Path, Path]:
    segments = sorted(log_dir.glob("*.log"))
    later = {p: p.with_name(p.name + ".later") for p in segments[len(segments) // 2 + 1 :]}
    for p, q in later.items():
        p.rename(q)
    return later


def _manifest_files(store: Path, partition: int = 0) -> list[Path]:
    return sorted((store / f"{TOPIC}-{partition}" / "manifests").glob("*.json"))


@pytest.fixture
def encrypted(tmp_path: Path):  # type: ignore[no-untyped-def]
    """(settings with key "k", encrypted store holding the first half of partition 0's segments,
    a plaintext store holding all of them: what a keyless writer can copy from)."""
    logs, plain_logs = tmp_path / "logs", tmp_path / "plain-logs"
    for d in (logs, plain_logs):  # the same records (write_secrets is deterministic)
        write_secrets(d, batches=160)
        write_secrets(d, batches=80, partition=1)
    keys = {"k": key_file(tmp_path / "keys", "k")}
    _tier(settings(tmp_path / "p", plain_logs, codec=None), tmp_path / "plain")
    later = _hide_later_segments(logs / f"{TOPIC}-0")
    s = settings(tmp_path, logs, keys=keys, active="k")
    _tier(s, tmp_path / "store")
    for p, q in later.items():
        q.rename(p)
    return s, tmp_path / "store", tmp_path / "plain"


def _remote(s, store: Path, partition: int = 0) -> RemoteState:  # type: ignore[no-untyped-def]
    return RemoteState(
        LocalBackend(root=str(store)), TOPIC, partition, None, StoreProtection.from_settings(s.remote)
    )


def test_plaintext_segments_committed_by_a_keyless_writer_are_refused(tmp_path: Path, encrypted) -> None:  # type: ignore[no-untyped-def]
    s, store, plain = encrypted
    ours = {p.name for p in _manifest_files(store)}
    injected = [p for p in _manifest_files(plain) if p.name not in ours]
    assert injected
    for m in injected:  # the attacker's "segments": real plaintext bytes with their manifests
        doc = json.loads(m.read_bytes())
        for obj in doc["objects"].values():
            target = store / obj["key"]
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(plain / obj["key"], target)
        shutil.copy(m, store / f"{TOPIC}-0" / "manifests" / m.name)
    with pytest.raises(TamperedObjectError) as err:
        _remote(s, store).chain()
    text = str(err.value)
    assert "carries no MAC" in text and f"{TOPIC}-0/manifests/" in text and "\n" not in text
    # a new host (empty state dir, local segments gone) rebuilding its index from the store
    delete_local_segments(Path(s.log.dirs[0]) / f"{TOPIC}-0")
    shutil.rmtree(s.tiering.state_dir)
    proc = rlm_cli("rebuild-index", "--config", write_toml(tmp_path / "rlm.toml", s), "--quiet")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert injected[0].name in lines[0] and "carries no MAC" in lines[0]


def test_a_manifest_moved_to_another_partition_is_refused(encrypted) -> None:  # type: ignore[no-untyped-def]
    s, store, _ = encrypted
    genuine = _manifest_files(store, 1)[0]
    target = store / f"{TOPIC}-0" / "manifests" / f"{99_000:020d}.json"
    doc = json.loads(genuine.read_bytes())
    shutil.copy(genuine, target)
    with pytest.raises(TamperedObjectError, match="not the partition and base offset of its key"):
        _remote(s, store).chain()
    # relabelled to match its new key, its MAC (under key "k") no longer matches
    doc.update(partition=0, base_offset=99_000, last_offset=99_000 + doc["last_offset"] - doc["base_offset"])
    target.write_text(json.dumps(doc))
    with pytest.raises(TamperedObjectError) as err:
        _remote(s, store).chain()
    assert "MAC under key 'k' does not match" in str(err.value) and target.name in str(err.value)


def test_an_edited_manifest_is_refused(encrypted) -> None:  # type: ignore[no-untyped-def]
    s, store, _ = encrypted
    assert len(_remote(s, store).chain().links) == len(_manifest_files(store))
    victim = _manifest_files(store)[-1]
    doc = json.loads(victim.read_bytes())
    doc["max_timestamp"] += 1  # any field: here what time lookups and retention judge by
    victim.write_text(json.dumps(doc))
    with pytest.raises(TamperedObjectError, match="does not match") as err:
        _remote(s, store).chain()
    assert err.value.key_id == "k" and victim.name in str(err.value)


def test_without_encryption_a_moved_manifest_is_still_refused(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_secrets(logs, batches=80)
    write_secrets(logs, batches=80, partition=1)
    s = settings(tmp_path, logs, codec=None)
    _tier(s, tmp_path / "store")
    store = tmp_path / "store"
    assert _remote(s, store).chain().links
    moved = store / f"{TOPIC}-0" / "manifests" / f"{99_000:020d}.json"
    shutil.copy(_manifest_files(store, 1)[0], moved)
    with pytest.raises(TamperedObjectError, match="not the partition and base offset of its key"):
        _remote(s, store).chain()


def test_a_huge_object_under_a_manifest_key_is_refused_unbuffered(encrypted) -> None:  # type: ignore[no-untyped-def]
    """A hostile bucket serving a giant "manifest": at most MAX_MANIFEST_BYTES + 1 bytes are read."""
    s, store, _ = encrypted
    huge = store / f"{TOPIC}-0" / "manifests" / f"{99_000:020d}.json"
    huge.write_bytes(b" " * (MAX_MANIFEST_BYTES + 4096))
    asked: list[tuple[str, int, int | None]] = []
    backend = LocalBackend(root=str(store))
    real = backend.read

    def read(key: str, start: int = 0, end: int | None = None) -> bytes:
        asked.append((key, start, end))
        return real(key, start, end)

    backend.read = read  # type: ignore[method-assign]
    remote = RemoteState(backend, TOPIC, 0, None, StoreProtection.from_settings(s.remote))
    with pytest.raises(FormatError, match="larger than") as err:
        remote.chain()
    assert huge.name in str(err.value)
    assert all(end is not None and end - start <= MAX_MANIFEST_BYTES + 1 for _, start, end in asked)
