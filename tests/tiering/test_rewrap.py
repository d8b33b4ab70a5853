"""`rlm rewrap` on a store tiered by the real manager (local backend): only manifests change, each
data key survives the move from key A to key B, runs are idempotent, --dry-run writes nothing, a
key missing from the ring is one line per manifest naming it and the key id (exit 1), a segment
deleted by retention mid-rewrap is not brought back.

The manifests get their ``protection.encryption`` here, wrapped with the real KeyRing, and their
MAC, as a copier encrypting under key A would have written them: rewrap never reads data
objects, so whether those hold ciphertext does not matter to it. Reading real encrypted data
back after a rewrap and the retirement of the old key is tests/tiering/test_rewrap_s3.py
(SeaweedFS).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pytest

from rlm.storage.api import ObjectInfo, StorageBackend
from rlm.storage.local import LocalBackend
from rlm.storage.wrapper import WrappingBackend
from rlm.testing.daemon import rlm_cli
from rlm.testing.secrets import write_secret
from rlm.tiering.manager import RemoteLogManager
from rlm.tiering.store import object_keys
from rlm.tiering.store.keyring import KeyRing
from rlm.tiering.store.manifest import Protection, SegmentManifest
from rlm.tiering.store.manifest_trust import seal_manifest
from rlm.tiering.store.remote_state import store_manifest_keys
from rlm.tiering.store.rewrap import rewrap_store
from tests.lookup.helpers import settings_for, write_config, write_generated
from tests.tiering.helpers import REPO

A, B = "k2026a", "k2026b"


@dataclass
class Store:
    root: Path
    config_dir: Path
    logs: Path
    key_files: dict[str, Path]
    data_keys: dict[str, bytes]  # manifest key → its segment's data key (what must survive)

    @property
    def backend(self) -> LocalBackend:
        return LocalBackend(root=str(self.root))

    def ring(self, *ids: str, active: str | None = None) -> KeyRing:
        keys_ = {i: base64.b64decode(self.key_files[i].read_text()) for i in ids}
        return KeyRing(keys_, active)

    def objects(self) -> dict[str, bytes]:
        b = self.backend
        return {i.key: b.read(i.key) for i in b.list("")}

    def config(self, ids: tuple[str, ...], active: str) -> Path:
        cfg = write_config(self.config_dir / f"rlm-{'-'.join(ids)}.toml", [self.logs], store=self.root)
        files = ", ".join(f'{i} = "{self.key_files[i]}"' for i in ids)
        with cfg.open("a") as f:
            f.write(f'[remote.encryption]\nkey_files = {{ {files} }}\nactive_key = "{active}"\n')
        return cfg


def _manifests(backend: StorageBackend) -> dict[str, SegmentManifest]:
    return {
        k: SegmentManifest.from_json(backend.read(k), key=k) for k, _ in store_manifest_keys(backend, None)
    }


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    logs, root = tmp_path / "logs", tmp_path / "store"
    write_generated(logs, "orders", 0, batches=120, seed=1)
    write_generated(logs, "orders", 1, batches=60, seed=2)
    write_generated(logs, "audit", 0, batches=60, seed=3)
    settings = settings_for([logs], options={"root": str(root)})
    assert all(r.error is None for r in RemoteLogManager(settings, LocalBackend(root=str(root))).run_once())
    key_files = {}
    for key_id in (A, B):
        key_files[key_id] = tmp_path / f"{key_id}.key"
        write_secret(key_files[key_id], base64.b64encode(os.urandom(32)).decode() + "\n")
    s = Store(root, tmp_path, logs, key_files, {})
    ring_a = s.ring(A, active=A)
    backend = s.backend
    for key, m in _manifests(backend).items():  # as a copier encrypting under A wrote them
        data_key, wrapped = ring_a.new_data_key()
        s.data_keys[key] = data_key
        protected = dataclasses.replace(m, protection=Protection("none", m.log.crc32c, wrapped))
        backend.put(key, seal_manifest(ring_a, protected, key).to_json())
    assert len(s.data_keys) >= 6
    yield s


def _without_wrap(m: SegmentManifest) -> dict[str, object]:
    doc = json.loads(m.to_json())
    doc["protection"].pop("encryption")
    doc.pop("auth")  # re-made under the target key with the new wrap
    return doc


def test_rewrap_moves_every_data_key_and_touches_only_manifests(store: Store) -> None:
    before, manifests_before = store.objects(), _manifests(store.backend)
    result = rewrap_store(store.backend, store.ring(A, B, active=B), B)
    assert result.ok and result.to_json() == {
        "to": B,
        "dry_run": False,
        "manifests": len(store.data_keys),
        "rewrapped": len(store.data_keys),
        "already": 0,
        "plaintext": 0,
        "authenticated": 0,
        "gone": 0,
        "changed": 0,
        "from_keys": {A: len(store.data_keys)},
        "failed": 0,
    }
    after = store.objects()
    assert set(after) == set(before)
    changed = {k for k in after if after[k] != before[k]}
    assert changed == set(store.data_keys)  # manifests only; every data object byte-identical
    only_b = store.ring(B)  # the old key retired: every data key still opens
    for key, m in _manifests(store.backend).items():
        assert m.protection is not None and m.protection.encryption is not None
        assert m.protection.encryption.key_id == B
        assert only_b.unwrap(m.protection.encryption, where=key) == store.data_keys[key]
        assert _without_wrap(m) == _without_wrap(manifests_before[key])  # nothing else changed


def test_second_run_writes_nothing(store: Store) -> None:
    ring = store.ring(A, B, active=B)
    rewrap_store(store.backend, ring, B)
    settled = store.objects()
    again = rewrap_store(store.backend, ring, B)
    assert again.ok and again.rewrapped == 0 and again.already == len(store.data_keys)
    assert again.from_keys == {B: len(store.data_keys)}
    assert store.objects() == settled


def test_dry_run_counts_and_writes_nothing(store: Store) -> None:
    before = store.objects()
    result = rewrap_store(store.backend, store.ring(A, B, active=B), B, dry_run=True)
    assert result.ok and result.dry_run and result.rewrapped == len(store.data_keys)
    assert store.objects() == before


def test_topic_filter(store: Store) -> None:
    result = rewrap_store(store.backend, store.ring(A, B), B, topics=frozenset({"audit"}))
    audit = {k for k in store.data_keys if k.startswith("audit-")}
    assert result.manifests == result.rewrapped == len(audit) > 0
    for key, m in _manifests(store.backend).items():
        assert m.protection is not None and m.protection.encryption is not None
        assert m.protection.encryption.key_id == (B if key in audit else A)


def test_plaintext_manifests_are_authenticated_only_when_asked(store: Store) -> None:
    """A manifest written before encryption (no ``protection``, no ``auth``) is refused like a
    forged one; ``authenticate=True`` trusts it once and MACs it under the target key, its data
    left plaintext; a later run finds it done."""
    backend = store.backend
    plain = sorted(store.data_keys)[0]
    m = SegmentManifest.from_json(backend.read(plain), key=plain)
    backend.put(plain, dataclasses.replace(m, protection=None, auth=None).to_json())
    body = backend.read(plain)
    refused = rewrap_store(backend, store.ring(A, B), B)
    assert refused.rewrapped == len(store.data_keys) - 1 and len(refused.errors) == 1
    assert plain in refused.errors[0] and "carries no MAC" in refused.errors[0]
    assert backend.read(plain) == body
    result = rewrap_store(backend, store.ring(A, B), B, authenticate=True)
    assert result.ok and result.authenticated == 1 and result.already == len(store.data_keys) - 1
    after = SegmentManifest.from_json(backend.read(plain), key=plain)
    assert after.protection is None and after.auth is not None and after.auth.key_id == B
    assert dataclasses.replace(after, auth=None) == dataclasses.replace(m, protection=None, auth=None)
    again = rewrap_store(backend, store.ring(A, B), B)
    assert again.ok and again.plaintext == 1 and again.already == len(store.data_keys) - 1


def test_a_forged_manifest_is_never_laundered(store: Store) -> None:
    """A keyless bucket writer strips a manifest's encryption (keeping its old MAC) or copies it
    to another segment's key: rewrap, even with ``authenticate``, refuses it and writes nothing."""
    backend = store.backend
    first, second = sorted(store.data_keys)[:2]
    m = SegmentManifest.from_json(backend.read(first), key=first)
    backend.put(first, dataclasses.replace(m, protection=None).to_json())
    backend.put(second, backend.read(sorted(store.data_keys)[2]))
    bodies = {k: backend.read(k) for k in (first, second)}
    result = rewrap_store(backend, store.ring(A, B), B, authenticate=True)
    assert len(result.errors) == 2, result.errors
    assert any(first in e and "MAC under key 'k2026a' does not match" in e for e in result.errors)
    assert any(second in e and "not the partition and base offset of its key" in e for e in result.errors)
    assert {k: backend.read(k) for k in bodies} == bodies


