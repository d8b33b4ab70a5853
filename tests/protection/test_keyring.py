"""The key ring, the ``[remote.compression]`` / ``[remote.encryption]`` config and the manifest's
``protection`` field (docs/protection.md)."""

from __future__ import annotations

import base64
import os
import pickle
from pathlib import Path

import pytest

from rlm.config import settings_from_mapping
from rlm.errors import ConfigError, FormatError, KeyNotFoundError, WrongKeyError
from rlm.testing.secrets import write_secret
from rlm.tiering.store.keyring import KeyRing, WrappedKey
from rlm.tiering.store.manifest import Protection, SegmentManifest, StoredObject
from rlm.tiering.store.store_protection import StoreProtection


def key_file(tmp_path: Path, name: str, raw: bytes | None = None) -> Path:
    return write_secret(
        tmp_path / name, base64.b64encode(os.urandom(32) if raw is None else raw).decode() + "\n"
    )


def test_defaults_are_off() -> None:
    remote = settings_from_mapping({}).remote
    assert not remote.compression.enabled and not remote.encryption.enabled
    assert KeyRing.from_settings(remote.encryption) is None


def test_config_reads_every_key_file(tmp_path: Path) -> None:
    a, b = key_file(tmp_path, "a"), key_file(tmp_path, "b")
    s = settings_from_mapping(
        {
            "remote": {
                "compression": {"codec": "zstd", "level": 7},
                "encryption": {"key_files": {"ka": str(a), "kb": str(b)}, "active_key": "kb"},
            }
        }
    )
    assert s.remote.compression.codec == "zstd" and s.remote.compression.level == 7
    ring = KeyRing.from_settings(s.remote.encryption)
    assert ring is not None and ring.active_id == "kb" and ring.key_ids == ("ka", "kb")
    # neither the settings nor the ring print key material
    for text in (repr(s), repr(ring)):
        assert a.read_text().strip() not in text and b.read_text().strip() not in text


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist"),
        (b"not base64 at all!", "not base64"),
        (base64.b64encode(b"x" * 16), "holds 16 bytes"),
    ],
)
def test_a_bad_key_file_names_the_id_and_path(tmp_path: Path, content: bytes | None, message: str) -> None:
    path = tmp_path / "k1"
    if content is not None:
        write_secret(path, content)
    with pytest.raises(ConfigError) as err:
        settings_from_mapping(
            {"remote": {"encryption": {"key_files": {"k1": str(path)}, "active_key": "k1"}}}
        )
    assert "remote.encryption.key_files.k1" in str(err.value) and str(path) in str(err.value)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"compression": {"codec": "lz4"}}, "codec = 'lz4'"),
        ({"compression": {"level": 0}}, "level = 0"),
        ({"compression": {"levle": 3}}, "unknown key remote.compression.levle"),
        ({"encryption": {"active_key": "nope"}}, "active_key = 'nope': not in"),
    ],
)
def test_bad_protection_keys(table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        settings_from_mapping({"remote": table})


def test_active_key_is_required_with_key_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="active_key is empty"):
        settings_from_mapping({"remote": {"encryption": {"key_files": {"k": str(key_file(tmp_path, "k"))}}}})


def test_options_stay_verbatim_beside_the_new_tables(tmp_path: Path) -> None:
    s = settings_from_mapping(
        {
            "remote": {
                "backend": "local",
                "options": {"root": str(tmp_path), "x": 1},
                "compression": {"codec": "zstd"},
            }
        }
    )
    assert dict(s.remote.options) == {"root": str(tmp_path), "x": 1}


