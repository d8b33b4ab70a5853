"""Which stored manifests a reader may trust, and the MAC a writer puts on them (docs/protection.md §9).

A manifest is the commit point of a segment: it names the objects a reader opens, the wrapped data
key, and whether they are encrypted at all. A writer to the bucket who holds no key could otherwise
commit plaintext records under an encrypted store, or copy a genuine manifest to another
partition's key. So:

- **placement**, always: the manifest's topic, partition and base offset are those of the key it is
  stored under (the key's root carries the topic id): a manifest moved between keys is refused;
- **authentication**, with ``[remote.encryption]`` configured: the manifest must carry ``auth``, an
  HMAC-SHA256 (:meth:`rlm.tiering.store.keyring.KeyRing.mac`) of
  :meth:`~rlm.tiering.store.manifest.SegmentManifest.signed_bytes` — every field and the store key —
  under a master key of the ring. A manifest without it, or whose MAC does not match, is refused
  (:class:`~rlm.errors.TamperedObjectError` naming the manifest key and the key id); a key id not in
  the ring is :class:`~rlm.errors.KeyNotFoundError`. ``rlm rewrap`` re-MACs under its target key,
  and with ``--authenticate`` trusts, once, manifests written before rlm authenticated them.

Without a ring nothing can be checked beyond placement: such a reader cannot open encrypted
segments either, and docs/protection.md §9 says why it must not serve an encrypted store.
"""

from __future__ import annotations

import dataclasses

from rlm.errors import ProtectionError, TamperedObjectError
from rlm.tiering.store import object_keys
from rlm.tiering.store.keyring import KeyRing
from rlm.tiering.store.manifest import ManifestAuth, SegmentManifest

__all__ = ["check_manifest", "check_placement", "seal_manifest"]


def check_placement(m: SegmentManifest, key: str) -> None:
    """Raise :class:`TamperedObjectError` unless ``m`` names the partition and base offset of its
    store key ``key``."""
    root = object_keys.parse_root(key)
    base = (
        None
        if root is None
        else object_keys.parse_manifest_key(root.topic, root.partition, key, root.topic_id)
    )
    if root is None or (root.topic, root.partition, base) != (m.topic, m.partition, m.base_offset):
        raise TamperedObjectError(
            f"the manifest names {m.topic}-{m.partition} base offset {m.base_offset}, not "
            "the partition and base offset of its key: it was moved or forged",
            file=key,
        )


def seal_manifest(
    ring: KeyRing | None, m: SegmentManifest, key: str, *, key_id: str | None = None
) -> SegmentManifest:
    """``m`` with ``auth`` under master key ``key_id`` (default: the ring's active key), for
    storing at ``key``; ``m`` unchanged without a key (a store without encryption)."""
    key_id = key_id or (ring.active_id if ring is not None else None)
    if ring is None or key_id is None:
        return m
    mac = ring.mac(key_id, m.signed_bytes(key), where=key)
    return dataclasses.replace(m, auth=ManifestAuth(key_id, mac))


def check_manifest(
    ring: KeyRing | None, m: SegmentManifest, key: str, *, trust_unauthenticated: bool = False
) -> None:
    """Raise unless a reader holding ``ring`` may trust ``m`` read at ``key`` (module doc).
    ``trust_unauthenticated`` accepts a manifest without ``auth`` (``rlm rewrap --authenticate``
    only); a present MAC is always checked."""
    check_placement(m, key)
    if ring is None:
        return
    if m.auth is None:
        if trust_unauthenticated:
            return
        raise TamperedObjectError(
            "the manifest carries no MAC (field 'auth') but [remote.encryption] is "
            "configured: written without the store's keys, or by an rlm before manifests were "
            "authenticated (`rlm rewrap --authenticate` trusts those once, docs/protection.md §9)",
            file=key,
        )
    where = f"{m.topic}-{m.partition} segment {m.base_offset} manifest"
    try:
        ring.check_mac(m.auth.key_id, m.signed_bytes(key), m.auth.mac, where=where)
    except TamperedObjectError as err:
        _blame_the_key(ring, m, where)  # a wrong key file under that id reads as "tampered" too
        raise err.in_file(key) from err
    except ProtectionError as err:
        raise err.in_file(key) from err


def _blame_the_key(ring: KeyRing, m: SegmentManifest, where: str) -> None:
    """Raise :class:`WrongKeyError` when the key under the MAC's id does not open the data key it
    wrapped either: the operator's key file is wrong, not (only) the manifest."""
    wrapped = m.protection.encryption if m.protection is not None else None
    if wrapped is not None and m.auth is not None and wrapped.key_id == m.auth.key_id:
        try:
            ring.unwrap(wrapped, where=where)
        except ProtectionError as err:
            raise err.in_file(m.log.key) from err