class _RetentionRace(WrappingBackend):
    """Retention deleting one segment (manifest, then data: docs/formats.md §6.6) while rewrap
    overwrites its manifest: the data goes right after the rewrap's put."""

    def __init__(self, inner: StorageBackend, victim: SegmentManifest, victim_key: str) -> None:
        super().__init__()
        self.inner, self.victim, self.victim_key = inner, victim, victim_key

    def _put(self, key: str, stream: BinaryIO, if_absent: bool) -> ObjectInfo:
        info = self.inner.put(key, stream, if_absent=if_absent)
        if key == self.victim_key:
            for obj in self.victim.objects.values():
                self.inner.delete(obj.key)
        return info


def test_a_segment_deleted_meanwhile_is_not_revived(store: Store) -> None:
    victim_key = sorted(store.data_keys)[0]
    backend = store.backend
    victim = SegmentManifest.from_json(backend.read(victim_key), key=victim_key)
    result = rewrap_store(_RetentionRace(backend, victim, victim_key), store.ring(A, B), B, parallelism=1)
    assert result.ok and result.gone == 1 and result.rewrapped == len(store.data_keys) - 1
    assert not backend.exists(victim_key)  # the rewritten manifest was deleted again
    backend.delete(sorted(store.data_keys)[1])  # retention finished before rewrap read it
    assert rewrap_store(backend, store.ring(A, B), B).to_json()["manifests"] == len(store.data_keys) - 2


