"""The key ring of envelope encryption (docs/protection.md): master keys by id, data keys wrapped by them.

Every copied segment gets a fresh 32-byte **data key** (``os.urandom``) that encrypts its stored
bytes. The data key itself is stored only *wrapped*: AES-256-GCM under the ring's active **master
key** (a key file of ``[remote.encryption] key_files``), with the master key's id bound as
associated data, so a wrapped key can only be opened by the key it names. The wrapped blob is::

    off size field
      0  12  nonce: 12 random bytes (os.urandom), fresh per wrap
     12  32  the data key, AES-256-GCM ciphertext
     44  16  GCM tag over the ciphertext and AD = b"rlm-data-key-v1:" + key id (UTF-8)

Random nonces are safe here: a master key wraps one data key per segment, far below the 2³²
messages per key at which NIST bounds random 96-bit nonces. Rotation: a new ``active_key`` wraps new
segments' data keys; old segments stay readable while their key id is in the ring, and ``rlm
rewrap`` re-wraps their data keys (:meth:`KeyRing.wrap`) without touching the data.

**Manifest MACs** (:meth:`KeyRing.mac`, docs/protection.md §9): HMAC-SHA256 under a 32-byte key
derived from a master key with HKDF-SHA256 (no salt, info ``b"rlm-manifest-mac-v1"``), so the
master key itself never keys two algorithms. Only a holder of the master key can make one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from rlm.config.protection_settings import KEY_BYTES, EncryptionSettings, read_key_file
from rlm.errors import FormatError, KeyNotFoundError, TamperedObjectError, WrongKeyError

__all__ = ["DATA_KEY_BYTES", "MAC_BYTES", "KeyRing", "WrappedKey"]

DATA_KEY_BYTES = KEY_BYTES
_NONCE_BYTES = 12
_WRAPPED_BYTES = _NONCE_BYTES + DATA_KEY_BYTES + 16
_AD_PREFIX = b"rlm-data-key-v1:"
_MAC_INFO = b"rlm-manifest-mac-v1"
#: Bytes of a manifest MAC (HMAC-SHA256).
MAC_BYTES = 32
_UNWRAPPED_CACHE = 4096  # data keys kept unwrapped (32 bytes each): one per recently read segment


@dataclass(frozen=True, slots=True)
class WrappedKey:
    """A data key wrapped by the master key ``key_id``: ``blob`` is the 60-byte layout of the module doc."""

    key_id: str
    blob: bytes

    def __repr__(self) -> str:
        return f"WrappedKey(key_id={self.key_id!r}, blob=<{len(self.blob)} bytes>)"

    def to_json(self) -> dict[str, str]:
        """The manifest's form: ``{"key_id": ..., "wrapped_key": <base64>}``."""
        return {"key_id": self.key_id, "wrapped_key": base64.b64encode(self.blob).decode("ascii")}

    @classmethod
    def from_json(cls, doc: Any, *, where: str = "<manifest>") -> WrappedKey:
        """Parse :meth:`to_json`'s form; anything else → :class:`FormatError` naming ``where``."""
        if not isinstance(doc, Mapping) or not isinstance(doc.get("key_id"), str) or not doc["key_id"]:
            raise FormatError(f"{where}: protection.encryption must hold a key_id string")
        try:
            blob = base64.b64decode(str(doc.get("wrapped_key", "")), validate=True)
        except (binascii.Error, ValueError):
            blob = b""
        if len(blob) != _WRAPPED_BYTES:
            raise FormatError(
                f"{where}: protection.encryption.wrapped_key is not the base64 of a "
                f"{_WRAPPED_BYTES}-byte wrapped key"
            )
        return cls(doc["key_id"], blob)


def _ad(key_id: str) -> bytes:
    return _AD_PREFIX + key_id.encode("utf-8")


