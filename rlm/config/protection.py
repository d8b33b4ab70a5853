"""``[remote.compression]`` and ``[remote.encryption]``: how rlm protects what it stores (docs/protection.md).

Both are off by default, so existing configurations and stores are unchanged. They are sub-tables of
``[remote]`` beside ``[remote.options]`` (which stays the backend's, verbatim)::

    [remote.compression]
    codec = "zstd"          # "none" (default) | "zstd"
    level = 3               # zstd level, 1..19

    [remote.encryption]
    key_files = { k2026a = "/etc/rlm/keys/k2026a", k2026b = "/etc/rlm/keys/k2026b" }
    active_key = "k2026b"   # new segments' data keys are wrapped with this one

A key file holds the base64 text of exactly 32 random bytes (an AES-256 key), e.g.
``head -c 32 /dev/urandom | base64 > k2026a``. Every file is read at startup: a missing,
unreadable or malformed one is a :class:`ConfigError` naming the key id and the path.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rlm.errors import ConfigError

Codec = Literal["none", "zstd"]
CODECS: tuple[str, ...] = ("none", "zstd")
#: AES-256: a key file decodes to exactly this many bytes.
KEY_BYTES = 32
ZSTD_LEVELS = (1, 19)  # zstd's regular levels; 20-22 ("ultra") need big windows readers must allocate


@dataclass(frozen=True, slots=True)
class CompressionSettings:
    """``[remote.compression]``: per remote index entry, entries already compressed by the producer
    are stored as they are (docs/protection.md)."""

    codec: Codec = "none"
    level: int = 3

    @property
    def enabled(self) -> bool:
        return self.codec != "none"


@dataclass(frozen=True, slots=True)
class EncryptionSettings:
    """``[remote.encryption]``: key id → key file path, and the id new data keys are wrapped with."""

    key_files: Mapping[str, Path] = field(default_factory=dict)
    active_key: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.active_key)


def read_key_file(key_id: str, path: Path) -> bytes:
    """The 32 key bytes in ``path`` (base64 text, surrounding whitespace ignored); anything else →
    :class:`ConfigError` naming ``key_id`` and ``path`` (never the file's content)."""
    where = f"config key remote.encryption.key_files.{key_id} = {str(path)!r}"
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{where}: the key file does not exist") from None
    except OSError as err:
        raise ConfigError(f"{where}: the key file cannot be read: {err.strerror}") from None
    try:
        key = base64.b64decode(b"".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{where}: the key file is not base64 text") from None
    if len(key) != KEY_BYTES:
        raise ConfigError(
            f"{where}: the key file holds {len(key)} bytes, an AES-256 key is {KEY_BYTES} "
            "(make one with: head -c 32 /dev/urandom | base64)"
        )
    return key


def _table(key: str, value: Any, known: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"config key {key} = {value!r}: must be a table")
    extra = sorted(set(value) - set(known))
    if extra:
        raise ConfigError(f"unknown key {key}.{extra[0]}; known keys: {', '.join(known)}")
    return value


def compression(key: str, value: Any) -> CompressionSettings:
    """Validate ``[remote.compression]``."""
    table = _table(key, value, ("codec", "level"))
    codec = table.get("codec", "none")
    if codec not in CODECS:
        raise ConfigError(
            f"config key {key}.codec = {codec!r}: must be one of " + ", ".join(repr(c) for c in CODECS)
        )
    level = table.get("level", 3)
    lo, hi = ZSTD_LEVELS
    if not isinstance(level, int) or isinstance(level, bool) or not lo <= level <= hi:
        raise ConfigError(f"config key {key}.level = {level!r}: must be an integer in [{lo}, {hi}]")
    return CompressionSettings(codec, level)


def _key_id(key: str, key_id: Any) -> str:
    # The id is stored in manifests and bound into the wrapping: printable ASCII, no spaces.
    if not (
        isinstance(key_id, str)
        and 0 < len(key_id) <= 64
        and key_id.isascii()
        and all(c.isalnum() or c in "._-" for c in key_id)
    ):
        raise ConfigError(f"config key {key} = {key_id!r}: a key id is 1-64 characters of [A-Za-z0-9._-]")
    return key_id


def encryption(key: str, value: Any) -> EncryptionSettings:
    """Validate ``[remote.encryption]``: every key file is read (and checked) now."""
    table = _table(key, value, ("key_files", "active_key"))
    files = table.get("key_files", {})
    if not isinstance(files, dict):
        raise ConfigError(f'config key {key}.key_files = {files!r}: must be a table of <key id> = "<path>"')
    paths: dict[str, Path] = {}
    for key_id, text in files.items():
        _key_id(f"{key}.key_files", key_id)
        if not isinstance(text, str) or not text or "\x00" in text:
            raise ConfigError(f"config key {key}.key_files.{key_id} = {text!r}: must be a file path")
        paths[key_id] = Path(text).expanduser().absolute()
        read_key_file(key_id, paths[key_id])
    active = table.get("active_key", "")
    if not isinstance(active, str):
        raise ConfigError(f"config key {key}.active_key = {active!r}: must be a key id")
    if active and active not in paths:
        known = ", ".join(sorted(paths)) or "none"
        raise ConfigError(
            f"config key {key}.active_key = {active!r}: not in {key}.key_files (known key ids: {known})"
        )
    if paths and not active:
        raise ConfigError(
            f"config key {key}.active_key is empty: set it to one of the key ids of "
            f"{key}.key_files ({', '.join(sorted(paths))})"
        )
    return EncryptionSettings(paths, active)


#: The sub-keys, for the configuration reference (rlm/config/reference.py).
SUB_KEYS: dict[str, tuple[str, ...]] = {
    "compression": ("codec", "level"),
    "encryption": ("key_files", "active_key"),
}
VALIDATORS: dict[str, Callable[[str, Any], Any]] = {"compression": compression, "encryption": encryption}