# -- the command --------------------------------------------------------------------------------


@pytest.mark.integration
def test_cli_rewrap_then_missing_key_is_one_line_per_manifest(store: Store) -> None:
    proc = rlm_cli("rewrap", "--config", store.config((A, B), B), "--to", B, "--topic", "orders")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    orders = sorted(k for k in store.data_keys if k.startswith("orders-"))
    assert doc["rewrapped"] == len(orders) and doc["failed"] == 0
    # A retired: the audit manifests still need it. One line each, naming the manifest and key id.
    proc = rlm_cli("rewrap", "--config", store.config((B,), B), "--to", B)
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    audit = sorted(k for k in store.data_keys if k.startswith("audit-"))
    assert len(lines) == len(audit) and "Traceback" not in proc.stderr
    for line, key in zip(lines, audit, strict=True):
        assert line.startswith("rlm: error: ") and key in line and repr(A) in line
    assert json.loads(proc.stdout)["already"] == len(orders)


@pytest.mark.integration
@pytest.mark.parametrize("case", ["unknown --to", "no encryption"])
def test_cli_refuses_a_target_the_ring_lacks(store: Store, case: str) -> None:
    cfg = store.config((A, B), B)
    if case == "no encryption":
        cfg = write_config(store.config_dir / "plain.toml", [store.logs], store=store.root)
    before = store.objects()
    proc = rlm_cli("rewrap", "--config", cfg, "--to", "k-nope" if case == "unknown --to" else B)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and ("k-nope" in lines[0] or "key_files is empty" in lines[0]), lines
    assert store.objects() == before