def test_wrap_unwrap_rotation_and_errors() -> None:
    ka, kb = os.urandom(32), os.urandom(32)
    ring = KeyRing({"a": ka}, "a")
    data_key, wrapped = ring.new_data_key()
    assert len(data_key) == 32 and wrapped.key_id == "a" and data_key not in wrapped.blob
    assert ring.unwrap(wrapped, where="x") == data_key
    # rotation: a ring with both keys, b active, still opens a's wrapping; rewrap moves it to b
    both = KeyRing({"a": ka, "b": kb}, "b")
    assert both.unwrap(wrapped, where="x") == data_key
    moved = both.wrap(data_key, "b")
    assert moved.key_id == "b" and KeyRing({"b": kb}).unwrap(moved, where="x") == data_key
    with pytest.raises(KeyNotFoundError, match="seg 7: key 'a' is not in") as missing:
        KeyRing({"b": kb}).unwrap(wrapped, where="seg 7")
    assert missing.value.key_id == "a"
    with pytest.raises(WrongKeyError, match="key 'a' does not unwrap"):
        KeyRing({"a": kb}).unwrap(wrapped, where="seg 7")
    # the key id is bound: the same blob relabelled under another id does not open
    with pytest.raises(WrongKeyError):
        KeyRing({"b": ka}).unwrap(WrappedKey("b", wrapped.blob), where="seg 7")


def test_wrapped_key_json_round_trip_and_damage() -> None:
    _, wrapped = KeyRing({"a": os.urandom(32)}, "a").new_data_key()
    assert WrappedKey.from_json(wrapped.to_json()) == wrapped
    with pytest.raises(FormatError, match="wrapped_key"):
        WrappedKey.from_json({"key_id": "a", "wrapped_key": "AAAA"})


def _manifest(protection: Protection | None) -> SegmentManifest:
    return SegmentManifest(
        topic="t",
        partition=0,
        base_offset=0,
        last_offset=9,
        first_timestamp=1,
        max_timestamp=2,
        size_bytes=100,
        record_batches=1,
        index_entries=1,
        attempt_id="a",
        created_ms=3,
        objects={"log": StoredObject("k", 50, 7)},
        protection=protection,
    )


def test_manifest_protection_field() -> None:
    _, wrapped = KeyRing({"a": os.urandom(32)}, "a").new_data_key()
    m = _manifest(Protection("zstd", 1234, wrapped))
    back = SegmentManifest.from_json(m.to_json())
    assert back == m and back.encrypted and back.content_crc32c == 1234
    assert b'"alg":"AES-256-GCM"' in m.to_json()
    plain = _manifest(None)
    assert b"protection" not in plain.to_json() and plain.content_crc32c == 7
    # two attempts of the same bytes stored differently are the same segment (the copier keeps the first)
    assert m.same_segment_as(_manifest(Protection("none", 1234, None)))
    assert not m.same_segment_as(plain)  # plaintext CRC 7 ≠ 1234
    with pytest.raises(FormatError, match="protection"):
        SegmentManifest.from_json(m.to_json().replace(b'"zstd"', b'"lz9"'))


def test_store_protection_pickles_as_its_settings_never_its_keys(tmp_path: Path) -> None:
    """Job executors receive a RemoteState carrying the StoreProtection: it travels as the
    settings (the executor reads the key files itself), never as key bytes, lock or cache."""
    path = tmp_path / "k1"
    raw = os.urandom(32)
    write_secret(path, base64.b64encode(raw).decode())
    encryption = {"key_files": {"k1": str(path)}, "active_key": "k1"}
    s = settings_from_mapping(
        {
            "log": {"dirs": [str(tmp_path / "logs")]},
            "remote": {
                "backend": "local",
                "options": {"root": str(tmp_path / "s")},
                "encryption": encryption,
            },
        }
    )
    protection = StoreProtection.from_settings(s.remote)
    data_key, wrapped = protection.ring.new_data_key() if protection.ring else (b"", None)
    blob = pickle.dumps(protection)
    assert raw not in blob and data_key not in blob
    copy = pickle.loads(blob)
    assert copy.ring is not None and wrapped is not None and copy.ring.unwrap(wrapped, where="t") == data_key
    with pytest.raises(TypeError, match="key material"):
        pickle.dumps(StoreProtection(ring=KeyRing({"k1": raw}, "k1")))
    assert pickle.loads(pickle.dumps(StoreProtection())).ring is None