class KeyRing:
    """Master keys by id (32 bytes each) and the id that wraps new data keys (``active_id``; None =
    the ring can only unwrap). Thread-safe; unwrapped data keys are memoized (bounded LRU)."""

    def __init__(self, keys: Mapping[str, bytes], active_id: str | None = None) -> None:
        for key_id, key in keys.items():
            if len(key) != KEY_BYTES:
                raise ValueError(f"master key {key_id!r} is {len(key)} bytes, not {KEY_BYTES}")
        if active_id is not None and active_id not in keys:
            raise KeyNotFoundError(f"active key {active_id!r} is not in the key ring", key_id=active_id)
        self._keys = dict(keys)
        self.active_id = active_id
        self._unwrapped: OrderedDict[tuple[str, bytes], bytes] = OrderedDict()
        self._mac_keys: dict[str, bytes] = {}  # key id → its derived MAC key (module doc)
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: EncryptionSettings) -> KeyRing | None:
        """The ring of ``[remote.encryption]`` (key files read now: ConfigError naming a bad one);
        None when encryption is not configured."""
        if not settings.key_files:
            return None
        keys = {key_id: read_key_file(key_id, path) for key_id, path in settings.key_files.items()}
        return cls(keys, settings.active_key or None)

    def __repr__(self) -> str:  # never the keys
        return f"KeyRing(ids={sorted(self._keys)}, active_id={self.active_id!r})"

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(sorted(self._keys))

    def new_data_key(self) -> tuple[bytes, WrappedKey]:
        """A fresh random data key and its wrapping by the active key."""
        if self.active_id is None:
            raise KeyNotFoundError("the key ring has no active key to wrap a new data key with")
        plaintext = os.urandom(DATA_KEY_BYTES)
        return plaintext, self.wrap(plaintext, self.active_id)

    def wrap(self, plaintext: bytes, key_id: str) -> WrappedKey:
        """Wrap a 32-byte data key with the master key ``key_id`` (a fresh random nonce)."""
        if len(plaintext) != DATA_KEY_BYTES:
            raise ValueError(f"a data key is {DATA_KEY_BYTES} bytes, not {len(plaintext)}")
        master = self._master(key_id, where="wrapping a data key")
        nonce = os.urandom(_NONCE_BYTES)
        return WrappedKey(key_id, nonce + AESGCM(master).encrypt(nonce, plaintext, _ad(key_id)))

    def unwrap(self, wrapped: WrappedKey, *, where: str) -> bytes:
        """The data key inside ``wrapped``. ``where`` names what it protects (object, partition,
        offset) for the one-line error: :class:`KeyNotFoundError` when its key id is not in the
        ring, :class:`WrongKeyError` when that key does not open it."""
        memo = (wrapped.key_id, wrapped.blob)
        with self._lock:
            hit = self._unwrapped.get(memo)
            if hit is not None:
                self._unwrapped.move_to_end(memo)
                return hit
        master = self._master(wrapped.key_id, where=where)
        nonce, body = wrapped.blob[:_NONCE_BYTES], wrapped.blob[_NONCE_BYTES:]
        try:
            plaintext = AESGCM(master).decrypt(nonce, body, _ad(wrapped.key_id))
        except InvalidTag:
            raise WrongKeyError(
                f"{where}: key {wrapped.key_id!r} does not unwrap the data key (the key "
                "file under that id is not the key that wrapped it)",
                key_id=wrapped.key_id,
            ) from None
        with self._lock:
            self._unwrapped[memo] = plaintext
            if len(self._unwrapped) > _UNWRAPPED_CACHE:
                self._unwrapped.popitem(last=False)
        return plaintext

    def mac(self, key_id: str, data: bytes, *, where: str) -> bytes:
        """HMAC-SHA256 of ``data`` under the MAC key derived from master key ``key_id`` (32 bytes);
        :class:`KeyNotFoundError` naming ``where`` when the id is not in the ring."""
        with self._lock:
            derived = self._mac_keys.get(key_id)
        if derived is None:
            master = self._master(key_id, where=where)
            derived = HKDF(algorithm=SHA256(), length=32, salt=None, info=_MAC_INFO).derive(master)
            with self._lock:
                self._mac_keys[key_id] = derived
        return hmac.new(derived, data, hashlib.sha256).digest()

    def check_mac(self, key_id: str, data: bytes, mac: bytes, *, where: str) -> None:
        """Raise :class:`TamperedObjectError` naming ``where`` and ``key_id`` unless ``mac`` is
        :meth:`mac` of ``data`` (compared in constant time)."""
        if not hmac.compare_digest(self.mac(key_id, data, where=where), mac):
            raise TamperedObjectError(
                f"{where}: its MAC under key {key_id!r} does not match: the manifest was changed, "
                "moved or written without the key",
                key_id=key_id,
            )

    def _master(self, key_id: str, *, where: str) -> bytes:
        key = self._keys.get(key_id)
        if key is None:
            known = ", ".join(sorted(self._keys)) or "none"
            raise KeyNotFoundError(
                f"{where}: key {key_id!r} is not in [remote.encryption] key_files (known: {known})",
                key_id=key_id,
            )
        return key
