"""Shared by the protection tests: a partition of compressible records with known secrets, key
files, configs, and independent checks that read the store through the backend contract only."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

from rlm.config import Settings, settings_from_mapping
from rlm.formats.compression import Compression
from rlm.formats.records import RecordSpec
from rlm.logdir.writer import LogWriter
from rlm.storage.api import StorageBackend
from rlm.testing.secrets import write_secret
from rlm.testing.toml import toml_value
from tests.lookup.helpers import BruteLog

TOPIC = "vault"
T0 = 1_700_000_000_000


def secret(i: int) -> bytes:
    return f"SECRET-{i:06d}".encode()


def account(i: int) -> bytes:
    return f"acct-{i:06d}".encode()


def write_secrets(
    log_dir: Path, *, batches: int = 160, partition: int = 0, first: int = 0, segment_bytes: int = 16_384
) -> BruteLog:
    """A partition of JSON-ish records (compressible text) each holding a unique secret value and
    account key; every 7th batch is gzip-compressed by the "producer" (stored as is when only
    compression is on). Returns its brute-force scan."""
    with LogWriter(
        log_dir, TOPIC, partition, segment_bytes=segment_bytes, index_interval_bytes=1024, clock=lambda: T0
    ) as w:
        n = first
        for b in range(batches):
            recs = []
            for _ in range(8):
                value = json.dumps(
                    {
                        "account": account(n).decode(),
                        "secret": secret(n).decode(),
                        "note": "transfer approved by the usual back office workflow " * 2,
                    }
                )
                recs.append(RecordSpec(T0 + n * 10, account(n), value.encode()))
                n += 1
            w.append(recs, compression=Compression.GZIP if b % 7 == 3 else Compression.NONE)
    return BruteLog.scan(log_dir / f"{TOPIC}-{partition}")


def key_file(directory: Path, key_id: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / key_id
    return write_secret(path, base64.b64encode(os.urandom(32)).decode() + "\n")


def protection_tables(
    *, codec: str | None = "zstd", keys: dict[str, Path] | None = None, active: str | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if codec is not None:
        out["compression"] = {"codec": codec}
    if keys:
        out["encryption"] = {"key_files": {k: str(v) for k, v in keys.items()}, "active_key": active or ""}
    return out


def settings(
    tmp: Path,
    log_dir: Path,
    *,
    backend: str = "local",
    options: dict[str, Any] | None = None,
    **protection: Any,
) -> Settings:
    remote = {
        "backend": backend,
        "options": options or {"root": str(tmp / "store")},
        **protection_tables(**protection),
    }
    return settings_from_mapping(
        {
            "log": {"dirs": [str(log_dir)], "eligibility": "rolled"},
            "remote": remote,
            "tiering": {"gc_grace_ms": 0, "state_dir": str(tmp / "state"), "index_entry_bytes": 3_000},
        }
    )


def write_toml(path: Path, s: Settings, *, server_port: int | None = None) -> Path:
    """``s`` as a config file for the CLI (the keys these tests set)."""
    r = s.remote
    lines = [
        "[log]",
        f"dirs = {toml_value([str(d) for d in s.log.dirs])}",
        'eligibility = "rolled"',
        "[remote]",
        f"backend = {toml_value(r.backend)}",
        "[remote.options]",
    ]
    lines += [f"{k} = {toml_value(v)}" for k, v in r.options.items()]
    if r.compression.enabled:
        lines += ["[remote.compression]", f"codec = {toml_value(r.compression.codec)}"]
    if r.encryption.key_files:
        lines += [
            "[remote.encryption]",
            f"active_key = {toml_value(r.encryption.active_key)}",
            "[remote.encryption.key_files]",
        ]
        lines += [f"{k} = {toml_value(str(v))}" for k, v in r.encryption.key_files.items()]
    lines += [
        "[tiering]",
        "gc_grace_ms = 0",
        f"state_dir = {toml_value(str(s.tiering.state_dir))}",
        f"index_entry_bytes = {s.tiering.index_entry_bytes}",
    ]
    if server_port is not None:
        lines += ["[server]", f"port = {server_port}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def stored_objects(backend: StorageBackend) -> dict[str, bytes]:
    """Every object of the store, by key (read through the backend contract only)."""
    return {info.key: backend.read(info.key) for info in backend.list("")}


def plaintext_found(objects: dict[str, bytes], brute: BruteLog) -> list[str]:
    """Objects holding any record's secret value or account key in the clear."""
    needles = [r.value[r.value.index(b"SECRET-") :][:13] for r in brute.records if r.value] + [
        r.key for r in brute.records if r.key
    ]
    return sorted(k for k, data in objects.items() if any(n in data for n in needles))
