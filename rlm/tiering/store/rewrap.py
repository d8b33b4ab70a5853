"""``rlm rewrap``: re-wrap every segment's data key under another master key, touching only
manifests (docs/security.md §5).

A segment's data key is stored only wrapped, in its manifest's ``protection.encryption``
(docs/protection.md). Rotation wraps new segments' keys with the new ``active_key``; this module
brings the old ones over: for each manifest whose key id is not the target, unwrap with the ring,
wrap under the target (a fresh nonce) and overwrite the manifest with the same content but the new
wrap. The data objects are never read or written: their ciphertext is under the data key, which
does not change. Every manifest read is checked first (its placement and MAC, docs/protection.md
§9: a rewrap never launders a forged manifest) and written back with its MAC under the target
key; with ``authenticate`` a manifest without a MAC (from an rlm before manifests were
authenticated) is trusted once and MACed.

Why overwriting a commit point is safe here (docs/formats.md §6.3 makes manifests create-only):
the "only if absent" rule is what lets concurrent copiers agree on which attempt a segment is.
A rewrap changes no field that decision reads — same attempt, same objects, offsets and checksums,
the same plaintext data key — so every reader, whichever version it read or cached, opens the same
bytes. ``put`` publishes atomically (a reader sees the old or the new manifest, never a mix), so a
crash at any point leaves each manifest old or new, and a second run skips what is done
(idempotent). The races, and what closes them:

- **retention deletes the segment meanwhile** (manifest first, then data, docs/formats.md §6.6):
  the manifest's ETag is checked just before the overwrite (gone or changed: skipped), and the
  ``.log`` object is checked just after it; if it is gone, the manifest just written is deleted
  again, so a deleted segment is not brought back. What is left is the window between those two
  checks and retention's data delete; ``rlm verify`` reports such a manifest (docs/security.md §5).
- **another rewrap or a copier**: a changed ETag means someone else wrote; the manifest is read
  again and judged afresh (at most :data:`_ATTEMPTS` times).

Every rewritten manifest is read back and its new wrap opened before it counts as done. Every
read and the listing go through :class:`~rlm.tiering.store.remote_state.RemoteState` (the store's
one reader of manifests: ``store_manifest_keys``, ``read_manifest``), so a rewrap trusts exactly
what the daemon trusts — plus, with ``authenticate``, a manifest without a MAC.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rlm.errors import KeyNotFoundError, ObjectNotFoundError, RlmError
from rlm.storage.api import StorageBackend
from rlm.tiering.store.keyring import KeyRing
from rlm.tiering.store.manifest import SegmentManifest
from rlm.tiering.store.manifest_trust import seal_manifest
from rlm.tiering.store.remote_state import RemoteState, store_manifest_keys
from rlm.tiering.store.store_protection import StoreProtection

__all__ = ["RewrapResult", "rewrap_store"]

#: Tries per manifest when its ETag changes under us (another writer): then it is left as it is.
_ATTEMPTS = 3


@dataclass
class RewrapResult:
    """Counts of one run (manifests), the key ids met, and one line per failed manifest."""

    to: str
    dry_run: bool
    manifests: int = 0
    rewrapped: int = 0  # (would be, with dry_run) rewritten under ``to``
    already: int = 0  # already wrapped and MACed under ``to``
    plaintext: int = 0  # not encrypted: nothing to re-wrap (its MAC is under ``to``)
    authenticated: int = 0  # had no MAC: trusted once and MACed under ``to`` (``authenticate``)
    gone: int = 0  # deleted (retention) while we worked: left deleted
    changed: int = 0  # rewritten by another writer _ATTEMPTS times in a row: left
    from_keys: Counter[str] = field(default_factory=Counter)  # key id → manifests found under it
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_json(self) -> dict[str, Any]:
        return {
            "to": self.to,
            "dry_run": self.dry_run,
            "manifests": self.manifests,
            "rewrapped": self.rewrapped,
            "already": self.already,
            "plaintext": self.plaintext,
            "authenticated": self.authenticated,
            "gone": self.gone,
            "changed": self.changed,
            "from_keys": dict(sorted(self.from_keys.items())),
            "failed": len(self.errors),
        }


class _Rewrapper:
    def __init__(
        self, backend: StorageBackend, ring: KeyRing, to: str, *, dry_run: bool, authenticate: bool
    ) -> None:
        self.backend, self.ring, self.to, self.dry_run = backend, ring, to, dry_run
        self.authenticate = authenticate
        self.protection = StoreProtection(ring=ring)
        self.result = RewrapResult(to, dry_run)
        self._lock = threading.Lock()

    def _count(self, outcome: str, key_id: str | None = None) -> None:
        with self._lock:
            setattr(self.result, outcome, getattr(self.result, outcome) + 1)
            if key_id is not None:
                self.result.from_keys[key_id] += 1

    def one(self, key: str, etag: str | None) -> None:
        """Bring one manifest over; a failure is recorded as one line, never raised."""
        try:
            self._one(key, etag)
        except RlmError as err:
            with self._lock:
                self.result.errors.append(" ".join(str(err).split()))

    def _read(self, key: str, *, trust_unauthenticated: bool = False) -> SegmentManifest:
        """The manifest at ``key`` as RemoteState reads it (placement and MAC checked)."""
        state = RemoteState.of_root(self.backend, key, self.protection)
        assert state is not None  # store_manifest_keys lists only keys under a root
        return state.read_manifest(key, trust_unauthenticated=trust_unauthenticated)

    def _one(self, key: str, etag: str | None) -> None:
        for _ in range(_ATTEMPTS):
            try:
                m = self._read(key, trust_unauthenticated=self.authenticate)
            except ObjectNotFoundError:
                return self._count("gone")
            wrapped = m.protection.encryption if m.protection is not None else None
            under = wrapped.key_id if wrapped is not None else None
            needs_wrap = wrapped is not None and under != self.to
            if not needs_wrap and m.auth is not None and m.auth.key_id == self.to:
                return self._count("already" if wrapped is not None else "plaintext", under)
            data_key, new = None, m
            if wrapped is not None and needs_wrap:
                where = f"{key} (its data key is wrapped by key {under!r})"
                data_key = self.ring.unwrap(wrapped, where=where)
                assert m.protection is not None
                moved = dataclasses.replace(m.protection, encryption=self.ring.wrap(data_key, self.to))
                new = dataclasses.replace(m, protection=moved)
            new = seal_manifest(self.ring, new, key, key_id=self.to)
            outcome = "authenticated" if m.auth is None else "rewrapped"
            if self.dry_run:
                return self._count(outcome, under)
            published = self._publish(key, etag, m, new, data_key)
            if published != "changed":
                return self._count(outcome if published == "done" else published, under)
            etag = None  # someone else wrote it: read it again and judge afresh
        return self._count("changed")

    def _publish(
        self, key: str, etag: str | None, old: SegmentManifest, new: SegmentManifest, data_key: bytes | None
    ) -> str:
        """Overwrite ``key`` with ``new``: "done", "gone" or "changed" (see the module doc)."""
        try:
            now = self.backend.head(key)
        except ObjectNotFoundError:
            return "gone"
        if etag is not None and now.etag is not None and now.etag != etag:
            return "changed"
        body = new.to_json()
        self.backend.put(key, body)
        try:
            self.backend.head(old.log.key)
        except ObjectNotFoundError:  # retention deleted the segment meanwhile: do not revive it
            self.backend.delete(key)
            return "gone"
        back = self._read(key)  # its MAC checked
        wrap = back.protection.encryption if back.protection is not None else None
        if back.attempt_id != old.attempt_id or back.encrypted != old.encrypted:
            return "changed"  # another writer's manifest replaced ours: judged again
        if wrap is not None and data_key is not None and self.ring.unwrap(wrap, where=key) != data_key:
            raise RlmError(f"{key}: the re-wrapped data key read back does not match", file=key)
        return "done"


def rewrap_store(
    backend: StorageBackend,
    ring: KeyRing,
    to: str,
    *,
    topics: frozenset[str] | None = None,
    dry_run: bool = False,
    authenticate: bool = False,
    parallelism: int = 8,
    on_manifest: Callable[[], None] | None = None,
) -> RewrapResult:
    """Re-wrap the data key of every manifest (of ``topics``) not under ``to``; ``parallelism``
    manifests at once (store round trips dominate). ``to`` must be a key id of ``ring``. Every
    manifest read is checked first (docs/protection.md §9) and written back with its MAC under
    ``to``; ``authenticate`` also trusts, once, manifests without a MAC (written before rlm
    authenticated manifests) and MACs them."""
    if to not in ring.key_ids:  # before any store work
        raise KeyNotFoundError(
            f"rewrap --to {to!r}: not in [remote.encryption] key_files (known: "
            f"{', '.join(ring.key_ids) or 'none'})",
            key_id=to,
        )
    worker = _Rewrapper(backend, ring, to, dry_run=dry_run, authenticate=authenticate)
    found = list(store_manifest_keys(backend, topics))
    worker.result.manifests = len(found)

    def task(item: tuple[str, str | None]) -> None:
        worker.one(*item)
        if on_manifest is not None:
            on_manifest()

    with ThreadPoolExecutor(max_workers=max(1, parallelism), thread_name_prefix="rlm-rewrap") as pool:
        list(pool.map(task, found))
    worker.result.errors.sort()
    return worker.result
