"""``[remote.compression]`` and ``[remote.encryption]``: how rlm protects what it stores (docs/protection.md).

The settings only: the mechanism is rlm/tiering/store/store_protection.py (``StoreProtection``), the
byte forms rlm/formats/sealed.py.

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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rlm.config import validators as v
from rlm.config.keys import key
from rlm.config.secret_files import check_secret_file
from rlm.errors import ConfigError

__all__ = [
    "KEY_BYTES",
    "ZSTD_LEVELS",
    "Codec",
    "CompressionSettings",
    "EncryptionSettings",
    "check_encryption",
    "read_key_file",
]

Codec = Literal["none", "zstd"]
#: AES-256: a key file decodes to exactly this many bytes.
KEY_BYTES = 32
ZSTD_LEVELS = (1, 19)  # zstd's regular levels; 20-22 ("ultra") need big windows readers must allocate
_WHERE = "remote.encryption"  # where the table sits, for the cross-key errors


def read_key_file(key_id: str, path: Path) -> bytes:
    """The 32 key bytes in ``path`` (base64 text, surrounding whitespace ignored); anything else →
    :class:`ConfigError` naming ``key_id`` and ``path`` (never the file's content)."""
    where = f"config key {_WHERE}.key_files.{key_id} = {str(path)!r}"
    check_secret_file(f"{_WHERE}.key_files.{key_id}", path)
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{where}: the key file does not exist") from None
    except OSError as err:
        raise ConfigError(f"{where}: the key file cannot be read: {err.strerror}") from None
    try:
        data = base64.b64decode(b"".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{where}: the key file is not base64 text") from None
    if len(data) != KEY_BYTES:
        raise ConfigError(
            f"{where}: the key file holds {len(data)} bytes, an AES-256 key is {KEY_BYTES} "
            "(make one with: head -c 32 /dev/urandom | base64)"
        )
    return data


def _key_id(where: str, key_id: Any) -> str:
    # The id is stored in manifests and bound into the wrapping: printable ASCII, no spaces.
    if not (
        isinstance(key_id, str)
        and 0 < len(key_id) <= 64
        and key_id.isascii()
        and all(c.isalnum() or c in "._-" for c in key_id)
    ):
        raise ConfigError(f"config key {where} = {key_id!r}: a key id is 1-64 characters of [A-Za-z0-9._-]")
    return key_id


@v.validator('table of `<key id> = "<path>"`')
def _key_files(where: str, files: Any) -> dict[str, Path]:
    """``<key id> = "<path>"``: every key file is read (and checked) now."""
    if not isinstance(files, dict):
        raise ConfigError(f'config key {where} = {files!r}: must be a table of <key id> = "<path>"')
    paths: dict[str, Path] = {}
    for key_id, text in files.items():
        _key_id(where, key_id)
        if not isinstance(text, str) or not text or "\x00" in text:
            raise ConfigError(f"config key {where}.{key_id} = {text!r}: must be a file path")
        paths[key_id] = Path(text).expanduser().absolute()
        read_key_file(key_id, paths[key_id])
    return paths


@v.validator("a key id of `key_files`, or empty")
def _active_key(where: str, active: Any) -> str:
    if not isinstance(active, str):
        raise ConfigError(f"config key {where} = {active!r}: must be a key id")
    return active


@dataclass(frozen=True, slots=True)
class CompressionSettings:
    """``[remote.compression]``: per remote index entry, entries already compressed by the producer
    are stored as they are (docs/protection.md)."""

    codec: Codec = key(
        "none",
        v.one_of(Codec),
        "`[remote.compression]`: compress each remote index entry (the unit of one ranged read) with "
        "zstd before it is stored; entries whose batches the producer already compressed are stored "
        "as they are (docs/protection.md).",
    )
    level: int = key(3, v.integer(*ZSTD_LEVELS), "zstd level of `[remote.compression]`.")

    @property
    def enabled(self) -> bool:
        return self.codec != "none"


@dataclass(frozen=True, slots=True)
class EncryptionSettings:
    """``[remote.encryption]``: key id → key file path, and the id new data keys are wrapped with."""

    key_files: Mapping[str, Path] = key(
        {},
        _key_files,
        "`[remote.encryption]`: key id → path of a file holding the base64 of 32 random bytes "
        "(`openssl rand -base64 32`); every key that wrapped a stored segment's data key must stay "
        "listed to read it (docs/protection.md).",
        env="inline",
    )
    active_key: str = key(
        "",
        _active_key,
        "The key id new segments' data keys are wrapped with; empty (with no `key_files`) = no encryption.",
    )

    @property
    def enabled(self) -> bool:
        return bool(self.active_key)


def check_encryption(e: EncryptionSettings) -> None:
    """The active key must be one of the key files, and key files need an active key."""
    if e.active_key and e.active_key not in e.key_files:
        known = ", ".join(sorted(e.key_files)) or "none"
        raise ConfigError(
            f"config key {_WHERE}.active_key = {e.active_key!r}: not in {_WHERE}.key_files "
            f"(known key ids: {known})"
        )
    if e.key_files and not e.active_key:
        raise ConfigError(
            f"config key {_WHERE}.active_key is empty: set it to one of the key ids of "
            f"{_WHERE}.key_files ({', '.join(sorted(e.key_files))})"
        )