def test_manifest_keys_skip_markers_and_data(store: Store) -> None:
    listed = [k for k, _ in store_manifest_keys(store.backend, None)]
    assert sorted(listed) == sorted(store.data_keys)
    paged = [k for k, _ in store_manifest_keys(store.backend, None, page_size=3)]
    assert paged == listed  # many pages: the same keys, in the same (key) order
    assert all(object_keys.parse_root(k) is not None and "/manifests/" in k for k in listed)


@pytest.mark.integration
def test_killed_mid_run_leaves_each_manifest_old_or_new_and_a_rerun_finishes(store: Store) -> None:
    """SIGKILL of a real `rlm rewrap` on a slow, flaky store (the faulty backend: 150 ms per call,
    5% injected errors retried, 5% puts whose answer is lost), once it has rewritten a manifest:
    every manifest is still whole, under A or under B with the same data key; a rerun ends all
    under B."""
    files = ", ".join(f'{i} = "{store.key_files[i]}"' for i in (A, B))
    cfg = store.config_dir / "slow.toml"
    cfg.write_text(
        f'[log]\ndirs = ["{store.logs}"]\n[remote]\nbackend = "faulty"\n[remote.options]\ninner = "local"\n'
        f'inner_options = {{ root = "{store.root}" }}\nlatency_ms = 150\nerror_rate = 0.05\n'
        f"lost_ack_rate = 0.05\nseed = 7\n[remote.encryption]\nkey_files = {{ {files} }}\n"
        f'active_key = "{B}"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLM_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlm", "rewrap", "--config", str(cfg), "--to", B, "--parallelism", "1"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while proc.poll() is None:  # kill it right after its first overwrite
            ids = _wrap_ids(store.backend)
            if B in ids.values():
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.01)
    finally:
        proc.wait(timeout=60)
    ids = _wrap_ids(store.backend)
    assert proc.returncode == -signal.SIGKILL and set(ids.values()) == {A, B}  # stopped midway
    ring = store.ring(A, B)
    for key, m in _manifests(store.backend).items():  # each whole, old or new, same data key
        assert m.protection is not None and m.protection.encryption is not None
        assert ring.unwrap(m.protection.encryption, where=key) == store.data_keys[key]
    again = rlm_cli("rewrap", "--config", store.config((A, B), B), "--to", B)
    assert again.returncode == 0, again.stderr
    done = json.loads(again.stdout)
    assert done["already"] >= 1 and done["already"] + done["rewrapped"] == len(store.data_keys)
    assert set(_wrap_ids(store.backend).values()) == {B}


def _wrap_ids(backend: StorageBackend) -> dict[str, str]:
    out = {}
    for key, m in _manifests(backend).items():
        assert m.protection is not None and m.protection.encryption is not None
        out[key] = m.protection.encryption.key_id
    return out


def test_an_encrypted_store_from_before_manifest_macs_is_authenticated_in_place(store: Store) -> None:
    """The upgrade of an encrypted store written by an rlm before manifests carried a MAC: every
    manifest has its wrap but no ``auth``. Refused until ``authenticate=True``, which MACs each
    under the target (here the key that already wraps them: no data key moves), in place."""
    backend = store.backend
    for key, m in _manifests(backend).items():
        backend.put(key, dataclasses.replace(m, auth=None).to_json())
    before = _manifests(backend)
    refused = rewrap_store(backend, store.ring(A), A)
    assert len(refused.errors) == len(store.data_keys)
    result = rewrap_store(backend, store.ring(A), A, authenticate=True)
    assert result.ok and result.authenticated == len(store.data_keys) and result.rewrapped == 0
    only_a = store.ring(A)
    for key, m in _manifests(backend).items():
        assert m.auth is not None and m.auth.key_id == A
        assert dataclasses.replace(m, auth=None) == before[key]
        assert m.protection is not None and m.protection.encryption is not None
        assert only_a.unwrap(m.protection.encryption, where=key) == store.data_keys[key]
    again = rewrap_store(backend, store.ring(A), A)
    assert again.ok and again.already == len(store.data_keys)
